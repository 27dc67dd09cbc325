"""``dmae-certify --keep-votes N`` and incremental runs on a reference's votes (issue 59): the votes file holds the
reference classifier's vote on each image's first N estimation samples; a ``--reference`` run on it draws those
noisy inputs again, runs the derived classifier alone and counts its disagreements with the votes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import one_line_error, run_command
from safetensors import safe_open
from safetensors.torch import save_file

from dmae_fast.batching.body_options import BodyOptions
from dmae_fast.batching.classifier import open_classifier
from dmae_fast.cli.certify import main as certify_main
from dmae_fast.data import open_dataset
from dmae_fast.demo_files import DEMO_CHECKPOINT
from dmae_fast.noise.contract import gaussian_noise
from dmae_fast.results.format import read_results
from dmae_fast.results.votes import read_votes
from dmae_fast.stats.decisions import ABSTAIN, bound_certificate
from dmae_fast.stats.incremental import disagreement_upper_bounds, incremental_certificate
from dmae_fast.stats.incremental_procedure import IncrementalCertify
from dmae_fast.stats.plan import Phase, SamplingPlan
from dmae_fast.stats.procedure import CERTIFY, ProcedureSpec

pytestmark = pytest.mark.usefixtures("two_torch_threads")
COMMON = ("--data", "demo", "--max", 6, "--device", "cpu", "--quiet", "--sigma", 0.65)  # the reference abstains on one
SEED, VOTES = 3, 300


def _same_weights_other_file(target: Path) -> None:
    """The demo checkpoint's tensors and metadata in another file (another SHA-256, the same classifier)."""
    with safe_open(str(DEMO_CHECKPOINT), "pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        metadata = dict(handle.metadata() or {})
    save_file(tensors, str(target), metadata={**metadata, "copied": "yes"})


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """A fixed-n run of the demo classifier on six digits that kept 300 votes per image (the torch-op noise, so the
    test can draw the same noisy inputs)."""
    folder = tmp_path_factory.mktemp("votes")
    shutil.copy(DEMO_CHECKPOINT, folder / "model.safetensors")
    assert certify_main(["--ckpt", str(folder / "model.safetensors"), *map(str, COMMON), "--n0", "20", "--n", "1000",
                         "--seed", str(SEED), "--keep-votes", str(VOTES), "--noise", "reference",
                         "--out", str(folder / "ref.tsv")]) == 0
    return folder / "ref.tsv"


def _incremental(capsys, reference: Path, out: Path, *more: object, ckpt: object = None):
    return run_command(certify_main, capsys, "--ckpt", ckpt or reference.parent / "model.safetensors", *COMMON,
                       "--reference", reference, "--out", out, *more)


def test_the_votes_are_the_reference_classifiers_votes_on_its_first_estimation_samples(reference):
    rows, votes = read_results(reference), read_votes(str(reference) + ".votes")
    record = json.loads(Path(str(reference) + ".json").read_text())
    assert record["votes"]["path"] == "ref.tsv.votes" and record["votes"]["samples"] == VOTES == votes.samples
    assert list(votes.by_image) == list(rows.idx)
    engine = open_classifier(str(DEMO_CHECKPOINT), BodyOptions(), "cpu")
    dataset = open_dataset("demo", split="test")
    spread = 0
    for index, predict in zip(rows.idx, rows.predict):
        image = dataset[int(index)][0]
        eta = gaussian_noise(SEED, torch.full((VOTES,), int(index)), int(Phase.ESTIMATION), torch.arange(VOTES),
                             tuple(image.shape))
        classes = engine.classify(image + 0.65 * eta).numpy()
        assert np.array_equal(votes.by_image[int(index)], classes == predict)  # abstained (-1): every vote 0
        spread += 0 < (classes == predict).sum() < VOTES
    assert spread >= 2  # some images' votes are mixed: drawing other noisy inputs would show


def test_a_run_on_the_votes_draws_the_references_noisy_inputs_and_runs_the_derived_classifier_alone(
        capsys, reference, tmp_path):
    """The same classifier from another file disagrees with the votes nowhere: it saw the very noisy inputs."""
    same = tmp_path / "same.safetensors"
    _same_weights_other_file(same)
    out = tmp_path / "same.tsv"
    run = _incremental(capsys, reference, out, "--scratch-above", 1, "--alpha", 0.01, "--noise", "reference",
                       ckpt=same)
    assert run.rc == 0, run.err
    rows, ref = read_results(out), read_results(reference)
    certified = ref.predict >= 0
    assert 0 < certified.sum() < len(certified)
    assert (rows.extra["n"][certified] == VOTES).all() and (rows.extra["n"][~certified] == 0).all()
    assert (rows.extra["disagreements"] == 0).all()
    record = json.loads(Path(str(out) + ".json").read_text())
    assert record["samples"] == VOTES * certified.sum()  # one pass a sample: the reference did not run
    assert record["config"]["seed"] == SEED and record["reference"]["votes"] == VOTES
    assert "paired" not in record["engine"]
    for row in np.flatnonzero(certified):
        expected = incremental_certificate(bound_certificate(int(ref.predict[row]), 20, int(ref.extra["nA"][row]),
                                                             1000, 0.001, 0.65), 0, VOTES, 0.001, 0.01, 0.65)
        assert rows.predict[row] == expected.prediction and rows.radius[row] <= expected.radius
    # a coarser classifier does disagree, on fewer samples with --paired-samples
    coarse = tmp_path / "bf16.tsv"
    assert _incremental(capsys, reference, coarse, "--precision", "bf16", "--scratch-above", 1,
                        "--paired-samples", 200).rc == 0
    assert (read_results(coarse).extra["n"][certified] == 200).all()
    # only the derived classifier runs: the fast body may (its classes the plain body's up to rounding)
    fast = tmp_path / "fast.tsv"
    assert _incremental(capsys, reference, fast, "--scratch-above", 1, "--body", "fast", ckpt=same).rc == 0
    assert json.loads(Path(str(fast) + ".json").read_text())["body"]["name"] == "fast"
    assert read_results(fast).extra["disagreements"].sum() <= 0.01 * VOTES * certified.sum()


def test_a_resumed_run_that_keeps_votes_keeps_the_kept_rows_votes(capsys, reference, tmp_path):
    out = tmp_path / "ref.tsv"
    args = ["--ckpt", reference.parent / "model.safetensors", *COMMON, "--n0", 20, "--n", 1000, "--seed", SEED,
            "--keep-votes", VOTES, "--noise", "reference", "--out", out]
    lines = reference.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:4]))  # three rows kept
    shutil.copy(str(reference) + ".json", str(out) + ".json")
    whole = Path(str(reference) + ".votes").read_bytes()
    Path(str(out) + ".votes").write_bytes(whole[:-5])  # every row's votes, and a record torn by a crash
    assert run_command(certify_main, capsys, *args, "--resume").rc == 0
    assert [line.split("\t")[:5] for line in out.read_text().splitlines()] == [line.split("\t")[:5] for line in lines]
    assert Path(str(out) + ".votes").read_bytes() == whole
    record = json.loads(Path(str(out) + ".json").read_text())
    assert record["votes"]["sha256"] == json.loads(Path(str(reference) + ".json").read_text())["votes"]["sha256"]
    out.write_text("".join(lines[:4]))
    Path(str(out) + ".votes").write_bytes(whole[:-4 * (8 + (VOTES + 7) // 8)])  # the third kept row's votes lost
    one_line_error(run_command(certify_main, capsys, *args, "--resume"), "dmae-certify", "has no votes for image idx")


def test_a_disagreement_rate_gives_each_image_its_own_paired_samples_and_resumes_to_the_same_rows(
        capsys, reference, tmp_path):
    """--disagreement-rate: each row's n is one of the ladder's sizes (5, 10, 20% of the reference's n 1,000, at most
    the 300 votes), from scratch (n 1,000) or none (abstained), its bound at alpha_zeta / 3; a resumed run writes
    the same rows, and one with another rate is refused."""
    out = tmp_path / "bf16.tsv"
    more = ("--precision", "bf16", "--disagreement-rate", 0.01)
    assert _incremental(capsys, reference, out, *more).rc == 0
    rows, ref = read_results(out), read_results(reference)
    n, d = rows.extra["n"], rows.extra["disagreements"]
    assert set(n.tolist()) <= {0, 50, 100, 200, 1000} and (n[ref.predict < 0] == 0).all()
    paired = np.isin(n, (50, 100, 200))
    assert paired.any()
    expected = disagreement_upper_bounds(d[paired], n[paired], 0.001 / 3)
    assert (rows.extra["zeta_upper"][paired] >= expected).all()  # alpha_zeta / 1 would give less
    assert (rows.extra["alpha"][paired] == 0.002).all()
    record = json.loads(Path(str(out) + ".json").read_text())
    assert record["config"]["disagreement_rate"] == 0.01 and record["config"]["scratch_above"] is None
    whole = out.read_text()
    out.write_text("".join(whole.splitlines(keepends=True)[:4]))
    assert _incremental(capsys, reference, out, *more, "--resume").rc == 0
    assert [line.split("\t")[:5] for line in out.read_text().splitlines()] == [
        line.split("\t")[:5] for line in whole.splitlines()]
    other = _incremental(capsys, reference, out, "--precision", "bf16", "--disagreement-rate", 0.02, "--resume")
    one_line_error(other, "dmae-certify", "disagreement_rate")
    for bad, says in ((("--disagreement-rate", 0), "must be in (0, 1)"),
                      (("--disagreement-rate", 0.01, "--scratch-above", 0.9), "drop --scratch-above")):
        one_line_error(_incremental(capsys, reference, tmp_path / "no.tsv", "--precision", "bf16", *bad),
                       "dmae-certify", says)
        assert not (tmp_path / "no.tsv").exists()


def test_a_sound_reference_keeps_its_votes_and_the_derived_run_states_both_runs_terms(capsys, tmp_path):
    """--sound: the reference's votes are on the rounded Gaussian on the demo's 1/16 grid; the same classifier from
    another file, on those noisy inputs, disagrees nowhere; the stated failure probability adds the reference's alpha
    and the total variation of both runs' noise; a derived run without --sound is refused."""
    shutil.copy(DEMO_CHECKPOINT, tmp_path / "model.safetensors")
    ref, plain_ref = tmp_path / "ref.tsv", tmp_path / "plain.tsv"
    args = ["--ckpt", tmp_path / "model.safetensors", *COMMON, "--n0", 20, "--n", 1000, "--seed", SEED, "--sound"]
    assert run_command(certify_main, capsys, *args, "--keep-votes", VOTES, "--out", ref).rc == 0
    assert run_command(certify_main, capsys, *args, "--out", plain_ref).rc == 0
    assert [line.split("\t")[:5] for line in ref.read_text().splitlines()] == [
        line.split("\t")[:5] for line in plain_ref.read_text().splitlines()]  # keeping votes changes no row
    same, out = tmp_path / "same.safetensors", tmp_path / "same.tsv"
    _same_weights_other_file(same)
    assert _incremental(capsys, ref, out, "--scratch-above", 1, "--sound", ckpt=same).rc == 0
    rows = read_results(out)
    assert (rows.extra["disagreements"] == 0).all() and (rows.extra["n"][rows.predict >= 0] == VOTES).all()
    assert set(rows.extra["procedure"]) == {"incremental sound"}
    stated = json.loads(Path(str(out) + ".json").read_text())["sound"]
    reference_tv = json.loads(Path(str(ref) + ".json").read_text())["sound"]["tv_per_image"]
    assert stated["reference_alpha"] == 0.001 and stated["reference_tv_per_image"] == reference_tv > 0
    assert stated["failure_probability"] >= 0.001 + 0.001 + stated["tv_per_image"] + reference_tv
    one_line_error(_incremental(capsys, ref, tmp_path / "no.tsv", "--scratch-above", 1, ckpt=same),
                   "dmae-certify", "must draw the same noise")


@pytest.mark.parametrize("case", ["predict", "sequential", "more-than-n", "nproc"])
def test_keep_votes_is_refused_where_it_cannot_apply(capsys, tmp_path, case):
    more = {"predict": ["--predict"], "sequential": ["--sequential"], "more-than-n": ["--keep-votes", 2000],
            "nproc": ["--nproc-per-node", 2]}[case]
    mentions = {"predict": "excludes --predict", "sequential": "excludes --predict", "more-than-n": "exceeds --n",
                "nproc": "--nproc-per-node"}[case]
    out = tmp_path / "ref.tsv"
    run = run_command(certify_main, capsys, *COMMON, "--n", 1000, "--keep-votes", 100, *more, "--out", out)
    one_line_error(run, "dmae-certify", mentions)
    assert not out.exists() and not Path(str(out) + ".votes").exists()


@pytest.mark.parametrize("case", ["edited", "missing", "more-paired", "seed"])
def test_bad_votes_are_refused_in_one_line_with_nothing_written(capsys, reference, tmp_path, case):
    ref = tmp_path / "ref.tsv"
    for suffix in ("", ".json", ".votes"):
        shutil.copy(str(reference) + suffix, str(ref) + suffix)
    shutil.copy(reference.parent / "model.safetensors", tmp_path / "model.safetensors")
    more: list[object] = ["--precision", "bf16"]
    if case == "edited":
        data = bytearray(Path(str(ref) + ".votes").read_bytes())
        data[-1] ^= 1
        Path(str(ref) + ".votes").write_bytes(bytes(data))
    elif case == "missing":
        Path(str(ref) + ".votes").unlink()
    elif case == "more-paired":
        more += ["--paired-samples", VOTES + 1]
    elif case == "seed":
        more += ["--seed", SEED + 1]
    mentions = {"edited": "was edited", "missing": "is missing", "more-paired": "exceeds the 300 votes",
                "seed": "drop --seed"}[case]
    out = tmp_path / "derived.tsv"
    one_line_error(_incremental(capsys, ref, out, *more, ckpt=DEMO_CHECKPOINT), "dmae-certify", mentions)
    assert not out.exists() and not Path(str(out) + ".json").exists()


def test_disagreements_are_counted_where_the_reference_voted_its_class():
    certified, confident = bound_certificate(1, 100, 990, 1000, 0.001, 0.5), bound_certificate(2, 100, 1000, 1000,
                                                                                              0.001, 0.5)
    votes = {0: np.array([1, 1, 0, 1, 0, 1], dtype=bool), 2: np.ones(6, dtype=bool)}
    procedure = IncrementalCertify(ProcedureSpec(CERTIFY, 5, 0.001, 0.5, 0, name="incremental"),
                                   {0: certified, 2: confident}, 0.001, 3, scratch_above=0.99, votes=votes)
    assert procedure.plan == SamplingPlan((Phase.ESTIMATION,), (5,)) and procedure.keeps == 5
    derived = np.array([1, 2, 2, 0, 1])  # differs from class 1 at samples 1, 2 and 3; the reference voted 1 at 0, 1, 3
    result = procedure.image_result(0, np.bincount(derived, minlength=3)[None], derived)
    assert (result.prediction, result.n, result.disagreements, result.n_a) == (ABSTAIN, 5, 2, 3)  # 2 of 5: no bound
    with pytest.raises(ValueError, match="not kept"):
        procedure.image_result(0, np.bincount(derived, minlength=3)[None], None)
    scratch = np.array([[0, 0, 100], [3, 0, 997]])  # the derived classifier's own counts: no class pairs
    assert procedure.image_result(2, scratch, derived).p_a_lower == bound_certificate(
        2, 100, 997, 1000, 0.001, 0.5).p_a_lower
    assert procedure.rules().certificate(0, 3, 5) == result


def test_a_reference_on_the_fast_body_keeps_its_votes(capsys, tmp_path):
    out = tmp_path / "fast.tsv"
    run = run_command(certify_main, capsys, *COMMON, "--max", 3, "--n0", 20, "--n", 300, "--keep-votes", 300,
                      "--body", "fast", "--out", out)
    assert run.rc == 0, run.err
    assert json.loads(Path(str(out) + ".json").read_text())["body"]["name"] == "fast"
    rows, votes = read_results(out), read_votes(str(out) + ".votes")
    for index, predict, n_a in zip(rows.idx, rows.predict, rows.extra["nA"]):  # every estimation sample kept
        assert votes.by_image[int(index)].sum() == (n_a if predict >= 0 else 0)
