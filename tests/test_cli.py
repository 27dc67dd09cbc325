"""Tests for the ``dmae-certify`` command line (dmae_fast.cli.certify / analyze).

Runs are tiny (3-4 demo images, 20 + 200 noisy samples each) and go through
``main(argv)`` in-process; one test runs the installed console script.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import Run, one_line_error, rows_without, run_command, tiny_checkpoint
from scipy.stats import beta, norm

from dmae_fast.base.errors import UserError
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import SamplingPlan, StreamingCertifier
from dmae_fast.cli.certify import main
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines.torch_engine import TorchEngine
from dmae_fast.model.checkpoints import load_classifier
from dmae_fast.stats.sequential_radius import Z_STEP

# --device cpu: fp32 everywhere, so rows are bit-for-bit reproducible on any machine.
BASE = ["--data", "demo", "--seed", "0", "--n0", "20", "--n", "200", "--batch", "64", "--quiet", "--device", "cpu"]
SIGMA = 0.25  # the demo checkpoint's sigma
ALPHA = 0.001  # the default --alpha
CERTIFY_HEAD = ["idx", "label", "predict", "radius", "correct", "time"]
CERTIFY_EXTRA = ["n0", "n", "nA", "pA_lower", "sigma", "procedure"]
PREDICT_HEAD = ["idx", "label", "predict", "correct", "time"]
TIME = re.compile(r"\d+:\d\d:\d\d(\.\d+)?")
ERROR_PREFIX = "dmae-certify: error:"


def certify(capsys: pytest.CaptureFixture[str], *args: object) -> Run:
    return run_command(main, capsys, *args)


def read_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "", "the file must end with a line break"
    header = lines[0].split("\t")
    rows = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:-1]]
    return header, rows


def expected_radius(n_a: int, n: int, sigma: float = SIGMA, alpha: float = ALPHA) -> float:
    return sigma * norm.ppf(beta.ppf(alpha, n_a, n - n_a + 1))


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def assert_one_line_error(run: Run, *mentions: str) -> str:
    return one_line_error(run, "dmae-certify", *mentions)


def assert_error_during_run(run: Run, *mentions: str) -> str:
    """Exit 2 and one error line after the run's own start line (no traceback)."""
    assert run.rc == 2, run
    errors = [line for line in run.err.splitlines() if line.startswith(ERROR_PREFIX)]
    assert len(errors) == 1 and "Traceback" not in run.err, run.err
    assert len(run.err.splitlines()) <= 2, run.err
    for mention in mentions:
        assert mention in errors[0], (mention, errors[0])
    return errors[0]


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def certified(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    """One certification run: --skip 7 --max 3 (images 0, 7 and 14)."""
    out = tmp_path_factory.mktemp("e2e") / "run.tsv"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main([*BASE, "--skip", "7", "--max", "3", "--out", str(out)])
    return out, Run(rc, stdout.getvalue(), stderr.getvalue())


def test_certify_end_to_end_rows(certified: tuple[Path, Run]) -> None:
    out, run = certified
    assert run.rc == 0, run.err
    header, rows = read_rows(out)
    assert header == CERTIFY_HEAD + CERTIFY_EXTRA
    assert out.read_text().startswith("\t".join(CERTIFY_HEAD) + "\t")
    assert [int(r["idx"]) for r in rows] == [0, 7, 14]
    labels = demo_digits("test").labels
    for row in rows:
        idx, label, predict = int(row["idx"]), int(row["label"]), int(row["predict"])
        assert label == int(labels[idx])
        assert int(row["correct"]) == int(predict == label)
        assert TIME.fullmatch(row["time"]), row["time"]
        n0, n, n_a = int(row["n0"]), int(row["n"]), int(row["nA"])
        assert (n0, n) == (20, 200) and 0 <= n_a <= n
        assert float(row["sigma"]) == SIGMA
        assert row["procedure"] == "cohen-fixed-n"
        radius = float(row["radius"])
        assert (radius == 0) == (predict == -1), row
        if predict != -1:
            expected = expected_radius(n_a, n)
            assert expected - 1e-6 < radius <= expected + 1e-12, (row, expected)  # rounded down
            bound = beta.ppf(ALPHA, n_a, n - n_a + 1)
            assert bound - 1e-9 < float(row["pA_lower"]) <= bound + 1e-12, (row, bound)
    # The trained demo model (~98% clean accuracy) certifies most images at r = 0.
    assert sum(int(r["correct"]) for r in rows) >= 2


def test_certify_end_to_end_summary_and_sidecar(certified: tuple[Path, Run]) -> None:
    out, run = certified
    assert run.rc == 0, run.err
    _, rows = read_rows(out)
    accuracy = sum(int(r["correct"]) for r in rows) / len(rows)
    table_row = next(line for line in run.out.splitlines() if line.split()[:1] == [out.stem])
    assert table_row.split()[1] == f"{100 * accuracy:.1f}"  # certified accuracy at r=0
    assert run.out.splitlines()[0].split()[:3] == ["file", "r=0", "r=0.25"]
    assert f"clean accuracy of the smoothed classifier: {accuracy:.1%}" in run.out
    record = json.loads(Path(str(out) + ".json").read_text())
    config = record["config"]
    assert config["data"] == "demo"
    assert config["out"] == str(out)
    assert (config["n0"], config["n"], config["skip"], config["max_images"]) == (20, 200, 7, 3)
    assert config["sigma"] == SIGMA and config["alpha"] == ALPHA and config["seed"] == 0
    assert Path(config["engine"]) == DEMO_CHECKPOINT
    assert record["status"] == "complete" and record["images"] == 3
    assert record["procedure"] == "cohen-fixed-n"
    assert record["classifier"]["num_classes"] == 10


def test_certify_abstains_with_radius_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # One estimation sample can never push pA_lower to 1/2 at alpha 0.001: always abstain.
    out = tmp_path / "abstain.tsv"
    run = certify(capsys, *BASE, "--n", "1", "--max", "2", "--out", out)
    assert run.rc == 0, run.err
    _, rows = read_rows(out)
    assert len(rows) == 2
    for row in rows:
        assert (row["predict"], float(row["radius"]), row["correct"]) == ("-1", 0.0, "0")


def test_predict_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "predict.tsv"
    run = certify(capsys, *BASE, "--predict", "--max", "3", "--out", out)
    assert run.rc == 0, run.err
    header, rows = read_rows(out)
    assert header[:5] == PREDICT_HEAD
    assert "radius" not in header and "nA" not in header
    assert out.read_text().startswith("\t".join(PREDICT_HEAD) + "\t")
    assert [int(r["idx"]) for r in rows] == [0, 1, 2]
    for row in rows:
        assert int(row["correct"]) == int(row["predict"] == row["label"])
        assert TIME.fullmatch(row["time"])
        assert int(row["n"]) == 200
        assert int(row["count1"]) + int(row["count2"]) <= 200
    assert sum(int(r["correct"]) for r in rows) >= 2
    assert json.loads(Path(str(out) + ".json").read_text())["procedure"] == "predict"
    assert "accuracy (%)" in run.out


# --------------------------------------------------------------------------- reproducibility


def test_same_command_twice_gives_same_rows(certified: tuple[Path, Run], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    first, _ = certified
    again = tmp_path / "again.tsv"
    assert certify(capsys, *BASE, "--skip", "7", "--max", "3", "--out", again).rc == 0
    assert rows_without(again) == rows_without(first)


def test_a_run_without_seed_draws_a_fresh_one_that_reproduces_it(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """No public default seed: each run not given --seed draws its own (start line and record), and --seed
    with the recorded value gives the same rows."""
    args = [a for a in BASE if a not in ("--seed", "0")] + ["--max", "2"]
    seeds = []
    for name in ("a", "b"):
        run = certify(capsys, *args, "--out", tmp_path / f"{name}.tsv")
        assert run.rc == 0
        seed = json.loads((tmp_path / f"{name}.tsv.json").read_text())["config"]["seed"]
        assert isinstance(seed, int) and 0 <= seed < 2**64 and f"seed {seed}," in run.err
        seeds.append(seed)
    assert seeds[0] != seeds[1] and 0 not in seeds
    assert certify(capsys, *args, "--seed", seeds[0], "--out", tmp_path / "again.tsv").rc == 0
    assert rows_without(tmp_path / "again.tsv") == rows_without(tmp_path / "a.tsv")


def test_a_resumed_run_keeps_its_recorded_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [a for a in BASE if a not in ("--seed", "0")] + ["--max", "3"]
    out = tmp_path / "r.tsv"
    assert certify(capsys, *args, "--out", out).rc == 0
    complete = rows_without(out)
    seed = json.loads(Path(f"{out}.json").read_text())["config"]["seed"]
    out.write_text("\n".join(out.read_text().splitlines()[:-1]) + "\n")  # the last image lost
    run = certify(capsys, *args, "--resume", "--out", out)
    assert run.rc == 0 and f"seed {seed}," in run.err
    assert rows_without(out) == complete
    out.write_text("\n".join(out.read_text().splitlines()[:-1]) + "\n")
    run = certify(capsys, *args, "--resume", "--seed", seed + 1, "--out", out)
    assert run.rc == 2 and "seed differ" in run.err


def test_a_record_edited_to_another_seed_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A resumed run counts one kept image again with the record's seed: a record edited to another seed (which
    would continue with another noise stream under one claimed seed) or to a seed of JSON ``true`` is refused in
    one line, and the kept rows stay as they were; the genuine record continues to the one-seed rows."""
    args = [*[a for a in BASE if a not in ("--seed", "0")], "--max", "4", "--sigma", "0.5"]  # counts spread
    complete, out = tmp_path / "complete.tsv", tmp_path / "r.tsv"
    assert certify(capsys, *args, "--seed", "5", "--out", complete).rc == 0
    shutil.copy(complete, out)
    record = json.loads(Path(f"{complete}.json").read_text())
    interrupt(out, keep_rows=2)
    kept = out.read_text()
    for seed in (6, True):
        record["config"]["seed"] = seed
        Path(f"{out}.json").write_text(json.dumps(record))
        run = certify(capsys, *args, "--resume", "--out", out)
        assert run.rc == 2 and len(run.err.strip().splitlines()[-1:]) == 1 and "Traceback" not in run.err
        assert ("counted again with seed 6" in run.err and "edited run record" in run.err if seed == 6
                else "names no noise seed (True)" in run.err), run.err
        assert out.read_text() == kept
    record["config"]["seed"] = 5
    Path(f"{out}.json").write_text(json.dumps(record))
    run = certify(capsys, *args, "--resume", "--out", out)
    assert run.rc == 0 and "counting image(s)" in run.err and rows_without(out) == rows_without(complete)


def test_batch_size_does_not_change_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small, large = tmp_path / "b7.tsv", tmp_path / "b1000.tsv"
    args = [a for a in BASE if a not in ("--batch", "64")] + ["--max", "2"]
    assert certify(capsys, *args, "--batch", "7", "--out", small).rc == 0
    assert certify(capsys, *args, "--batch", "1000", "--out", large).rc == 0
    assert len(rows_without(small)) == 3
    assert rows_without(small) == rows_without(large)


# --------------------------------------------------------------------------- resume / overwrite

# --sigma and --precision given explicitly: see test_resume_with_identical_default_args.
RESUMABLE = [*BASE, "--max", "4", "--sigma", "0.25", "--precision", "fp32"]


def interrupt(path: Path, keep_rows: int, torn: bool = False) -> None:
    """Rewrite ``path`` as if the run had stopped after ``keep_rows`` rows."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    text = "".join(lines[: 1 + keep_rows])
    if torn:  # a crash in the middle of writing the next row
        text += lines[1 + keep_rows][:7]
    path.write_text(text, encoding="utf-8")


@pytest.mark.parametrize("torn", [False, True], ids=["clean-cut", "torn-last-line"])
def test_resume_completes_an_interrupted_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             torn: bool) -> None:
    out = tmp_path / "resume.tsv"
    assert certify(capsys, *RESUMABLE, "--out", out).rc == 0
    complete = rows_without(out)
    assert [cells[0] for cells in complete] == ["idx", "0", "1", "2", "3"]
    interrupt(out, keep_rows=2, torn=torn)
    run = certify(capsys, *RESUMABLE, "--resume", "--out", out)
    assert run.rc == 0, run.err
    assert "2 images" in run.err  # only the missing ones were certified
    assert rows_without(out) == complete


def test_resuming_a_finished_run_says_there_is_nothing_left(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "done.tsv"
    assert certify(capsys, *RESUMABLE, "--out", out).rc == 0
    complete = rows_without(out)
    run = certify(capsys, *RESUMABLE, "--resume", "--out", out)
    assert run.rc == 0, run.err
    assert f"nothing left to certify: every image of the run is already in {out}" in run.err
    assert "nan" not in run.err  # was: "0 images in 0.0 s (nan noisy samples/s)"
    assert rows_without(out) == complete


def test_resume_with_identical_default_args(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "resume-defaults.tsv"
    args = [*BASE, "--max", "3", "--out", out]
    assert certify(capsys, *args).rc == 0
    complete = rows_without(out)
    interrupt(out, keep_rows=1)
    run = certify(capsys, *args, "--resume")
    assert run.rc == 0, run.err
    assert rows_without(out) == complete


def test_resume_refuses_a_different_sigma(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "resume.tsv"
    assert certify(capsys, *RESUMABLE, "--out", out).rc == 0
    interrupt(out, keep_rows=2)
    before = snapshot(tmp_path)
    args = [a if a != "0.25" else "0.5" for a in RESUMABLE]
    run = certify(capsys, *args, "--resume", "--out", out)
    message = assert_one_line_error(run, "--resume", "sigma")
    assert "precision" not in message
    assert snapshot(tmp_path) == before


def test_resume_of_a_run_that_wrote_nothing_starts_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run killed before its first row leaves no results file: --resume just runs it."""
    reference, out = tmp_path / "reference.tsv", tmp_path / "missing.tsv"
    assert certify(capsys, *RESUMABLE, "--out", reference).rc == 0
    run = certify(capsys, *RESUMABLE, "--resume", "--out", out)
    assert run.rc == 0, run.err
    assert "does not exist yet; starting the run" in run.err
    assert rows_without(out) == rows_without(reference)
    assert json.loads(Path(str(out) + ".json").read_text())["status"] == "complete"


def test_overwrite_replaces_an_existing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reference, out = tmp_path / "reference.tsv", tmp_path / "old.tsv"
    assert certify(capsys, *BASE, "--max", "2", "--out", reference).rc == 0
    out.write_text("not a results file\n")
    run = certify(capsys, *BASE, "--max", "2", "--overwrite", "--out", out)
    assert run.rc == 0, run.err
    assert rows_without(out) == rows_without(reference)
    assert not Path(str(out) + ".partial").exists()
    assert json.loads(Path(str(out) + ".json").read_text())["status"] == "complete"


def test_overwrite_and_resume_exclude_each_other(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.tsv"
    out.write_text("keep\n")
    run = certify(capsys, *BASE, "--max", "2", "--overwrite", "--resume", "--out", out)
    assert_one_line_error(run, "--overwrite", "--resume")
    assert out.read_text() == "keep\n"


# --------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("ckpt")
    not_a_checkpoint = directory / "notes.safetensors"
    not_a_checkpoint.write_text("these are not tensors\n")
    pickle_junk = directory / "junk.pth"
    pickle_junk.write_bytes(b"\x00\x01junk")
    return {
        "five_classes": tiny_checkpoint(directory / "five.safetensors", classes=5),
        "input16": tiny_checkpoint(directory / "input16.safetensors", input_size=16),
        "not_a_checkpoint": not_a_checkpoint,
        "pickle_junk": pickle_junk,
    }


def assert_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str],
                   *mentions: str) -> str:
    """Exit 2, one error line, and the directory of --out left exactly as it was."""
    out = tmp_path / "results" / "out.tsv"
    out.parent.mkdir(exist_ok=True)
    before = snapshot(out.parent)
    message = assert_one_line_error(certify(capsys, *BASE, "--max", "3", *args, "--out", out), *mentions)
    assert snapshot(out.parent) == before
    assert not out.exists()
    return message


BAD_OPTIONS = [
    (["--sigma", "0"], ["--sigma"]),
    (["--sigma", "-1"], ["--sigma"]),
    (["--sigma", "nan"], ["--sigma"]),
    (["--alpha", "0"], ["--alpha"]),
    (["--alpha", "1"], ["--alpha"]),
    (["--alpha", "1.5"], ["--alpha"]),
    (["--n0", "0"], ["--n0"]),
    (["--n", "0"], ["--n must"]),
    (["--batch", "0"], ["--batch"]),
    (["--skip", "0"], ["--skip"]),
    (["--max", "0"], ["--max"]),
    (["--input-size", "0"], ["--input-size"]),
    (["--input-size", "-3"], ["--input-size"]),
    (["--image-size", "0"], ["--image-size"]),  # was: silently the default size
    (["--image-size", "-8"], ["--image-size"]),
    (["--sigma", "inf"], ["--sigma"]),
    (["--sigma", "1e308"], ["--sigma", "(0, 100]"]),  # was: bad rows, then a crash reading them
    (["--alpha", "nan"], ["--alpha"]),
    (["--batch", str(2**40)], ["--batch"]),
    (["--seed", "-1"], ["--seed"]),
    (["--seed", str(2**64)], ["--seed"]),
    (["--workers", "-1"], ["--workers"]),
    (["--labels", "labels.txt"], ["--labels", "--data demo has its own"]),  # was: ignored, even a missing file
    (["--radii", "0.5", "inf"], ["--radii"]),
    (["--n", str(2**32)], ["--n must"]),
    (["--n", "many"], ["--n", "many"]),
    (["--no-such-option"], ["--no-such-option"]),
    (["--sequential", "--predict"], ["--sequential", "--predict"]),
    (["--normalize", "0.5:0.5"], ["normalization", "3 finite means"]),
    (["--normalize", "0.5,nan,0.5:1,1,1"], ["normalization", "finite"]),
    (["--normalize", "0.5,0.5,0.5:1,0,1"], ["normalization", "stds > 0"]),
    (["--normalize", "gray"], ["--normalize"]),
    (["--sequential", "--looks", "50", "100"], ["looks", "n=200"]),
    (["--sequential", "--looks", "100", "50", "200"], ["looks"]),
    (["--looks", "100", "200"], ["--looks", "apply to --sequential"]),
    (["--futility", "upper"], ["--futility", "apply to --sequential"]),
    (["--sequential-test", "bonferroni"], ["--sequential-test", "apply to --sequential"]),
]


@pytest.mark.parametrize(("args", "mentions"),
                         [pytest.param(a, m, id=" ".join(a)) for a, m in BAD_OPTIONS])
def test_bad_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                     mentions: list[str]) -> None:
    assert_refused(capsys, tmp_path, args, *mentions)


def test_missing_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.safetensors"
    assert_refused(capsys, tmp_path, ["--ckpt", str(missing)], str(missing))


@pytest.mark.parametrize("name", ["not_a_checkpoint", "pickle_junk"])
def test_file_that_is_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       checkpoints: dict[str, Path], name: str) -> None:
    assert_refused(capsys, tmp_path, ["--ckpt", str(checkpoints[name])], str(checkpoints[name]))


def test_class_count_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              checkpoints: dict[str, Path]) -> None:
    message = assert_refused(capsys, tmp_path, ["--ckpt", str(checkpoints["five_classes"])], "classes")
    assert "10" in message and "5" in message


def test_image_shape_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              checkpoints: dict[str, Path]) -> None:
    message = assert_refused(capsys, tmp_path, ["--ckpt", str(checkpoints["input16"])], "shape")
    assert "(3, 8, 8)" in message and "(3, 16, 16)" in message


def test_existing_out_is_left_untouched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "taken.tsv"
    content = b"idx\tlabel\r\n\x00 precious bytes \xff\n"
    out.write_bytes(content)
    run = certify(capsys, *BASE, "--max", "3", "--out", out)
    assert_one_line_error(run, str(out), "--overwrite")
    assert out.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.tsv"]


def test_missing_data_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-data"
    assert_refused(capsys, tmp_path, ["--ckpt", "demo", "--data", str(missing)], str(missing))


def test_empty_image_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("# no images\n\n")
    assert_refused(capsys, tmp_path, ["--ckpt", "demo", "--data", str(empty)], "empty", str(empty))


def deny(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Make ``path`` unreadable, also for root (who ignores permission bits)."""
    path.chmod(0)
    if os.geteuid() == 0:
        real_access = os.access

        def access(target, mode, *args, **kwargs):
            return False if Path(target) == path else real_access(target, mode, *args, **kwargs)

        monkeypatch.setattr(os, "access", access)


@pytest.fixture
def image_dir(tmp_path: Path) -> Path:
    from PIL import Image

    directory = tmp_path / "images"
    directory.mkdir()
    Image.new("RGB", (8, 8), (10, 200, 30)).save(directory / "a.png")
    (directory / "labels.txt").write_text("a.png 3\n")
    return directory


def test_image_dir_with_unreadable_list(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch, image_dir: Path) -> None:
    labels = image_dir / "labels.txt"
    deny(monkeypatch, labels)
    try:
        assert_refused(capsys, tmp_path, ["--ckpt", "demo", "--data", str(image_dir),
                                          "--labels", str(labels)], str(labels))
    finally:
        labels.chmod(0o644)


def test_image_dir_with_undecodable_list(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         image_dir: Path) -> None:
    labels = image_dir / "labels.txt"
    labels.write_bytes(b"\xff\xfe a.png 3\n")
    assert_refused(capsys, tmp_path, ["--ckpt", "demo", "--data", str(image_dir),
                                      "--labels", str(labels)], str(labels))


def test_unlistable_image_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch, image_dir: Path) -> None:
    deny(monkeypatch, image_dir)
    try:
        assert_refused(capsys, tmp_path, ["--ckpt", "demo", "--data", str(image_dir)], str(image_dir))
    finally:
        image_dir.chmod(0o755)


def test_list_without_labels_for_image_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           image_dir: Path) -> None:
    (image_dir / "labels.txt").unlink()
    assert_refused(capsys, tmp_path, ["--ckpt", "demo", "--data", str(image_dir)], str(image_dir))


def test_nan_pixels_are_refused() -> None:
    engine = TorchEngine(load_classifier(DEMO_CHECKPOINT), torch.device("cpu"), "fp32")
    streamer = StreamingCertifier(Smoothing(engine, SIGMA, 0, 64), SamplingPlan.certify(20, 200))
    image = torch.full((3, 8, 8), 0.5)
    image[1, 2, 3] = math.nan
    with pytest.raises(UserError, match="NaN") as info:
        list(streamer.run([(0, image, 0)]))
    assert "\n" not in str(info.value) and "image 0" in str(info.value)


# --------------------------------------------------------------------------- analyze


def test_analyze_prints_the_table(certified: tuple[Path, Run], capsys: pytest.CaptureFixture[str]) -> None:
    out, run = certified
    analyzed = certify(capsys, "analyze", out)
    assert analyzed.rc == 0, analyzed.err
    table = analyzed.out.splitlines()
    assert table[0].split()[:2] == ["file", "r=0"] and table[0].split()[-1] == "ACR"
    assert any(line.split()[:1] == [out.stem] for line in table)
    # The same table as the summary printed at the end of the run.
    assert analyzed.out.strip() in run.out


def test_analyze_plot_writes_a_png(certified: tuple[Path, Run], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = certified
    png = tmp_path / "curve.png"
    analyzed = certify(capsys, "analyze", out, "--plot", png)
    assert analyzed.rc == 0, analyzed.err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in analyzed.err


def test_analyze_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(certify(capsys, "analyze", tmp_path / "none.tsv"), "dmae-certify analyze", "none.tsv")


# --------------------------------------------------------------------------- console script


def test_console_script(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "dmae-certify"
    if not script.exists():
        found = shutil.which("dmae-certify")
        if found is None:
            pytest.skip("the dmae-certify console script is not installed")
        script = Path(found)
    out = tmp_path / "script.tsv"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(script), *BASE, "--max", "2", "--out", str(out)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr
    _, rows = read_rows(out)
    assert [r["idx"] for r in rows] == ["0", "1"]
    assert "clean accuracy of the smoothed classifier" in done.stdout
    assert "Traceback" not in done.stderr


def test_sequential_mode_samples_a_prefix_of_the_fixed_n_run(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Each image stops at a look; its votes equal a fixed-n run's with n = that look."""
    looks = ["100", "400", "2000"]
    seq = tmp_path / "seq.tsv"
    args = ["--data", "demo", "--seed", "0", "--n0", "20", "--batch", "64", "--quiet", "--device", "cpu", "--max", "4"]
    run = certify(capsys, *args, "--n", "2000", "--sequential", "--sequential-test", "bonferroni", "--looks", *looks,
                  "--out", seq)
    assert run.rc == 0, run.err
    _, rows = read_rows(seq)
    assert sorted(int(r["idx"]) for r in rows) == [0, 1, 2, 3]
    assert {r["procedure"] for r in rows} == {"sequential-cp-bonferroni-K3"}
    assert all(r["n"] in looks for r in rows)
    assert any(r["n"] != "2000" for r in rows)  # the confident demo digits stop early
    for n in {r["n"] for r in rows}:
        fixed = tmp_path / f"fixed-{n}.tsv"
        assert certify(capsys, *args, "--n", n, "--out", fixed).rc == 0
        fixed_rows = {r["idx"]: r for r in read_rows(fixed)[1]}
        for r in rows:
            if r["n"] == n:
                assert r["nA"] == fixed_rows[r["idx"]]["nA"]
                bound = beta.ppf(ALPHA / 3, int(r["nA"]), int(n) - int(r["nA"]) + 1)
                assert float(r["pA_lower"]) == pytest.approx(bound, rel=1e-5)
    record = json.loads(Path(str(seq) + ".json").read_text())
    assert record["procedure"] == "sequential-cp-bonferroni-K3"
    assert record["samples"] == sum(20 + int(r["n"]) for r in rows)


def test_exact_sequential_mode_certifies_continuous_radii_from_a_prefix_and_resumes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--sequential (the exact group-sequential test, the default): each image stops at a look with
    the votes of a fixed-n run of that n, its radius is sigma * z with z on the radius family's grid (0 when
    abstaining), below what 1,000 samples can reach, with pA_lower = Phi(r / sigma); a --resume keeps such rows and
    refuses a tampered one."""
    seq = tmp_path / "seq.tsv"
    args = ["--data", "demo", "--seed", "0", "--n0", "20", "--batch", "64", "--quiet", "--device", "cpu", "--max", "4"]
    run = certify(capsys, *args, "--n", "1000", "--sequential", "--out", seq)
    assert run.rc == 0, run.err
    header, rows = read_rows(seq)
    assert {r["procedure"] for r in rows} <= {r["procedure"] for r in rows[:1]}
    assert rows[0]["procedure"].startswith("group-sequential-exact-K")
    reach = 0.25 * norm.ppf(ALPHA ** (1 / 1000))  # 0.675: every vote of 1,000 for the top class
    steps = [float(r["radius"]) / 0.25 / Z_STEP for r in rows]  # radii are written rounded down to 6 decimals
    assert all(abs(s - round(s)) < 1e-3 for s in steps) and all(float(r["radius"]) < reach for r in rows)
    assert any(float(r["radius"]) not in (0.0, 0.25, 0.5) for r in rows)  # beyond the grid's 0.25 steps
    assert any(r["n"] == r["nA"] == "1000" for r in rows)  # confident digits draw on while the radius grows (--grow)
    assert header[-1] == "grid_radius"  # the level the decision rests on: a step of the grid, at most the radius
    assert all(float(r["grid_radius"]) in (0.0, 0.25, 0.5) and float(r["grid_radius"]) <= float(r["radius"])
               for r in rows) and any(float(r["grid_radius"]) < float(r["radius"]) for r in rows)
    certified = [r for r in rows if r["predict"] != "-1"]
    assert certified and all(float(r["pA_lower"]) == pytest.approx(norm.cdf(float(r["radius"]) / 0.25), abs=1e-6)
                             for r in certified)
    for r in rows:  # the votes are those of a fixed-n run with n = the look it stopped at
        fixed = tmp_path / f"fixed-{r['idx']}.tsv"
        assert certify(capsys, *args, "--n", r["n"], "--out", fixed).rc == 0
        assert {f["idx"]: f for f in read_rows(fixed)[1]}[r["idx"]]["nA"] == r["nA"]
    record = json.loads(Path(str(seq) + ".json").read_text())
    assert 0.5 < record["max_radius"] < reach and record["procedure"] == rows[0]["procedure"]
    lines = seq.read_text().splitlines()
    seq.write_text("\n".join(lines[:-1]) + "\n")  # the last image is missing: --resume certifies it again
    assert certify(capsys, *args, "--n", "1000", "--sequential", "--resume", "--out", seq).rc == 0
    untimed = lambda table: sorted(({k: v for k, v in r.items() if k != "time"} for r in table),  # noqa: E731
                                   key=lambda r: r["idx"])
    assert untimed(read_rows(seq)[1]) == untimed(rows)
    tampered = [line.split("\t") for line in seq.read_text().splitlines()]
    column = tampered[0].index("radius")
    row = next(i for i, t in enumerate(tampered[1:], 1) if float(t[column]) > 0)
    written = tampered[row][column]
    tampered[row][column] = "1.0"
    seq.write_text("\n".join("\t".join(t) for t in tampered) + "\n")
    resumed = certify(capsys, *args, "--n", "1000", "--sequential", "--resume", "--out", seq)
    assert resumed.rc != 0 and f"has radius 1.0, its counts give {written}" in resumed.err
    tampered[row][column] = written  # the radius as written, the grid level edited: refused too
    grid = tampered[0].index("grid_radius")
    tampered[row][grid] = "0.750000"
    seq.write_text("\n".join("\t".join(t) for t in tampered) + "\n")
    resumed = certify(capsys, *args, "--n", "1000", "--sequential", "--resume", "--out", seq)
    assert resumed.rc != 0 and "has grid_radius 0.75, its counts give" in resumed.err


# --------------------------------------------------------------------------- classifiers that certify nothing


def _demo_state() -> tuple[dict[str, torch.Tensor], dict]:
    from safetensors import safe_open

    with safe_open(str(DEMO_CHECKPOINT), framework="pt") as handle:
        metadata = json.loads(handle.metadata()["dmae_fast"])
        state = {key: handle.get_tensor(key) for key in handle.keys()}
    return state, metadata


def _write_demo_variant(path: Path, state: dict[str, torch.Tensor] | None = None, **spec_changes) -> Path:
    """The demo classifier with some tensors or metadata fields replaced."""
    from safetensors.torch import save_file

    demo_state, metadata = _demo_state()
    encoder = {**metadata["encoder"], **spec_changes.pop("encoder", {})}
    save_file(state or demo_state, str(path), metadata={"dmae_fast": json.dumps({**metadata, **spec_changes,
                                                                                 "encoder": encoder})})
    return path


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("key", ["head.weight", "fc_norm.bias", "blocks.0.attn.qkv.weight"])
def test_non_finite_weights_are_refused_at_load(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                key: str, value: float) -> None:
    """Was: argmax 0 for every sample and a 'certified' radius for class 0, exit 0."""
    state, _ = _demo_state()
    state[key] = state[key].clone()
    state[key].view(-1)[3] = value
    path = _write_demo_variant(tmp_path / "bad.safetensors", state)
    assert_refused(capsys, tmp_path, ["--ckpt", str(path)], "NaN or infinite", key)


def test_non_finite_logits_at_run_time_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Finite weights whose logits overflow to inf: refused when the counts are read, no row written."""
    state, _ = _demo_state()
    state["head.weight"] = torch.full_like(state["head.weight"], 3e38)
    path = _write_demo_variant(tmp_path / "overflow.safetensors", state)
    out = tmp_path / "out.tsv"
    run = certify(capsys, *BASE, "--max", "2", "--ckpt", path, "--out", out)
    assert_error_during_run(run, "NaN or infinite logits", "image 0")
    assert out.read_text().splitlines() == ["\t".join(CERTIFY_HEAD + CERTIFY_EXTRA)]  # no certificate


@pytest.mark.parametrize(("changes", "mentions"), [
    ({"encoder": {"num_heads": 0}}, ["num_heads"]),  # was: ZeroDivisionError
    ({"encoder": {"patch_size": 0}}, ["patch_size"]),  # was: ZeroDivisionError
    ({"encoder": {"depth": "4"}}, ["depth"]),
    ({"encoder": {"mlp_ratio": float("nan")}}, ["mlp_ratio"]),
    ({"sigma": 0.0}, ["sigma"]),  # was: radius-0 rows, exit 0
    ({"sigma": -0.25}, ["sigma"]),  # was: bad rows, then a crash reading them back
    ({"sigma": float("nan")}, ["sigma"]),
    ({"sigma": 1e308}, ["sigma"]),
    ({"sigma": "0.25"}, ["sigma"]),
    ({"class_names": ["a", "b"]}, ["2 class_names for 10 classes"]),  # was: accepted
    ({"num_classes": 0}, ["num_classes"]),
    ({"input_size": 0}, ["input size"]),
    ({"mean": [0.5, 0.5]}, ["normalization"]),
    ({"std": [0.2, 0.0, 0.2]}, ["normalization"]),
    ({"pool": "max"}, ["pool"]),
])
def test_bad_checkpoint_metadata(tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict,
                                 mentions: list[str]) -> None:
    path = _write_demo_variant(tmp_path / "meta.safetensors", **changes)
    assert_refused(capsys, tmp_path, ["--ckpt", str(path)], str(path), *mentions)


def test_state_dict_without_blocks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Was: ValueError traceback (max() of nothing)."""
    state, _ = _demo_state()
    torch.save({k: v for k, v in state.items() if not k.startswith("blocks.")}, tmp_path / "noblocks.pth")
    assert_refused(capsys, tmp_path, ["--ckpt", str(tmp_path / "noblocks.pth")], "blocks.N")


@pytest.mark.parametrize("key", ["pos_embed", "patch_embed.proj.weight"])
def test_tensor_of_the_wrong_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str) -> None:
    state, _ = _demo_state()
    state[key] = state[key].flatten()
    torch.save(state, tmp_path / "flat.pth")
    assert_refused(capsys, tmp_path, ["--ckpt", str(tmp_path / "flat.pth")], key, "dimensions")


# --------------------------------------------------------------------------- the disk fails under the run


@pytest.mark.parametrize(("target", "error"), [
    ("os.fsync", OSError(28, "No space left on device")),  # a full disk while rows are written
    ("pathlib.Path.write_text", PermissionError(1, "Operation not permitted", "run.tsv.json")),  # immutable dir
])
def test_disk_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch, target: str, error: OSError) -> None:
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(target, fail)
    run = certify(capsys, *BASE, "--max", "2", "--out", tmp_path / "run.tsv")
    assert_error_during_run(run, error.strerror)


# --------------------------------------------------------------------------- one-liners that say what is wrong


def test_a_text_file_as_pth_says_it_is_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Was: 'pop from empty list' (torch.load's own message)."""
    text = tmp_path / "notes.pth"
    text.write_text("these are my notes\n")
    assert_refused(capsys, tmp_path, ["--ckpt", str(text)], "not a PyTorch checkpoint")


def test_a_safetensors_file_named_pth_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    renamed = tmp_path / "model.pth"
    renamed.write_bytes(DEMO_CHECKPOINT.read_bytes())
    assert_refused(capsys, tmp_path, ["--ckpt", str(renamed)], "name it .safetensors")


def test_an_unreadable_checkpoint_says_permission(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: 'No such file or directory'. Root ignores permission bits, so os.access is faked."""
    path = tiny_checkpoint(tmp_path / "locked.safetensors")
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == path else real(p, mode))
    assert_refused(capsys, tmp_path, ["--ckpt", str(path)], "not readable")


def test_a_directory_as_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model.pth").mkdir()
    assert_refused(capsys, tmp_path, ["--ckpt", str(tmp_path / "model.pth")], "is not a file")


# Per console script (its entry in dmae_fast.cli.entry): its and its subcommands' --help, an option
# argparse refuses and, mostly, a value the command's configuration refuses before running.
QUICK_ANSWERS = [
    ("certify", ["--help"]), ("certify", ["--data", "demo", "--seed", "0", "--n", "abc"]),
    ("certify", ["--data", "demo", "--seed", "0", "--n", "-5"]),
    ("serve", ["--help"]), ("serve", ["--ckpt", "demo", "--precision", "fp64"]),
    ("serve", ["--ckpt", "demo", "--port", "-1"]),
    ("serve", ["replay", "--help"]), ("serve", ["replay", "answer.json", "digit.png"]),
    ("export", ["--help"]), ("export", ["--ckpt", "demo", "--format", "tflite"]),
    ("export", ["--ckpt", "demo", "--parity-samples", "0"]),
    ("bench", ["--help"]), ("bench", ["thruput"]), ("bench", ["throughput", "--models", "vit-h14"]),
    ("bench", ["cpu", "--help"]), ("bench", ["cpu", "--rounds", "x"]),
    ("bench", ["serve", "--help"]), ("bench", ["serve", "--n", "0"]),
    ("bench", ["scaling", "--help"]), ("bench", ["scaling", "--procs", "0"]),
    ("bench", ["stall", "--help"]), ("bench", ["stall", "--batch-ms", "0"]),
    ("train", ["--help"]), ("train", ["pretrain", "--help"]), ("train", ["finetune", "--help"]),
    ("train", ["linprobe", "--help"]), ("train", ["visualize", "--help"]), ("train", ["presets"]),
    ("train", ["pretrain", "--epochs", "3"]), ("train", ["pretrian"]),
]
HEAVY_MODULES = ("torch", "timm", "numpy", "scipy", "statsmodels", "onnx", "onnxruntime", "openvino", "tensorrt",
                 "uvicorn", "starlette")


@pytest.mark.parametrize("command, argv", QUICK_ANSWERS, ids=[" ".join([c, *a]) for c, a in QUICK_ANSWERS])
def test_help_and_option_errors_answer_without_importing_torch(command: str, argv: list[str]) -> None:
    """What makes them quick (~0.1 s instead of ~5 s): torch, numpy, the engine runtimes and the
    HTTP server are never loaded."""
    code = ("import sys\nfrom dmae_fast.cli import entry\n"
            f"try:\n    status = entry.{command}()\nexcept SystemExit as stop:\n    status = stop.code\n"
            f"heavy = sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules)\n"
            "print('HEAVY', heavy, status)\n")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=900)
    assert "HEAVY [] " in done.stdout, (done.stdout, done.stderr[-500:])
    assert done.stdout.strip().endswith("0" if argv[-1] in ("--help", "presets") else "2"), done.stderr[-500:]
