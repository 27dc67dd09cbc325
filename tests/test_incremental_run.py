"""``dmae-certify --reference REF.tsv`` (issue 59): a derived classifier certified from a reference run and paired
samples; its rows recomputed from the reference's; bad references refused in one line with nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import one_line_error, run_command

from dmae_fast.cli.certify import main as certify_main
from dmae_fast.demo_files import DEMO_CHECKPOINT
from dmae_fast.results.format import read_results
from dmae_fast.stats.decisions import ABSTAIN, Certificate, bound_certificate
from dmae_fast.stats.incremental import derived_lower_bounds, disagreement_upper_bounds
from dmae_fast.stats.incremental_procedure import IncrementalCertify, ladder
from dmae_fast.stats.plan import PAIRED, SamplingPlan
from dmae_fast.stats.procedure import CERTIFY, ProcedureSpec

pytestmark = pytest.mark.usefixtures("two_torch_threads")
COMMON = ("--data", "demo", "--max", 6, "--device", "cpu", "--quiet", "--sigma", 0.65)  # the reference abstains on one


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """A completed fixed-n run of the demo classifier (fp32) on six digits, its checkpoint a copy of its own."""
    folder = tmp_path_factory.mktemp("reference")
    checkpoint = folder / "model.safetensors"
    shutil.copy(DEMO_CHECKPOINT, checkpoint)
    assert certify_main(["--ckpt", str(checkpoint), *map(str, COMMON), "--n0", "20", "--n", "1000", "--seed", "3",
                         "--out", str(folder / "ref.tsv")]) == 0
    return folder / "ref.tsv"


def _incremental(capsys, reference: Path, out: Path, *more: object):
    checkpoint = reference.parent / "model.safetensors"
    return run_command(certify_main, capsys, "--ckpt", checkpoint, *COMMON, "--reference", reference,
                       "--out", out, *more)


def test_rows_are_the_references_class_at_its_bound_less_the_disagreement_bound(capsys, reference, tmp_path):
    out = tmp_path / "bf16.tsv"
    run = _incremental(capsys, reference, out, "--precision", "bf16", "--paired-samples", 300, "--alpha", 0.01,
                       "--scratch-above", 1)
    assert run.rc == 0, run.err
    rows, ref = read_results(out), read_results(reference)
    assert list(rows.idx) == list(ref.idx) and set(rows.extra["procedure"]) == {"incremental"}
    d, n, paired = rows.extra["disagreements"], rows.extra["n"], ref.predict >= 0
    assert 0 < paired.sum() < len(paired)  # an image the reference abstained on draws nothing
    assert (n[paired] == 300).all() and (n[~paired] == 0).all() and (rows.predict[~paired] == ABSTAIN).all()
    assert (rows.extra["nA"] == n - d).all() and (rows.extra["n0"] == 0).all()
    zeta = disagreement_upper_bounds(d, n, 0.01)
    assert np.all(rows.extra["zeta_upper"] >= zeta)  # written rounded up
    bound = derived_lower_bounds(ref.extra["pA_lower"], zeta)
    assert np.allclose(rows.extra["pA_lower"], bound, atol=1e-10) and np.all(rows.extra["pA_lower"] <= bound)
    certified = bound >= 0.5
    assert np.array_equal(rows.predict, np.where(certified, ref.predict, ABSTAIN))
    assert np.all(rows.radius <= ref.radius) and np.all(rows.radius[~certified] == 0)
    assert np.allclose(rows.extra["alpha"], 0.001 + 0.01)
    assert json.loads(Path(str(out) + ".json").read_text())["samples"] == 300 * paired.sum()
    record = json.loads(Path(str(out) + ".json").read_text())
    assert record["procedure"] == "incremental" and record["reference"]["results_sha256"] == json.loads(
        Path(str(reference) + ".json").read_text())["results_sha256"]
    assert record["config"]["paired_samples"] == 300 and record["config"]["reference"] == str(reference)
    assert record["config"]["scratch_above"] == 1
    # analyze reads the rows (at any alpha: its record alone does not hold the reference's certificates)
    analyzed = run_command(certify_main, capsys, "analyze", out)
    assert analyzed.rc == 0 and "ACR" in analyzed.out


def test_confident_images_are_certified_from_scratch_by_the_derived_classifier_alone(capsys, reference, tmp_path):
    ref = read_results(reference)
    threshold = float(np.median(ref.extra["pA_lower"][ref.predict >= 0]))  # the certified images, half each way
    out = tmp_path / "rule.tsv"
    run = _incremental(capsys, reference, out, "--precision", "bf16", "--paired-samples", 100, "--scratch-above",
                       threshold, "--seed", 4)
    assert run.rc == 0, run.err
    rows = read_results(out)
    scratch, paired = ref.extra["pA_lower"] > threshold, (ref.extra["pA_lower"] <= threshold) & (ref.predict >= 0)
    assert 0 < scratch.sum() < len(scratch)
    # from scratch: the reference's n0 and n, Clopper-Pearson at its alpha, nothing subtracted
    assert (rows.extra["n0"][scratch] == 20).all() and (rows.extra["n"][scratch] == 1000).all()
    for row in np.flatnonzero(scratch):
        expected = bound_certificate(0, 0, int(rows.extra["nA"][row]), 1000, 0.001, 0.65)
        assert abs(rows.extra["pA_lower"][row] - expected.p_a_lower) < 1e-10
    assert (rows.extra["zeta_upper"][scratch] == 0).all() and (rows.extra["alpha"][scratch] == 0.001).all()
    assert (rows.extra["n0"][~scratch] == 0).all() and (rows.extra["n"][paired] == 100).all()
    # the derived classifier's scratch counts are those of a from-scratch run of it with the same seed
    alone = tmp_path / "alone.tsv"
    assert run_command(certify_main, capsys, "--ckpt", reference.parent / "model.safetensors", *COMMON, "--n0", 20,
                       "--n", 1000, "--seed", 4, "--precision", "bf16", "--body", "plain", "--out", alone).rc == 0
    scratch_alone = read_results(alone)
    assert np.array_equal(rows.extra["nA"][scratch], scratch_alone.extra["nA"][scratch])


def test_a_resumed_run_recounts_against_the_same_reference_and_refuses_another(capsys, reference, tmp_path):
    out = tmp_path / "bf16.tsv"
    assert _incremental(capsys, reference, out, "--precision", "bf16", "--paired-samples", 50, "--seed", 9).rc == 0
    whole = out.read_text()
    lines = whole.splitlines(keepends=True)
    out.write_text("".join(lines[:6]))  # five rows kept, the reference's abstention among them (n 0)
    assert "\t0\t0\t0.0000000000\t" in lines[5]
    assert _incremental(capsys, reference, out, "--precision", "bf16", "--paired-samples", 50, "--resume").rc == 0
    assert [line.split("\t")[:5] for line in out.read_text().splitlines()] == [
        line.split("\t")[:5] for line in whole.splitlines()]
    record_file = Path(str(out) + ".json")
    record = json.loads(record_file.read_text())
    record["reference"]["results_sha256"] = "0" * 64  # the rows were made against another reference run
    record_file.write_text(json.dumps(record))
    refused = _incremental(capsys, reference, out, "--precision", "bf16", "--paired-samples", 50, "--resume")
    one_line_error(refused, "dmae-certify", "--resume", "not the reference run")


@pytest.mark.parametrize("case", ["edited", "no-record", "running", "incremental", "sigma", "images", "itself",
                                  "fast", "paired-alone", "classifier-changed", "sound"])
def test_bad_references_are_refused_in_one_line_with_nothing_written(capsys, reference, tmp_path, case):
    ref, more = tmp_path / "ref.tsv", ["--precision", "bf16"]
    shutil.copy(reference, ref)
    shutil.copy(str(reference) + ".json", str(ref) + ".json")
    shutil.copy(reference.parent / "model.safetensors", tmp_path / "model.safetensors")
    record = json.loads(Path(str(ref) + ".json").read_text())
    record["config"]["engine"] = str(tmp_path / "model.safetensors")
    mentions = {"edited": "was edited after its run", "no-record": "run record", "running": "completed run",
                "incremental": "fixed-n CERTIFY", "sigma": "--sigma 0.5", "images": "no row for image idx 6",
                "itself": "itself", "fast": "plain body", "paired-alone": "apply to --reference",
                "classifier-changed": "changed since the reference run", "sound": "must draw the same noise"}[case]
    if case == "edited":
        ref.write_text(ref.read_text().replace("\t1\t", "\t0\t", 1))
    elif case == "no-record":
        Path(str(ref) + ".json").unlink()
    elif case == "running":
        record["status"] = "running"
    elif case == "incremental":
        record["procedure"] = "incremental"
    elif case == "sigma":
        more += ["--sigma", 0.5]
    elif case == "images":
        more += ["--max", 7]
    elif case == "itself":
        more = []
    elif case == "fast":
        more += ["--body", "fast"]
    elif case == "sound":
        more += ["--sound"]
    elif case == "classifier-changed":
        with open(tmp_path / "model.safetensors", "ab") as handle:
            handle.write(b"\0")
    if case not in ("no-record", "edited"):
        Path(str(ref) + ".json").write_text(json.dumps(record))
    out = tmp_path / "derived.tsv"
    args = ["--ckpt", DEMO_CHECKPOINT, *COMMON, "--reference", ref, "--out", out, *more]
    if case == "paired-alone":
        args = ["--ckpt", DEMO_CHECKPOINT, *COMMON, "--paired-samples", 10, "--out", out]
    one_line_error(run_command(certify_main, capsys, *args), "dmae-certify", mentions)
    assert not out.exists() and not Path(str(out) + ".json").exists()


def test_each_image_is_planned_by_its_reference_row():
    certified, abstained = bound_certificate(1, 100, 990, 1000, 0.001, 0.5), Certificate(ABSTAIN, 0.0, 100, 1000, 10,
                                                                                        0.0)
    confident = bound_certificate(2, 100, 1000, 1000, 0.001, 0.5)
    procedure = IncrementalCertify(ProcedureSpec(CERTIFY, 200, 0.001, 0.5, 0, name="incremental"),
                                   {0: certified, 1: abstained, 2: confident}, 0.001, 3, scratch_above=0.99)
    assert procedure.plan == SamplingPlan((PAIRED,), (200,)) and procedure.decide is None
    assert procedure.image_plans() == {1: None, 2: SamplingPlan.certify(100, 1000)}
    nothing = np.zeros((0, 9), dtype=np.int64)
    pairs = np.zeros((1, 9), dtype=np.int64)  # class pairs r * 3 + d
    pairs[0, 1 * 3 + 1], pairs[0, 1 * 3 + 2], pairs[0, 0 * 3 + 1] = 190, 4, 6  # 4 disagreements; 6 not cA's
    result = procedure.image_result(0, pairs)
    assert (result.prediction, result.n, result.disagreements, result.n_a) == (1, 200, 4, 196)
    assert result.p_a_lower == float(derived_lower_bounds(certified.p_a_lower,
                                                          disagreement_upper_bounds(4, 200, 0.001)))
    assert (procedure.image_result(1, nothing).prediction, procedure.image_result(1, nothing).n) == (ABSTAIN, 0)
    scratch = np.zeros((2, 9), dtype=np.int64)  # derived-only rows count as the pair (0, d)
    scratch[0, 2], scratch[1, 2], scratch[1, 0] = 100, 995, 5
    from_scratch = procedure.image_result(2, scratch)
    assert from_scratch.prediction == 2 and from_scratch.p_a_lower == bound_certificate(
        2, 100, 995, 1000, 0.001, 0.5).p_a_lower and from_scratch.zeta_upper == 0
    rules = procedure.rules()
    assert rules.sizes == (0, 200, 1000) and rules.certificate is not None
    assert rules.certificate(0, 196, 200) == result
    assert rules.certificate(2, 995, 1000).p_a_lower == from_scratch.p_a_lower


def test_with_a_disagreement_rate_each_image_takes_the_fewest_paired_samples_that_keep_its_step():
    """--disagreement-rate: an image whose reference radius lies well inside its 0.25 step takes the smallest size; one
    nearer the step below, a larger one; one just above a step or near the cap, none (from scratch); each size's
    bound at alpha_zeta / 4."""
    sigma, n = 0.5, 10_000
    inside = bound_certificate(1, 100, 8_000, n, 0.001, sigma)  # r 0.40: step 1 holds with room
    nearer = bound_certificate(1, 100, 9_600, n, 0.001, sigma)  # r 0.84: step 3 holds with less room
    edge = bound_certificate(1, 100, 9_420, n, 0.001, sigma)  # r just above 0.75
    capped = bound_certificate(1, 100, n, n, 0.001, sigma)  # r 1.60, the cap: any bound drops a step
    abstained = Certificate(ABSTAIN, 0.0, 100, n, 10, 0.0)
    assert 0 < edge.radius - 0.75 < 0.01 and ladder(10_000, n) == (500, 1_000, 2_000, 5_000)
    assert ladder(300, 1_000) == (50, 100, 200) and ladder(20, 1_000) == (20,)
    procedure = IncrementalCertify(ProcedureSpec(CERTIFY, n, 0.001, sigma, 0, name="incremental"),
                                   {0: inside, 1: nearer, 2: capped, 3: abstained, 4: edge}, 0.001, 3, rate=0.005)
    plans = procedure.image_plans()
    assert plans[0] == SamplingPlan((PAIRED,), (500,)) and plans[1] == SamplingPlan((PAIRED,), (2_000,))
    assert plans[2] == plans[4] == SamplingPlan.certify(100, n) and plans[3] is None
    pairs = np.zeros((1, 9), dtype=np.int64)
    pairs[0, 1 * 3 + 1], pairs[0, 1 * 3 + 2] = 497, 3
    result = procedure.image_result(0, pairs)
    assert result.zeta_upper == float(disagreement_upper_bounds(3, 500, 0.001 / 4))  # the union over four sizes
    assert result.alpha == pytest.approx(0.002) and result.n == 500
    rules = procedure.rules()
    assert rules.sizes == (0, 500, 1_000, 2_000, 5_000, n) and rules.certificate(0, 497, 500) == result
    assert procedure.image_result(2, np.zeros((2, 9), dtype=np.int64)).zeta_upper == 0  # from scratch


def test_a_relative_classifier_path_of_the_reference_is_found_beside_it(capsys, tmp_path, monkeypatch):
    folder = tmp_path / "reference"
    folder.mkdir()
    shutil.copy(DEMO_CHECKPOINT, folder / "model.safetensors")
    monkeypatch.chdir(folder)  # the reference run names its checkpoint relative to its own directory
    small = [*map(str, COMMON), "--max", "2", "--n0", "20", "--n", "200"]
    assert certify_main(["--ckpt", "model.safetensors", *small, "--out", "ref.tsv"]) == 0
    monkeypatch.chdir(tmp_path)
    run = run_command(certify_main, capsys, "--ckpt", DEMO_CHECKPOINT, *small, "--precision", "bf16", "--reference",
                      "reference/ref.tsv", "--out", "derived.tsv")
    assert run.rc == 0, run.err
    assert len(read_results(tmp_path / "derived.tsv")) == 2
