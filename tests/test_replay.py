"""``dmae-serve replay`` is the receipt's proof: genuine answers replay as identical, any edited field is named.

The answers are genuine: made in-process by the service's own code (``Service.answer``, the demo
classifier on the CPU, no HTTP), then written to a file, edited field by field, and replayed
through the command's ``main``. Malformed answers give one line and exit 2, never a traceback.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import functools
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import procedure_of

from dmae_fast.cli import serve_replay
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.noise.sound_options import Sound
from dmae_fast.serve.config import Defaults, Limits, ServeConfig
from dmae_fast.serve.payloads import ParsedRequest, parse_request
from dmae_fast.serve.service import Service
from dmae_fast.stats.procedure import CERTIFY, PREDICT, ProcedureSpec
from dmae_fast.stats.rounded_gaussian import guarantee, sound_table

SEED, FIRST_INDEX = 4242, 500
DELETE = object()


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> dict:
    """Genuine answers by name, with the .npy files of their images."""
    service = Service(ServeConfig(engine_path=str(DEMO_CHECKPOINT), seed=SEED, first_index=FIRST_INDEX, device="cpu",
                                  batch=256, max_wait_ms=0))
    sigma = service.config.sigma
    # demo test digits 11 (90 of 100 votes for its class at sigma 0.25: counts that any other seed changes),
    # 0 (unanimous: stops at an early look) and 21 (60 / 40: PREDICT abstains)
    requests = {"certify": ((11,), ProcedureSpec(CERTIFY, 100, 0.001, sigma, 20)),
                "predict": ((11, 21), ProcedureSpec(PREDICT, 60, 0.01, sigma)),
                "sequential": ((0, 11), ProcedureSpec(CERTIFY, 1000, 0.001, sigma, 20, sequential=True)),
                "one-look": ((11,), ProcedureSpec(CERTIFY, 100, 0.001, sigma, 20, sequential=True))}
    digits, folder = demo_digits("test").images, tmp_path_factory.mktemp("replay")
    for i in (0, 11, 21):
        np.save(folder / f"digit{i}.npy", digits[i].numpy())
    service.start()
    try:
        return {name: (asyncio.run(service.answer(ParsedRequest(spec, [digits[i] for i in which]))),
                       [str(folder / f"digit{i}.npy") for i in which]) for name, (which, spec) in requests.items()}
    finally:
        service.stop()


@pytest.fixture(scope="module")
def sound_answers(tmp_path_factory) -> dict:
    """Genuine answers of --sound servers on the demo's 1/16 grid by name, with their image files: fixed-n,
    sequential, and --quantize's of a float64 image off the grid (rounded) and one on it."""
    digits, folder = demo_digits("test").images, tmp_path_factory.mktemp("sound")
    off = digits[11].numpy().astype(np.float64)
    off.flat[0] += 0.3 / 16 if off.flat[0] < 1 else -0.3 / 16  # rounds back onto its grid point
    files = {"on": folder / "digit11.npy", "off": folder / "off.npy"}
    np.save(files["on"], digits[11].numpy())
    np.save(files["off"], off)
    requests = {"sound": (False, ["on"], {"n0": 20, "n": 100}),
                "sound-sequential": (False, ["on"], {"n0": 20, "n": 1000, "sequential": True}),
                "quantized": (True, ["off", "on"], {"n0": 20, "n": 100})}
    out = {}
    for quantize in (False, True):
        config = ServeConfig(engine_path=str(DEMO_CHECKPOINT), seed=SEED, first_index=FIRST_INDEX, device="cpu",
                             batch=256, max_wait_ms=0)
        service = Service(dataclasses.replace(config, sound=Sound(16, quantize)))
        service.start()
        try:
            for name, (rounding, which, fields) in requests.items():
                if rounding != quantize:
                    continue
                images = [base64.b64encode(files[w].read_bytes()).decode() for w in which]
                body = json.dumps({"images": images, **fields}).encode()
                parsed = parse_request(CERTIFY, "application/json", body, [], service.shape, Limits(), Defaults(),
                                       service.config.sigma, service.config.sound)
                out[name] = (json.loads(json.dumps(asyncio.run(service.answer(parsed)))),
                             [str(files[w]) for w in which])
        finally:
            service.stop()
    return out


