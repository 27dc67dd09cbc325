"""Bad input to ``dmae-export`` and ``dmae-bench``: one line ``prog: error: ...``, exit 2,
before any work starts, and no file of the user's replaced."""

from __future__ import annotations

import pytest

from dmae_fast.cli import bench as bench_cli
from dmae_fast.cli.bench import main as bench_main
from dmae_fast.cli.export import main as export_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def refused(capsys, main, prog: str, args: list[str], *mentions: str) -> str:
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:") and "Traceback" not in err, err
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])
    return lines[0]


EXPORT_CASES = [
    (["--batch", "0:1:2"], ["1 <= min <= opt <= max"]),
    (["--batch", "5:1:2"], ["1 <= min <= opt <= max"]),
    (["--batch", "x"], ["--batch"]),
    (["--parity-samples", "0"], ["--parity-samples"]),
    (["--parity-samples", "-5"], ["--parity-samples"]),
    (["--seed", "-1"], ["--seed"]),
    (["--seed", str(2**70)], ["--seed"]),
    (["--input-size", "0"], ["input size"]),
    (["--normalize", "nan,1,1:1,1,1"], ["normalization"]),
    (["--device", "bogus"], ["unknown device"]),
    (["--format", "tensorrt"], ["TensorRT"]),
    (["--precision", "bf16"], ["bf16"]),
    (["--name", "a/b"], ["--name"]),
    (["--name", ""], ["--name"]),
    (["--format", "zip"], ["--format"]),
]


@pytest.mark.parametrize(("args", "mentions"), EXPORT_CASES, ids=[" ".join(a) for a, _ in EXPORT_CASES])
def test_bad_export_options(tmp_path, capsys, args, mentions):
    refused(capsys, export_main, "dmae-export", ["--ckpt", "demo", "--out", str(tmp_path), *args], *mentions)
    assert list(tmp_path.iterdir()) == []


def test_bad_export_checkpoints_and_outputs(tmp_path, capsys):
    notes = tmp_path / "notes.pth"
    notes.write_text("notes\n")
    refused(capsys, export_main, "dmae-export", ["--ckpt", str(notes), "--out", str(tmp_path)], "not a PyTorch")
    refused(capsys, export_main, "dmae-export", ["--ckpt", str(tmp_path / "none.pth")], "does not exist")
    refused(capsys, export_main, "dmae-export", ["--ckpt", "demo", "--out", str(notes)], "is a file")
    assert notes.read_text() == "notes\n"


def test_export_never_replaces_an_engine_without_overwrite(tmp_path, capsys):
    engine = tmp_path / "demo-digits-vit.onnx"
    engine.write_bytes(b"the user's engine")
    refused(capsys, export_main, "dmae-export", ["--ckpt", "demo", "--out", str(tmp_path)], "exists", "--overwrite")
    assert engine.read_bytes() == b"the user's engine"


BENCH_CASES = [
    (["--seconds", "0"], ["--seconds"]),
    (["--seconds", "nan"], ["--seconds"]),
    (["--seconds", "inf"], ["--seconds"]),  # was: accepted (a row timed forever)
    (["--budget", "-1"], ["--budget"]),
    (["--reference-budget", "nan"], ["--reference-budget"]),  # was: accepted
    (["--compile-mode", "weird"], ["--compile-mode"]),  # was: accepted, the run went on
    (["--images", "0"], ["--images"]),
    (["--n", "0"], ["--n"]),
    (["--n0", "-1"], ["--n0"]),
    (["--batches", "0"], ["batch sizes"]),
    (["--main-batch", "0"], ["batch sizes"]),
    (["--device", "bogus"], ["unknown device"]),
    (["--export-models", "nosuch"], ["unknown model"]),
]


@pytest.mark.parametrize(("args", "mentions"), BENCH_CASES, ids=[" ".join(a) for a, _ in BENCH_CASES])
def test_bad_bench_options(tmp_path, capsys, args, mentions):
    refused(capsys, bench_main, "dmae-bench", ["--smoke", "--out", str(tmp_path), *args], *mentions)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["missing.onnx", "notes.pth", "nosidecar.onnx"])
def test_bad_engine_files_fail_before_any_timing(tmp_path, capsys, monkeypatch, kind):
    """Was: a missing --engines file failed only after the throughput rows (~46 s)."""
    monkeypatch.setattr(bench_cli, "matmul_peak", lambda *a, **k: pytest.fail("timing started"))
    if kind == "notes.pth":
        (tmp_path / kind).write_text("notes\n")
    if kind == "nosidecar.onnx":
        (tmp_path / kind).write_bytes(b"onnx?")
    refused(capsys, bench_main, "dmae-bench", ["--smoke", "--out", str(tmp_path / "out"),
                                               "--engines", str(tmp_path / kind)], kind)
    assert not (tmp_path / "out").exists()


def test_bench_out_that_is_a_file(tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.write_text("mine\n")
    refused(capsys, bench_main, "dmae-bench", ["--smoke", "--out", str(notes)], "is a file")
    assert notes.read_text() == "mine\n"
