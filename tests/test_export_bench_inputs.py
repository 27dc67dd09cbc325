"""Bad input to ``dmae-export`` and ``dmae-bench`` (and the bench helpers): one line
``prog: error: ...``, exit 2, before any slow work starts, and no file of the user's
replaced. Cases marked "was:" failed differently before they were fixed."""

from __future__ import annotations

import errno
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from dmae_fast.bench import report, suite
from dmae_fast.bench import train_throughput as train_bench
from dmae_fast.bench.command import main as bench_main
from dmae_fast.bench.compare_counts import main as compare_main
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines.sidecar import sidecar_path
from dmae_fast.export import ExportConfig, export_engines, pipeline
from dmae_fast.export.command import main as export_main
from dmae_fast.model.checkpoints import load_classifier
from dmae_fast.model.config import DecoderConfig
from dmae_fast.model.dmae import DMAEPretrain


@pytest.fixture(autouse=True)
def no_timing(monkeypatch):
    """Every bad input here must be refused before a benchmark starts timing."""
    monkeypatch.setattr(suite, "matmul_peak", lambda *a, **k: pytest.fail("timing started"))
    monkeypatch.setattr(train_bench, "measure", lambda *a, **k: pytest.fail("timing started"))


def refused(capsys, main, prog: str, args: list[str], *mentions: str) -> str:
    capsys.readouterr()
    assert main([str(a) for a in args]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:") and "Traceback" not in err, err
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])
    return lines[0]


def ids(cases) -> list[str]:
    return [" ".join(args) or "(none)" for args, *_ in cases]


def read_only(monkeypatch, directory: Path) -> None:
    """Writing in ``directory`` fails as on a read-only mount (root ignores permission bits)."""
    real = tempfile.TemporaryFile

    def probe(*args, **kwargs):
        if Path(kwargs.get("dir", "")) == directory:
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", probe)


# --------------------------------------------------------------------------- dmae-export: options

EXPORT_CASES = [
    (["--batch", "0:1:2"], ["1 <= min <= opt <= max"]),
    (["--batch", "5:1:2"], ["1 <= min <= opt <= max"]),
    (["--batch", "-3"], ["1 <= min <= opt <= max"]),
    (["--batch", "x"], ["--batch"]),
    (["--batch", "1.5"], ["--batch"]),
    (["--batch", "1:2:3:4"], ["--batch"]),
    (["--batch", f"1:2:{10**20}"], ["--batch", "2**31 - 1"]),  # was: accepted; a .pt2 traceback after compiling
    (["--parity-samples", "0"], ["--parity-samples"]),
    (["--parity-samples", "-5"], ["--parity-samples"]),
    (["--parity-samples", "nan"], ["--parity-samples"]),
    (["--parity-samples", str(10**12)], ["--parity-samples"]),  # was: traceback (8 TB of inputs allocated)
    (["--seed", "-1"], ["--seed"]),
    (["--seed", str(2**70)], ["--seed"]),
    (["--seed", "1.5"], ["--seed"]),
    (["--input-size", "0"], ["input size"]),
    (["--input-size", "-4"], ["input size"]),
    (["--input-size", "1000000"], ["--input-size", "4096"]),  # was: traceback (a 10^6 x 10^6 resize matrix)
    (["--normalize", "nan,1,1:1,1,1"], ["normalization"]),
    (["--normalize", "1,1:1,1"], ["normalization"]),
    (["--normalize", "0.5,0.5,0.5:0,1,1"], ["normalization"]),
    (["--normalize", "0.5,0.5,0.5:inf,1,1"], ["normalization"]),
    (["--normalize", "a:b"], ["--normalize"]),
    (["--normalize", "cifar100"], ["--normalize"]),
    (["--device", "bogus"], ["--device", "auto, cpu, cuda or cuda:N"]),
    (["--device", "cuda:-1"], ["--device", "auto, cpu, cuda or cuda:N"]),
    (["--device", "meta"], ["--device", "auto, cpu, cuda or cuda:N"]),  # was: accepted
    (["--device", "mps"], ["--device", "auto, cpu, cuda or cuda:N"]),  # was: traceback
    (["--device", "cpu:3"], ["--device", "auto, cpu, cuda or cuda:N"]),  # was: accepted
    (["--format", "tensorrt"], ["TensorRT"]),
    (["--format", "zip"], ["--format"]),
    (["--precision", "bf16"], ["bf16"]),
    (["--precision", "bf16", "--format", "all"], ["bf16", "--format onnx"]),
    (["--precision", "int8"], ["--precision"]),
    (["--fp16", "--precision", "fp16"], ["not allowed with"]),
    (["--input", "pixels"], ["--input"]),
    (["--name", "a/b"], ["--name"]),
    (["--name", ""], ["--name"]),
    (["--name", "."], ["--name"]),  # was: accepted, wrote the hidden file '..onnx'
    (["--name", ".."], ["--name"]),
    (["--out", ""], ["--out"]),  # was: accepted, wrote into the working directory
    (["--timing-cache", "t.cache"], ["--timing-cache", "tensorrt"]),  # was: silently ignored
    (["--timing-cache", ""], ["--timing-cache"]),
    (["--bogus"], ["unrecognized"]),
]