def replay(tmp_path: Path, capsys, answer: dict, images: list[str]) -> tuple[int, str, str]:
    """``dmae-serve replay`` on ``answer``: exit status, stdout, stderr."""
    path = tmp_path / "answer.json"
    path.write_text(json.dumps(answer))
    status = serve_replay.main([str(path), *images, "--ckpt", "demo", "--device", "cpu", "--batch", "64"])
    out, err = capsys.readouterr()
    return status, out, err


def edited(answer: dict, *where_and_value) -> dict:
    """A copy of ``answer`` with the field at ``where`` (keys and list positions) set to ``value``
    (or deleted when ``value`` is ``DELETE``)."""
    *where, value = where_and_value
    copied = copy.deepcopy(answer)
    parent = copied
    for key in where[:-1]:
        parent = parent[key]
    if value is DELETE:
        del parent[where[-1]]
    else:
        parent[where[-1]] = value
    return copied


# --------------------------------------------------------------------------- genuine answers


@pytest.mark.parametrize("name", ["certify", "predict", "sequential", "one-look"])
def test_genuine_answers_replay_as_identical(answers, name, tmp_path, capsys):
    answer, images = answers[name]
    status, out, err = replay(tmp_path, capsys, answer, images)
    assert status == 0, out + err
    assert out.count("identical counts (same input); every field it states is as recomputed") == len(images)
    if name == "sequential":  # several looks; the clean digit draws on to the cap while its radius grows (grow)
        assert len(answer["receipt"]["looks"]) > 1 and answer["results"][0]["n"] == 1000
    if name == "one-look":  # a sequential plan of one look records no looks: the receipt says it is sequential
        assert answer["receipt"]["looks"] == [] and answer["receipt"]["sequential"] is True
        assert answer["procedure"].startswith("group-sequential-exact-K1-")


@pytest.mark.parametrize("name", ["sound", "sound-sequential", "quantized"])
def test_genuine_sound_answers_replay_as_identical(sound_answers, name, tmp_path, capsys):
    answer, images = sound_answers[name]
    status, out, err = replay(tmp_path, capsys, answer, images)
    assert status == 0, out + err
    assert out.count("identical counts (same input); every field it states is as recomputed") == len(images)


@pytest.mark.parametrize("name", ["sound", "sound-sequential", "quantized"])
def test_a_sound_answer_states_the_failure_probability_of_its_plan(sound_answers, name):
    """alpha plus the noise table's total variation over the plan's total samples: a sequential answer's
    cap n0 + n, the most an image could draw, wherever it stopped."""
    answer, images = sound_answers[name]
    receipt = answer["receipt"]
    total = procedure_of(receipt).plan.total
    assert total == receipt["n0"] + receipt["n"]
    stated = guarantee(sound_table(receipt["sigma"], 16), total, np.load(images[0]).size, receipt["alpha"])
    for where in (receipt, *answer["results"]):
        assert where["tv_per_image"] == stated["tv_per_image"] > 0
        assert where["failure_probability"] == stated["failure_probability"] > receipt["alpha"]
    if name == "sound-sequential":
        assert sum(answer["results"][0]["counts"]["estimation"]) in (*receipt["looks"], receipt["n"])  # any look
    if name == "quantized":  # says which image was rounded, and that the certificate and hash are the rounded one's
        assert [result["rounded"] for result in answer["results"]] == [True, False]
        assert receipt["sound_quantize"] is True and "input_sha256 are for the rounded image" in \
            receipt["certified_image"]
    else:
        assert receipt["sound_quantize"] is False and "certified_image" not in receipt
        assert all("rounded" not in result for result in answer["results"])


