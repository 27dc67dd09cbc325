"""A new procedure is one file: a toy procedure defined and registered here alone runs through
``certify_dataset``, the server (``Service.answer``, in-process) and ``replay_answer``, and no module of
the package names it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from dmae_fast.base.errors import UserError
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.results.format import read_results
from dmae_fast.run.config import ProcedureOptions
from dmae_fast.run.driver import CertifyConfig, certify_dataset
from dmae_fast.serve.config import Defaults, Limits, ServeConfig
from dmae_fast.serve.payloads import ParsedRequest, PayloadError, parse_request
from dmae_fast.serve.receipt import replay_answer
from dmae_fast.serve.service import Service
from dmae_fast.stats import procedure_base
from dmae_fast.stats.decisions import Certificate, certify_from_counts
from dmae_fast.stats.plan import SamplingPlan
from dmae_fast.stats.procedure import CERTIFY, Procedure, ProcedureSpec, register
from dmae_fast.stats.rules import RowRules

TOY = "toy-quarter-split"


@register
class QuarterSplit(Procedure):
    """CERTIFY from ``n`` samples: the first quarter guesses the class, the other three bound its probability."""

    key = TOY
    kind = CERTIFY
    names = (TOY,)
    title = "quarter-split CERTIFY"

    def __init__(self, spec: ProcedureSpec) -> None:
        super().__init__(spec)
        self.name, self.level = TOY, spec.alpha
        self.plan = SamplingPlan.certify(spec.n // 4, spec.n - spec.n // 4)

    def result(self, counts: np.ndarray) -> Certificate:
        return certify_from_counts(counts[0], counts[1], self.spec.alpha, self.spec.sigma)

    def rules(self) -> RowRules:
        return RowRules(CERTIFY, self.spec.n // 4, (self.spec.n - self.spec.n // 4,), self.level, self.spec.sigma, TOY)


def test_certify_dataset_runs_a_config_naming_the_toy_and_resumes_it(tmp_path):
    config = CertifyConfig.from_settings(dict(seed=0,
                                              engine=str(DEMO_CHECKPOINT), data="demo", out=str(tmp_path / "toy.tsv"),
                                              n=200, batch=128, max_images=3, device="cpu", progress=False,
                                              procedure_name=TOY))
    result = certify_dataset(config)
    table = read_results(config.output.out)
    assert result.images == 3 and result.samples == 3 * 200
    assert set(table.extra["procedure"]) == {TOY} and set(table.extra["n0"]) == {50} and set(table.extra["n"]) == {150}
    record = json.loads(Path(config.output.out + ".json").read_text())
    assert record["procedure"] == TOY and record["config"]["procedure_name"] == TOY
    assert record["plan"]["sizes"] == [50, 150]
    # a --resume checks every kept row under the toy's own rules: none is left to do
    resumed = dataclasses.replace(config, output=dataclasses.replace(config.output, resume=True))
    assert certify_dataset(resumed).images == 0


def test_a_config_naming_an_unregistered_procedure_is_refused(tmp_path):
    config = CertifyConfig.from_settings(dict(seed=0,
                                              engine=str(DEMO_CHECKPOINT), data="demo", out=str(tmp_path / "x.tsv"),
                                              procedure_name="no-such-procedure"))
    with pytest.raises(UserError, match="no procedure named no-such-procedure is registered"):
        config.validate()
    with pytest.raises(UserError, match=f"procedure_name {TOY} is a CERTIFY procedure"):
        dataclasses.replace(config, procedure=ProcedureOptions(procedure_name=TOY, predict=True)).validate()


def test_the_server_answers_the_toy_and_its_answer_replays_as_identical():
    service = Service(ServeConfig(engine_path=str(DEMO_CHECKPOINT), seed=7, first_index=40, device="cpu", batch=256,
                                  max_wait_ms=0))
    images = [demo_digits("test").images[i] for i in (0, 11)]
    spec = ProcedureSpec(CERTIFY, 200, 0.001, service.config.sigma, 20, name=TOY)
    service.start()
    try:
        answer = json.loads(json.dumps(asyncio.run(service.answer(ParsedRequest(spec, images)))))
    finally:
        service.stop()
    assert answer["procedure"] == answer["receipt"]["procedure"] == TOY
    assert answer["receipt"]["sizes"] == [50, 150] and all(r["n0"] == 50 for r in answer["results"])
    assert replay_answer(answer, images, service.engine, batch=64).identical
    answer["results"][0]["radius"] += 0.25
    assert not replay_answer(answer, images, service.engine, batch=64).identical


def test_a_request_field_asks_for_a_registered_procedure(monkeypatch):
    class Flagged(QuarterSplit):
        key, flag = "toy-flagged", "quarter"

    monkeypatch.setitem(procedure_base.PROCEDURES, Flagged.key, Flagged)
    image = {"array": np.zeros((3, 8, 8)).tolist()}

    def parsed(**fields: object) -> ProcedureSpec:
        body = json.dumps({"image": image, **fields}).encode()
        return parse_request(CERTIFY, "application/json", body, [], (3, 8, 8), Limits(), Defaults(), 0.25).spec

    assert parsed(quarter=True).key == "toy-flagged" and parsed(sequential=True).key == "sequential"
    assert parsed().key == parsed(quarter=False).key == CERTIFY
    with pytest.raises(PayloadError, match="sequential and quarter each ask for another procedure"):
        parsed(quarter=True, sequential=True)


def test_no_module_of_the_package_names_the_toy():
    package = Path(__file__).resolve().parents[1] / "dmae_fast"
    assert not [path for path in package.rglob("*.py") if TOY in path.read_text()]