@pytest.mark.parametrize(("args", "mentions"), EXPORT_CASES, ids=ids(EXPORT_CASES))
def test_bad_export_options(tmp_path, capsys, monkeypatch, args, mentions):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pipeline, "_export_one", lambda *a, **k: pytest.fail("export started"))
    refused(capsys, export_main, "dmae-export", ["--ckpt", "demo", "--out", tmp_path, *args], *mentions)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- dmae-export: checkpoints


@pytest.fixture(scope="module")
def bad_checkpoints(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("checkpoints")
    demo = load_classifier(DEMO_CHECKPOINT)
    (folder / "notes.pth").write_text("notes\n")
    (folder / "empty.pth").write_bytes(b"")
    data = DEMO_CHECKPOINT.read_bytes()
    (folder / "truncated.safetensors").write_bytes(data[: len(data) // 2])
    torch.save(demo.state_dict(), folder / "whole.pth")
    (folder / "truncated.pth").write_bytes((folder / "whole.pth").read_bytes()[:50_000])
    torch.save(DMAEPretrain(demo.spec.encoder, DecoderConfig(32, 1)).state_dict(), folder / "pretrain.pth")
    encoder = {k: v for k, v in demo.state_dict().items() if not k.startswith(("head", "fc_norm"))}
    torch.save(encoder, folder / "encoder.pth")
    (folder / "a-directory").mkdir()
    return folder


CHECKPOINT_CASES = [
    ("missing.pth", "does not exist"),
    ("a-directory", "not a file"),
    ("notes.pth", "not a PyTorch checkpoint"),
    ("empty.pth", "not a PyTorch checkpoint"),
    ("truncated.safetensors", "cannot read"),
    ("truncated.pth", "cannot read"),
    ("whole.pth", "attention heads"),  # a bare state dict of a non-standard width
    ("pretrain.pth", "pre-training"),
    ("encoder.pth", "no classification head"),
]


@pytest.mark.parametrize(("name", "mention"), CHECKPOINT_CASES, ids=[c[0] for c in CHECKPOINT_CASES])
def test_bad_export_checkpoints(tmp_path, capsys, bad_checkpoints, name, mention):
    refused(capsys, export_main, "dmae-export", ["--ckpt", bad_checkpoints / name, "--out", tmp_path / "out"],
            name, mention)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- dmae-export: outputs


def test_export_out_that_is_a_file_or_under_one(tmp_path, capsys):
    notes = tmp_path / "notes.pth"
    notes.write_text("notes\n")
    refused(capsys, export_main, "dmae-export", ["--ckpt", "demo", "--out", notes], "is a file")
    refused(capsys, export_main, "dmae-export", ["--ckpt", "demo", "--out", notes / "sub"],
            "cannot create", "is a file")
    assert notes.read_text() == "notes\n"


def test_export_read_only_out_fails_before_any_export(tmp_path, capsys, monkeypatch):
    """Was: the export traced (or compiled, for minutes) first, then failed writing."""
    read_only(monkeypatch, tmp_path)
    monkeypatch.setattr(pipeline, "_export_one", lambda *a, **k: pytest.fail("export started"))
    refused(capsys, export_main, "dmae-export", ["--ckpt", "demo", "--out", tmp_path],
            "cannot write in --out", "Read-only")


@pytest.mark.parametrize("existing", ["m.onnx", "m.onnx.json"])
def test_export_never_replaces_a_file_without_overwrite(tmp_path, capsys, existing):
    (tmp_path / existing).write_bytes(b"the user's file")
    refused(capsys, export_main, "dmae-export", ["--ckpt", "demo", "--out", tmp_path, "--name", "m"],
            existing, "exists", "--overwrite")
    assert (tmp_path / existing).read_bytes() == b"the user's file"
    assert [p.name for p in tmp_path.iterdir()] == [existing]


def test_token_export_never_replaces_a_front_end_without_overwrite(tmp_path, capsys):
    front = tmp_path / "m.onnx.frontend.safetensors"
    front.write_bytes(b"the user's file")
    refused(capsys, export_main, "dmae-export",
            ["--ckpt", "demo", "--out", tmp_path, "--name", "m", "--input", "tokens"], front.name, "exists")
    assert front.read_bytes() == b"the user's file"


@pytest.mark.parametrize("directory", ["m.onnx", "m.onnx.json"])
def test_export_refuses_directories_in_the_way_even_with_overwrite(tmp_path, capsys, directory):
    """Was: --overwrite exported first, then failed on the directory, leaving m.partial.onnx
    behind (engine) or an engine without its sidecar (sidecar)."""
    (tmp_path / directory).mkdir()
    refused(capsys, export_main, "dmae-export",
            ["--ckpt", "demo", "--out", tmp_path, "--name", "m", "--overwrite", "--parity-samples", "20"],
            directory, "is a directory")
    assert [p.name for p in tmp_path.iterdir()] == [directory]


def test_export_never_replaces_its_own_checkpoint(tmp_path, capsys):
    """Was: with --overwrite, a checkpoint named like the engine (model.onnx holding torch.save
    output) was replaced by the engine."""
    ckpt = tmp_path / "model.onnx"
    state = load_classifier(DEMO_CHECKPOINT).state_dict()
    torch.save({"model": state, "args": {"model": "vit_large_patch2"}}, ckpt)
    before = ckpt.read_bytes()
    for extra in ([], ["--overwrite"]):
        refused(capsys, export_main, "dmae-export",
                ["--ckpt", ckpt, "--out", tmp_path, "--parity-samples", "20", *extra], "is the checkpoint")
    assert ckpt.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


@pytest.mark.parametrize("case", ["directory", "no-parent", "checkpoint"])
def test_bad_timing_cache(tmp_path, capsys, case):
    """Was: found only after the TensorRT build (a directory), or the checkpoint overwritten."""
    ckpt = tmp_path / "model.safetensors"
    shutil.copy(DEMO_CHECKPOINT, ckpt)
    cache = {"directory": tmp_path, "no-parent": tmp_path / "none" / "t.cache", "checkpoint": ckpt}[case]
    refused(capsys, export_main, "dmae-export",
            ["--ckpt", ckpt, "--out", tmp_path / "out", "--format", "tensorrt", "--timing-cache", cache],
            "--timing-cache")
    assert ckpt.read_bytes() == DEMO_CHECKPOINT.read_bytes() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("input_kind", "failing"), [("image", "write_sidecar"), ("tokens", "write_front_end")])
def test_failed_commit_leaves_the_previous_export_intact(tmp_path, capsys, monkeypatch, input_kind, failing):
    """Was: the new engine replaced the old one before the sidecar (front end) was written, so a
    full disk left the new engine beside the previous export's sidecar (front end)."""
    base = ["--ckpt", "demo", "--out", tmp_path, "--name", "m", "--input", input_kind, "--parity-samples", "20"]
    assert export_main([str(a) for a in base]) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pipeline, failing, full_disk)
    refused(capsys, export_main, "dmae-export", [*base, "--fp16", "--overwrite"], "No space left")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no partial or scratch files either


# --------------------------------------------------------------------------- dmae-bench: options

BENCH_CASES = [
    (["--seconds", "0"], ["--seconds"]),
    (["--seconds", "-1"], ["--seconds"]),
    (["--seconds", "nan"], ["--seconds"]),
    (["--seconds", "inf"], ["--seconds"]),
    (["--seconds", "1e300"], ["--seconds", "--budget"]),  # was: accepted, every row skipped
    (["--seconds", "x"], ["--seconds"]),
    (["--budget", "-1"], ["--budget"]),
    (["--budget", "inf"], ["--budget"]),
    (["--budget", "1"], ["--reference-budget", "--budget"]),  # was: accepted, nothing timed
    (["--reference-budget", "nan"], ["--reference-budget"]),
    (["--compile-mode", "weird"], ["--compile-mode"]),
    (["--images", "0"], ["--images"]),
    (["--images", str(10**14)], ["--images"]),  # was: accepted (10^14 images drawn)
    (["--n", "0"], ["--n"]),
    (["--n", str(10**23)], ["--n"]),  # was: accepted (a reference loop that never ends)
    (["--n0", "-1"], ["--n0"]),
    (["--n0", str(2**32)], ["--n0"]),
    (["--batches", "0"], ["batch sizes"]),
    (["--batches", "16", str(10**23)], ["batch sizes"]),  # was: accepted
    (["--main-batch", "0"], ["batch sizes"]),
    (["--main-batch", str(10**14)], ["batch sizes"]),  # was: accepted
    (["--models", "vit-x"], ["unknown model"]),
    (["--certify-model", "nosuch"], ["unknown model"]),
    (["--export-models", "nosuch"], ["unknown model"]),
    (["--device", "bogus"], ["--device", "auto, cpu, cuda or cuda:N"]),
    (["--device", "meta"], ["--device"]),  # was: accepted
    (["--device", "mps"], ["--device"]),  # was: accepted
    (["--device", "cpu:2"], ["--device"]),  # was: accepted
    (["--out", ""], ["--out"]),  # was: accepted, wrote into the working directory
    (["--engine-dir", ""], ["--engine-dir"]),
    (["--export-models", "--engine-dir", "engines"], ["--engine-dir", "--export-models"]),  # was: ignored
    (["--all"], ["choose one of"]),
    (["certify"], ["choose one of"]),
]


@pytest.mark.parametrize(("args", "mentions"), BENCH_CASES, ids=ids(BENCH_CASES))
def test_bad_bench_options(tmp_path, capsys, monkeypatch, args, mentions):
    monkeypatch.chdir(tmp_path)
    refused(capsys, bench_main, "dmae-bench", ["--smoke", "--out", tmp_path, *args], *mentions)
    assert list(tmp_path.iterdir()) == []


COMMAND_CASES = [  # options the chosen stage never reads; was: silently ignored
    (["certify", "--engines", "m.onnx"], "--engines"),
    (["certify", "--models", "demo"], "--models"),
    (["certify", "--batches", "16"], "--batches"),
    (["certify", "--main-batch", "16"], "--main-batch"),
    (["certify", "--seconds", "1"], "--seconds"),
    (["certify", "--export-models", "demo"], "--export-models"),
    (["certify", "--engine-dir", "engines"], "--engine-dir"),
    (["throughput", "--certify-model", "demo"], "--certify-model"),
    (["throughput", "--images", "3"], "--images"),
    (["throughput", "--n0", "5"], "--n0"),
    (["throughput", "--n", "5"], "--n"),
    (["throughput", "--reference-budget", "5"], "--reference-budget"),
    ([], "choose one of"),
    (["--smoke", "--all"], "choose one of"),
    (["--smoke", "certify"], "choose one of"),
    (["nosuch"], "invalid choice"),
]


@pytest.mark.parametrize(("args", "mention"), COMMAND_CASES, ids=ids(COMMAND_CASES))
def test_bench_options_the_run_would_ignore(tmp_path, capsys, args, mention):
    refused(capsys, bench_main, "dmae-bench", [*args, "--out", tmp_path], mention)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- dmae-bench: engine files


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A demo image engine and a token engine (ONNX, fp32), to be copied and spoiled."""
    folder = tmp_path_factory.mktemp("engines")
    for kind in ("image", "tokens"):
        export_engines(ExportConfig("demo", str(folder), ("onnx",), input=kind, name=kind, parity_samples=20, seed=0,
                                    device="cpu"), report=lambda line: None)
    return folder


def _engine(folder: Path, exported: Path, name: str, source: str = "image", sidecar=None) -> Path:
    """``folder/name``: a copy of an exported engine with ``sidecar(data)`` as its sidecar
    (None: a faithful one for ``name``; "none": no sidecar; bytes: those bytes)."""
    engine = folder / name
    shutil.copy(exported / f"{source}.onnx", engine)
    data = json.loads(sidecar_path(exported / f"{source}.onnx").read_text())
    data["file"] = name
    if sidecar == "none":
        return engine
    if isinstance(sidecar, bytes):
        sidecar_path(engine).write_bytes(sidecar)
    else:
        sidecar_path(engine).write_text(json.dumps(sidecar(data) if sidecar else data))
    return engine


def _spoil(**fields):
    return lambda data: {**data, **fields}


ENGINE_CASES = [  # (file name, how it is made, what the one line says)
    ("missing.onnx", None, "does not exist"),
    ("notes.pth", "notes", "not an engine file"),
    ("model.safetensors", "checkpoint", "not an engine file"),  # was: timed as if it were an engine
    ("folder.onnx", "directory", "not a file"),
    ("nosidecar.onnx", {"sidecar": "none"}, "no sidecar"),
    ("badjson.onnx", {"sidecar": b"{not json"}, "not valid JSON"),
    ("binary.onnx", {"sidecar": b"\xff\xfe"}, "not valid JSON"),
    ("list.onnx", {"sidecar": lambda data: []}, "not a JSON object"),
    ("other.onnx", {"sidecar": _spoil(file="image.onnx")}, "describes 'image.onnx'"),
    ("kind.pt2", {}, "kind 'onnx'"),
    ("format.onnx", {"sidecar": _spoil(format="other/1")}, "not a dmae-fast engine sidecar"),
    ("missingfield.onnx", {"sidecar": lambda d: {k: v for k, v in d.items() if k != "batch"}}, "missing field"),
    ("batch.onnx", {"sidecar": _spoil(batch={"min": 0, "opt": 1, "max": 2})}, "1 <= min"),
    ("batchtype.onnx", {"sidecar": _spoil(batch={"min": "1", "opt": 1, "max": 2})}, "malformed field"),
    ("classes.onnx", {"sidecar": _spoil(num_classes=11)}, "num_classes 11"),
    ("shape.onnx", {"sidecar": _spoil(input_shape=[3, 9, 9])}, "input_shape"),
    ("precision.onnx", {"sidecar": _spoil(precision="fp16")}, "disagree"),  # sidecar of another engine
    ("truncated.onnx", "truncated", "SHA-256 differs"),  # the sidecar records the hash (no hash: test_engines)
]


@pytest.mark.parametrize(("name", "make", "mention"), ENGINE_CASES, ids=[c[0] for c in ENGINE_CASES])
def test_bad_engine_files_fail_before_any_timing(tmp_path, capsys, exported, name, make, mention):
    """Was (at first): a missing --engines file failed only after the throughput rows."""
    path = tmp_path / name
    if make == "notes":
        path.write_text("notes\n")
    elif make == "checkpoint":
        shutil.copy(DEMO_CHECKPOINT, path)
    elif make == "directory":
        path.mkdir()
    elif make == "truncated":
        _engine(tmp_path, exported, name)
        path.write_bytes(path.read_bytes()[:1000])
    elif isinstance(make, dict):
        _engine(tmp_path, exported, name, **make)
    refused(capsys, bench_main, "dmae-bench", ["--smoke", "--out", tmp_path / "out", "--engines", path],
            name, mention)
    assert not (tmp_path / "out").exists()


def test_token_engine_gets_a_bench_message(tmp_path, capsys, exported):
    """Was: 'dmae-certify needs an image engine ... or --fused', about another command."""
    engine = _engine(tmp_path, exported, "tok.onnx", source="tokens")
    line = refused(capsys, bench_main, "dmae-bench", ["--smoke", "--out", tmp_path / "out", "--engines", engine],
                   "tok.onnx", "token-input", "dmae-bench times image-input engines")
    assert "dmae-certify" not in line and "--fused" not in line


# --------------------------------------------------------------------------- dmae-bench: outputs


def test_bench_out_that_is_a_file_or_under_one(tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.write_text("mine\n")
    refused(capsys, bench_main, "dmae-bench", ["--smoke", "--out", notes], "is a file")
    refused(capsys, bench_main, "dmae-bench", ["--smoke", "--out", tmp_path / "new", "--engine-dir", notes],
            "--engine-dir", "is a file")
    assert notes.read_text() == "mine\n" and not (tmp_path / "new").exists()


def test_bench_out_under_a_file_fails_before_any_timing(tmp_path, capsys):
    """Was: found when the first results were saved, after the first model's rows."""
    (tmp_path / "notes").write_text("mine\n")
    refused(capsys, bench_main, "dmae-bench", ["--smoke", "--out", tmp_path / "notes" / "sub"],
            "cannot create --out", "is a file")


@pytest.mark.parametrize("option", ["--out", "--engine-dir"])
def test_bench_read_only_output_fails_before_any_timing(tmp_path, capsys, monkeypatch, option):
    """Was: the run timed for minutes, then failed saving (--out) or exporting (--engine-dir)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    read_only(monkeypatch, locked)
    out = locked if option == "--out" else tmp_path / "out"
    refused(capsys, bench_main, "dmae-bench", ["--smoke", "--out", out, "--engine-dir", locked],
            f"cannot write in {option}", "Read-only")


def test_result_stem_skips_any_earlier_file(tmp_path):
    """Was: only <stem>.json was looked at; a lone <stem>.md or .png was overwritten, and an
    existing <stem>-engines folder (elsewhere, --engine-dir) reused."""
    cpu = torch.device("cpu")
    stem = report.result_stem(tmp_path, cpu, "")
    (tmp_path / f"{stem}.md").write_text("the user's notes")
    assert report.result_stem(tmp_path, cpu, "") == f"{stem}-2"
    engines = tmp_path / "engines"
    (engines / f"{stem}-2-engines").mkdir(parents=True)
    assert report.result_stem(tmp_path, cpu, "", engines) == f"{stem}-3"


# --------------------------------------------------------------------------- the bench helpers

TRAIN_CASES = [
    (["--seconds", "nan"], "--seconds"),  # was: timed forever (nothing compares >= NaN)
    (["--seconds", "inf"], "--seconds"),  # was: timed forever
    (["--seconds", "0"], "--seconds"),
    (["--batch", "0"], "--batch"),
    (["--batch", str(10**9)], "--batch"),  # was: traceback (memory)
    (["--device", "meta"], "--device"),  # was: accepted
    (["--precision", "int8"], "--precision"),
    (["--preset", "demo-finetune"], "dmae-train finetune"),
]


@pytest.mark.parametrize(("args", "mention"), TRAIN_CASES, ids=ids(TRAIN_CASES))
def test_bad_pretraining_throughput_options(tmp_path, capsys, args, mention):
    refused(capsys, train_bench.main, "dmae-bench-train",
            ["--out", tmp_path, "--preset", "demo-pretrain", "--device", "cpu", *args], mention)
    assert list(tmp_path.iterdir()) == []


def test_pretraining_throughput_checks_out_before_timing(tmp_path, capsys):
    """Was: --out being a file was found after the timed steps."""
    notes = tmp_path / "notes"
    notes.write_text("mine\n")
    refused(capsys, train_bench.main, "dmae-bench-train",
            ["--out", notes, "--preset", "demo-pretrain", "--device", "cpu"], "is a file")
    assert notes.read_text() == "mine\n"


def test_compare_counts_bad_files(tmp_path, capsys):
    good = tmp_path / "a.tsv"
    good.write_text("idx\tlabel\ttime\n0\t1\t0.5\n")
    binary = tmp_path / "b.tsv"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    refused(capsys, compare_main, "compare_counts", [good, binary], "b.tsv", "not UTF-8")  # was: traceback
    refused(capsys, compare_main, "compare_counts", [good, tmp_path], "is not a file")
    refused(capsys, compare_main, "compare_counts", [good, tmp_path / "none.tsv"], "does not exist")