def test_a_one_look_sequential_receipt_without_the_sequential_field_still_replays(answers, tmp_path, capsys):
    answer, images = answers["one-look"]
    status, out, err = replay(tmp_path, capsys, edited(answer, "receipt", "sequential", DELETE), images)
    assert status == 0, out + err


# --------------------------------------------------------------------------- edited fields


def _plus_one(old: int) -> int:
    return old + 1


# (answer, field, its new value or a function of the old one, what the replay must say: {old} and {new} the
# field's values, {index} the image index of the result edited); each field is edited alone
EDITS = [
    ("certify", ("results", 0, "radius"), 0.75, "index {index}: radius served 0.75, recomputed {old}"),
    ("certify", ("results", 0, "prediction"), lambda old: (old + 1) % 10, "prediction served {new}, recomputed {old}"),
    ("certify", ("results", 0, "p_a_lower"), 0.99, "p_a_lower served 0.99, recomputed {old}"),
    ("certify", ("results", 0, "n_a"), lambda old: old - 1, "n_a served {new}, recomputed {old}"),
    ("certify", ("results", 0, "n"), 99, "n served 99, recomputed 100"),
    ("certify", ("results", 0, "input_sha256"), "0" * 64, "input differs from the one served"),
    ("certify", ("results", 0, "level"), 0.001, "states 'level', which a cohen-fixed-n answer does not have"),
    ("certify", ("results", 0, "counts", "selection", 0), _plus_one,
     "counts served hold 21 selection and 100 estimation samples, where the receipt's plan"),
    ("sequential", ("results", 0, "level"), 0.01, "level served 0.01, recomputed 0.001"),
    ("sequential", ("results", 0, "radius"), 0.75, "radius served 0.75, recomputed {old}"),
    ("sequential", ("results", 0, "grid_radius"), 0.75, "grid_radius served 0.75, recomputed {old}"),
    ("certify", ("results", 0, "grid_radius"), 0.5, "states 'grid_radius', which a cohen-fixed-n answer does not have"),
    ("predict", ("results", 1, "pvalue"), 0.5, "index {index}: pvalue served 0.5, recomputed {old}"),
    ("predict", ("results", 1, "count2"), _plus_one, "count2 served {new}, recomputed {old}"),
    ("certify", ("procedure",), "predict", 'procedure served "predict", recomputed "cohen-fixed-n"'),
    ("certify", ("receipt", "model_sha256"), "0" * 64, "receipt model_sha256 served \"" + "0" * 64),
    ("certify", ("receipt", "alpha"), 0.2, "p_a_lower served"),
    ("sequential", ("receipt", "alpha"), 0.2, "receipt procedure served group-sequential-exact-K10-"),
    ("certify", ("receipt", "sigma"), 0.5, "radius served"),
    ("certify", ("receipt", "seed"), _plus_one, "DIFFERENT counts: estimation class"),
    ("certify", ("receipt", "n"), 200, "give 20 selection and 200 estimation samples"),
    ("certify", ("receipt", "n0"), 30, "give 30 selection and 100 estimation samples"),
    ("certify", ("receipt", "sequential"), True,
     "receipt procedure served cohen-fixed-n, but its settings (sequential CERTIFY with n0 20"),
    ("predict", ("receipt", "n0"), 20,
     "receipt n0 served 20, but its settings (PREDICT with n 60, alpha 0.01) give null"),
    ("certify", ("receipt", "indices"), [FIRST_INDEX + 7], f"receipt indices served [{FIRST_INDEX + 7}]"),
    ("certify", ("receipt", "failure_probability"), 0.001,
     "the receipt states 'failure_probability', which a cohen-fixed-n receipt does not have"),
    ("sound", ("receipt", "failure_probability"), 0.001, "receipt failure_probability served 0.001, recomputed {old}"),
    ("sound", ("receipt", "failure_probability"), DELETE, "receipt failure_probability missing, recomputed {old}"),
    ("sound", ("receipt", "tv_per_image"), 0.0, "receipt tv_per_image served 0.0, recomputed {old}"),
    ("sound", ("results", 0, "failure_probability"), 0.001,
     "index {index}: failure_probability served 0.001, recomputed {old}"),
    ("sound", ("results", 0, "tv_per_image"), DELETE, "index {index}: tv_per_image missing, recomputed {old}"),
    ("sound", ("receipt", "sound_quantize"), True, "receipt certified_image missing, recomputed"),
    ("sound-sequential", ("receipt", "tv_per_image"), lambda old: old / 2,
     "receipt tv_per_image served {new}, recomputed {old}"),
    ("sound-sequential", ("results", 0, "failure_probability"), lambda old: old / 2,
     "failure_probability served {new}, recomputed {old}"),
    ("quantized", ("results", 0, "rounded"), False, "index {index}: rounded served false, recomputed true"),
    ("quantized", ("receipt", "certified_image"), "as sent", 'receipt certified_image served "as sent"'),
]


