"""The library call behind dmae-certify: certify_dataset(config, on_row) -> RunResult."""

from __future__ import annotations

import json
import math

import pytest
import torch.distributed as dist

from dmae_fast.base.errors import UserError
from dmae_fast.cli.certify import main
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.distributed.ranks import join
from dmae_fast.results.format import read_results
from dmae_fast.run.driver import CertifyConfig, certify_dataset


def test_certify_dataset_writes_and_passes_on_every_row(tmp_path):
    out = tmp_path / "run.tsv"
    rows = []
    config = CertifyConfig.from_settings(dict(seed=0,
                                              engine=str(DEMO_CHECKPOINT), data="demo", out=str(out), n0=20, n=200,
                                              batch=128, max_images=3, device="cpu", progress=False))
    result = certify_dataset(config, on_row=rows.append)
    table = read_results(str(out))
    assert [row.idx for row in rows] == table.idx.tolist() == [0, 1, 2]
    assert [row.predict for row in rows] == table.predict.tolist() and all(row.n == 200 for row in rows)
    assert result.images == 3 and result.samples == 3 * 220 and result.samples_per_s > 0
    assert result.config.procedure.sigma == 0.25  # resolved from the checkpoint
    assert json.loads((tmp_path / "run.tsv.json").read_text())["status"] == "complete"


def test_certify_dataset_refuses_bad_input_before_writing(tmp_path):
    config = CertifyConfig.from_settings(dict(seed=0,
                                              engine=str(DEMO_CHECKPOINT), data="demo", out=str(tmp_path / "x.tsv"),
                                              sigma=-1.0))
    with pytest.raises(UserError, match="sigma"):
        certify_dataset(config)
    assert not (tmp_path / "x.tsv").exists()


def test_a_single_process_is_a_world_of_one(monkeypatch):
    """Outside torchrun a run's world is this process alone: rank 0 and the only rank, no process group,
    the images claimed in turn from a local counter, its own figures the job's."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    world = join("cpu")
    assert (world.rank, world.world, world.primary, world.device) == (0, 1, True, None)  # the configured device
    assert list(world.claims(3)) == [0, 1, 2]
    world.add_progress(1, 10)
    world.add_progress(1, 20)
    assert world.progress() == (2, 30)
    assert world.fail("bad input") and world.failed() is None  # no other rank to stop: this one says why
    world.finish({"images": 2})
    assert world.wait_for_all(lambda: None) == [{"images": 2}]
    assert not dist.is_initialized()


def test_a_config_is_validated_once_at_the_edge(tmp_path, monkeypatch):
    """dmae-certify checks its options before loading anything and the run does not check them again;
    a library caller's config is checked once by certify_dataset (open_run checks only the config with
    the sigma it resolved, a new one)."""
    checked: list[CertifyConfig] = []
    validate = CertifyConfig.validate
    monkeypatch.setattr(CertifyConfig, "validate", lambda config: (checked.append(config), validate(config))[1])
    small = ["--data", "demo", "--seed", "0", "--max", "1", "--n0", "10", "--n", "50", "--device", "cpu", "--quiet"]
    assert main([*small, "--out", str(tmp_path / "cli.tsv")]) == 0
    assert sum(config is checked[0] for config in checked) == 1
    checked.clear()
    config = CertifyConfig.from_settings(dict(seed=0,
                                              engine=str(DEMO_CHECKPOINT), data="demo", out=str(tmp_path / "api.tsv"),
                                              n0=10, n=50, max_images=1, device="cpu", progress=False))
    certify_dataset(config)
    assert sum(c is config for c in checked) == 1


RECORDED_SETTINGS = {  # the run record's "config" keys (docs/certify.md): flat, one per setting
    "engine", "device", "precision", "input_size", "normalize", "data", "split", "labels", "image_size", "skip",
    "max_images", "workers", "sigma", "n0", "n", "alpha", "seed", "predict", "sequential", "looks", "futility", "grow",
    "sequential_test", "radii", "out", "overwrite", "resume", "progress", "profile", "fast", "body_reason", "fused",
    "compile", "cuda_graphs", "noise", "cpu_runtime", "batch", "shard", "sound", "quantize", "reference",
    "paired_samples", "scratch_above", "disagreement_rate", "keep_votes"}


def test_a_config_is_made_of_parts_and_its_record_stays_flat():
    """The config's parts (classifier, data, procedure, body, output) write the record's flat settings,
    which read back into the same config; a setting it does not know is refused."""
    from dmae_fast.run.config import ClassifierOptions, DataOptions, OutputOptions, ProcedureOptions

    settings = dict(engine="m.safetensors", data="demo", out="r.tsv", sigma=0.5, n=500, skip=2, device="cpu",
                    sequential=True, looks=(100, 500), grow="off", fused=True, body_reason="--fast-parts fused",
                    sound=True, profile="prof", batch=64)
    config = CertifyConfig.from_settings(settings)
    assert config.classifier == ClassifierOptions("m.safetensors", device="cpu")
    assert config.data == DataOptions("demo", skip=2) and config.output == OutputOptions("r.tsv", profile="prof")
    assert config.procedure == ProcedureOptions(sigma=0.5, n=500, sequential=True, looks=(100, 500), grow=math.inf)
    assert (config.body.fused, config.sound.grid, config.batch) == (True, 16, 64)
    config.validate()
    recorded = config.recorded()
    assert set(recorded) == RECORDED_SETTINGS
    assert {key: recorded[key] for key in settings} == settings
    assert CertifyConfig.from_settings(json.loads(json.dumps(recorded, allow_nan=False), object_hook=_tuples)) == config
    with pytest.raises(UserError, match="unknown certification settings: colour"):
        CertifyConfig.from_settings({**settings, "colour": "red"})


def _tuples(record: dict) -> dict:
    return {key: tuple(value) if isinstance(value, list) else value for key, value in record.items()}
