"""The library call behind dmae-certify: certify_dataset(config, on_row) -> RunResult."""

from __future__ import annotations

import json

import pytest

from dmae_fast.certification.run import CertifyConfig, certify_dataset
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.errors import UserError
from dmae_fast.results import read_results


def test_certify_dataset_writes_and_passes_on_every_row(tmp_path):
    out = tmp_path / "run.tsv"
    rows = []
    config = CertifyConfig(engine=str(DEMO_CHECKPOINT), data="demo", out=str(out), sigma=None, n0=20, n=200,
                           batch=128, max_images=3, device="cpu", progress=False)
    result = certify_dataset(config, on_row=rows.append)
    table = read_results(str(out))
    assert [row.idx for row in rows] == table.idx.tolist() == [0, 1, 2]
    assert [row.predict for row in rows] == table.predict.tolist() and all(row.n == 200 for row in rows)
    assert result.images == 3 and result.samples == 3 * 220 and result.samples_per_s > 0
    assert result.config.sigma == 0.25  # resolved from the checkpoint
    assert json.loads((tmp_path / "run.tsv.json").read_text())["status"] == "complete"


def test_certify_dataset_refuses_bad_input_before_writing(tmp_path):
    config = CertifyConfig(engine=str(DEMO_CHECKPOINT), data="demo", out=str(tmp_path / "x.tsv"), sigma=-1.0)
    with pytest.raises(UserError, match="sigma"):
        certify_dataset(config)
    assert not (tmp_path / "x.tsv").exists()