@pytest.mark.parametrize("name, where, value, message", EDITS,
                         ids=[f"{e[0]}-{'.'.join(map(str, e[1]))}" for e in EDITS])
def test_an_edited_field_is_named_and_exits_1(answers, sound_answers, name, where, value, message, tmp_path, capsys):
    answer, images = {**answers, **sound_answers}[name]
    parent = functools.reduce(lambda document, key: document[key], where[:-1], answer)
    old = parent.get(where[-1]) if isinstance(parent, dict) else parent[where[-1]]  # None: a field it lacks
    new = value(old) if callable(value) else value
    status, out, err = replay(tmp_path, capsys, edited(answer, *where, new), images)
    index = answer["results"][where[1]]["index"] if where[0] == "results" else None
    assert status == 1 and message.format(old=old, new=new, index=index) in out, (where, new, out, err)
    assert "Traceback" not in out + err and "SamplingPlan" not in out + err


def test_alpha_0_2_is_named_in_the_settings_it_was_recomputed_under(answers, tmp_path, capsys):
    answer, images = answers["certify"]
    status, out, _ = replay(tmp_path, capsys, edited(answer, "receipt", "alpha", 0.2), images)
    assert status == 1 and "receipt: CERTIFY with n0 20, n 100, alpha 0.2, sigma 0.25" in out


# --------------------------------------------------------------------------- malformed answers


MALFORMED = [
    (("results", 0, "counts", DELETE), "results[0] has no 'counts'"),
    (("results", 0, "counts", "[[0, 20]]"), "results[0].counts must be an object of class counts for each phase"),
    (("results", 0, "counts", "selection", "20"), "results[0].counts.selection must be a list"),
    (("results", 0, "counts", "selection", 3, -1), "results[0].counts.selection's counts must be a whole number"),
    (("results", 0, "counts", "selection", 3, 10**30), "must be a whole number in [0, 2**32)"),
    (("results", 0, "counts", "selection", 3, 1.5), "must be a whole number"),
    (("results", 0, "counts", "bogus", [1]), "has 'bogus', which is not a phase of the receipt's plan"),
    (("results", 0, "index", DELETE), "results[0] has no 'index'"),
    (("results", 0, "index", 2**40), "results[0].index must be a whole number in [0, 2**32)"),
    (("results", 0, "index", "500"), "results[0].index must be a whole number"),
    (("results", 0, "oops"), "results[0] must be an object"),
    (("results", []), "'results', a non-empty list"),
    (("receipt", "phases", ["SELECTION", "BOGUS"]),
     'phases must be phases of the noise contract (SELECTION, ESTIMATION, PREDICTION), got "BOGUS"'),
    (("receipt", "phases", "SELECTION"), "the receipt's phases must be a list"),
    (("receipt", "sizes", [20]), "records 2 phases and 1 sizes"),
    (("receipt", "seed", DELETE), "the receipt has no 'seed'"),
    (("receipt", "seed", -1), "the receipt's seed must be a whole number in [0, 2**64), got -1"),
    (("receipt", "seed", 2**64), "the receipt's seed must be a whole number in [0, 2**64)"),
    (("receipt", "n", "100"), "the receipt's n must be a whole number in [1, 2**32), got \"100\""),
    (("receipt", "n", -5), "the receipt's n must be a whole number"),
    (("receipt", "n", 10**30), "the receipt's n must be a whole number"),
    (("receipt", "n0", None), "the receipt's n0 must be a whole number"),
    (("receipt", "looks", [0]), "the receipt's looks must be a whole number in [1, 2**32)"),
    (("receipt", "alpha", math.nan), "the receipt's alpha must be a number in (0, 1), got NaN"),
    (("receipt", "alpha", 1.5), "the receipt's alpha must be a number in (0, 1), got 1.5"),
    (("receipt", "alpha", 0), "the receipt's alpha must be a number in (0, 1), got 0"),
    (("receipt", "alpha", "0.001"), "the receipt's alpha must be a number in (0, 1)"),
    (("receipt", "sigma", -1), "the receipt's sigma must be a finite number"),
    (("receipt", "procedure", "magic"), "the receipt's procedure must be one dmae-serve runs"),
    (("receipt", "sequential", "yes"), "the receipt's sequential must be true or false"),
    (("receipt", "model_sha256", 7), "the receipt's model_sha256 must be 64 hex digits or null"),
    (("receipt", "indices", DELETE), "the receipt has no 'indices'"),
    (("receipt", DELETE), "it needs a 'receipt' object"),
]


@pytest.mark.parametrize("edit, message", MALFORMED)
def test_a_malformed_answer_is_one_line_and_exit_2(answers, edit, message, tmp_path, capsys):
    answer, images = answers["certify"]
    status, out, err = replay(tmp_path, capsys, edited(answer, *edit), images)
    assert status == 2 and out == "" and err.count("\n") == 1, (edit, out, err)
    assert err.startswith("dmae-serve replay: error: ") and message in err, (edit, err)


@pytest.mark.parametrize("text, message", [("[1, 2]", "it must be a JSON object"), ("{", "is not JSON"),
                                           ("[" * 100_000, "nested too deeply")])
def test_a_file_that_is_not_an_answer_is_one_line_and_exit_2(text, message, tmp_path, capsys):
    path = tmp_path / "answer.json"
    path.write_text(text)
    assert serve_replay.main([str(path), str(path), "--ckpt", "demo"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err, err


def test_batch_0_is_one_line_and_exit_2(answers, tmp_path, capsys):
    answer, images = answers["certify"]
    path = tmp_path / "answer.json"
    path.write_text(json.dumps(answer))
    assert serve_replay.main([str(path), *images, "--ckpt", "demo", "--batch", "0"]) == 2
    assert capsys.readouterr().err == "dmae-serve replay: error: --batch must be in [1, 1,048,576], got 0\n"


@pytest.mark.parametrize("what", ["answer", "image"])
def test_a_device_or_a_fifo_is_refused_unread(answers, what, tmp_path, capsys):
    """Only regular files are read: /dev/zero would be read without end, a FIFO would wait forever."""
    answer, images = answers["certify"]
    path = tmp_path / "answer.json"
    path.write_text(json.dumps(answer))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for special in ("/dev/zero", str(fifo)):
        argv = [special, *images] if what == "answer" else [str(path), special]
        assert serve_replay.main([*argv, "--ckpt", "demo", "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert err == f"dmae-serve replay: error: {special} is not a regular file (a device, pipe or socket?); a " \
                      f"{'dmae-serve answer' if what == 'answer' else 'image file'} must be one\n", err
