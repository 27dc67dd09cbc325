"""dmae-bench: the FLOPs formula, the reference loops, and a CPU smoke run (nothing about speed)."""

import json
import math
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import torch

if not torch.cuda.is_available():  # the fused kernel runs in Triton's interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from dmae_fast.bench import report  # noqa: E402
from dmae_fast.bench.flops import vit_forward_flops  # noqa: E402
from dmae_fast.bench.reference_loops import COHEN, DMAE  # noqa: E402
from dmae_fast.bench.suite import SEQUENTIAL_IMAGES  # noqa: E402
from dmae_fast.bench.throughput import MODEL_SPECS, build_model  # noqa: E402
from dmae_fast.cli.bench import main  # noqa: E402


@pytest.mark.parametrize("name,gflop", [("vit-b16", 35.1), ("vit-l16", 123.1)])
def test_flops_formula_matches_the_published_counts(name, gflop):
    assert vit_forward_flops(MODEL_SPECS[name]) / 1e9 == pytest.approx(gflop, rel=0.01)


@pytest.mark.parametrize("loop", [COHEN, DMAE])
def test_reference_loops_count_every_sample(loop):
    model = build_model("tiny-cpu", torch.device("cpu"))
    counts = loop.counts(model, torch.rand(3, 16, 16), 450, 0.25)  # more than one batch of Cohen's 400
    assert counts.shape == (10,) and counts.sum() == 450


def test_cli_refuses_ambiguous_or_missing_commands(capsys, tmp_path):
    assert main(["--out", str(tmp_path)]) == 2
    assert main(["--smoke", "--all", "--out", str(tmp_path)]) == 2
    assert main(["--smoke", "--models", "vit-x", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("dmae-bench: error:") == 3 and "Traceback" not in err


def test_smoke_run_writes_json_markdown_and_plot(tmp_path, capsys):
    out = tmp_path / "results"
    argv = ["--smoke", "--out", str(out), "--models", "tiny-cpu", "--batches", "16", "--seconds", "0.1",
            "--engine-dir", str(tmp_path / "engines")]
    assert main(argv) == 0
    stems = {p.stem for p in out.iterdir()}
    assert len(stems) == 1 and {p.suffix for p in out.iterdir()} == {".json", ".md", ".png"}
    engine_folder = tmp_path / "engines" / f"{stems.pop()}-engines"
    record = json.loads(next(out.glob("*.json")).read_text())
    assert record["device"] and record["versions"]["torch"] and record["matmul_peak_flops"]["fp32"] > 0
    rows = {(r["variant"], r["batch"]): r for r in record["throughput"]}
    for key in [("reference: Cohen et al.", 400), ("reference: DMAE", 1000), ("ours: eager", 32),
                ("ours: fused", 32), ("ours: fused", 16)]:
        assert rows[key]["status"] == "ok" and rows[key]["samples_per_s"] > 0 and rows[key]["mfu"] > 0
    assert rows[("reference: Cohen et al.", 400)]["vs_cohen"] == pytest.approx(1.0)
    assert rows[("ours: fused + CUDA graphs", 32)]["status"] == "skipped: needs CUDA"
    for key in [("engine: ONNX image", 32), ("ours: fused + ONNX tokens", 32)]:  # exported by the run itself
        assert rows[key]["status"] == "ok" and rows[key]["samples_per_s"] > 0 and rows[key]["vs_cohen"] > 0
    engines = {e["engine"]: e for e in record["engines"]}
    assert set(engines) == {"ONNX image", "ONNX tokens"}
    for entry in engines.values():
        assert entry["status"] == "ok" and entry["parity"]["top1_agreement"] >= 0.999
        assert entry["parity"]["samples"] == 256 and entry["parity"]["max_abs_logit_diff"] < 1e-4
        engine = engine_folder / entry["file"]
        assert engine.is_file() and Path(str(engine) + ".json").is_file()
    assert (engine_folder / "tiny-cpu-tokens-fp32.onnx.frontend.safetensors").is_file()
    methods = [t["method"] for t in record["certify"]]
    assert methods[:3] == ["reference: Cohen et al.", "reference: DMAE", "ours: fused"]
    # what --sequential runs (the exact group-sequential test), on the same pictures 8x over: early stops
    assert len(methods) == 4 and methods[3].startswith("ours: fused, group-sequential-exact-")
    fixed, sequential = record["certify"][2:]
    assert sequential["images"] == SEQUENTIAL_IMAGES * fixed["images"] and sequential["n"] == fixed["n"]
    assert all(t["images"] >= 1 and t["extrapolated_1000_s"] > 0 for t in record["certify"])
    table = next(out.glob("*.md")).read_text()
    header = "| model | variant | precision | batch | samples/s | MFU | memory (GiB) | vs Cohen | vs DMAE | status |"
    assert header in table and "CPU smoke run" in table and "## Exported engines" in table
    lines = [line for line in table.splitlines() if line.startswith("| tiny-cpu")]
    assert len(lines) == len(record["throughput"]) + len(record["engines"]) + len(record["certify"])
    assert all(line.count("|") in (11,) for line in lines[: len(record["throughput"])])
    # a second run never overwrites the first: the run's files mark its stem as taken (result_stem's own tests
    # cover the numbering, so a second whole run is not needed here)
    first = next(out.glob("*.json")).stem
    assert report.result_stem(out, torch.device("cpu"), "", tmp_path / "engines") != first


HANG_GUARD_S = 1800  # a smoke session takes ~2 min on 2 idle cores; its step limits are 10x in smoke mode


def _session(tmp_path, **env):
    """bench/gpu_session.sh in smoke mode (CPU sizes, no pip install), as the GPU session runs it."""
    root = Path(__file__).resolve().parents[1]
    variables = {**os.environ, "OUT": str(tmp_path / "out"), "SCRATCH": str(tmp_path / "scratch"),
                 "GPU_SESSION_SMOKE": "1", "PYTHON": sys.executable, **env}
    done = subprocess.run(["bash", str(root / "bench" / "gpu_session.sh")], cwd=root, env=variables,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    steps = {}
    for line in (tmp_path / "out" / "steps.tsv").read_text().splitlines():
        name, status, _seconds = line.split("\t")
        steps[name] = status
    return done, steps


def test_gpu_session_script_runs_every_step_in_smoke_mode(tmp_path):
    done, steps = _session(tmp_path, PACK=str(tmp_path / "pack"))
    assert done.returncode == 0, done.stdout[-2000:]
    assert steps == {"versions": "0", "gpu-tests": "0", "demo": "0", "train": "0", "bench": "0"}
    out = tmp_path / "out"
    assert "torch " in (out / "logs" / "versions.log").read_text()
    assert "testcase" in (out / "tests" / "gpu-tests.xml").read_text()
    assert "identical: 1 rows" in (out / "logs" / "demo.log").read_text()
    [record] = [json.loads(p.read_text()) for p in (out / "bench").glob("*.json")]
    assert {e["status"] for e in record["engines"]} == {"ok"} and record["certify"]
    assert sorted(p.name for p in (out / "bench" / "engines").iterdir()) == [
        "tiny-cpu-image-fp32.onnx.json", "tiny-cpu-tokens-fp32.onnx.json"]  # sidecars only: engines stay behind
    [trained] = [json.loads(p.read_text()) for p in (out / "train").glob("*.json")]
    assert trained["result"]["preset"] == "demo-pretrain" and trained["result"]["images_per_s"] > 0
    log = (out / "session.log").read_text()
    assert "failed steps: none" in log and "== demo (limit 900s)" in log  # smoke limits: hang guards, not 90 s
    # PACK: what the device tool brings back (8 files at most) holds everything under OUT
    pack = tmp_path / "pack"
    assert sorted(p.name for p in pack.iterdir()) == ["gpu-session.tar.gz", "session.log", "steps.tsv"]
    with tarfile.open(pack / "gpu-session.tar.gz") as archive:
        packed = {name.removeprefix("./") for name in archive.getnames()}
    assert {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} <= packed
    assert (pack / "session.log").read_text() == (out / "session.log").read_text()


def test_pretraining_throughput_writes_numbered_results_and_refuses_bad_input(tmp_path, capsys):
    from dmae_fast.bench.train_throughput import main as train_throughput

    args = ["--out", str(tmp_path), "--preset", "demo-pretrain", "--batch", "8", "--seconds", "0.2", "--device", "cpu"]
    assert train_throughput(args) == 0 and train_throughput(args) == 0
    first, second = sorted(tmp_path.glob("*.json"), key=lambda p: len(p.name))
    assert first.name.endswith("-cpu-pretrain.json") and second.name == first.name.replace(".json", "-2.json")
    result = json.loads(first.read_text())["result"]
    assert result["batch"] == 8 and result["steps"] >= 1 and math.isfinite(result["final_loss"])
    capsys.readouterr()
    assert train_throughput(["--out", str(tmp_path), "--preset", "demo-finetune"]) == 2
    assert "is for 'dmae-train finetune'" in capsys.readouterr().err


def test_gpu_session_script_records_steps_it_could_not_run(tmp_path):
    done, steps = _session(tmp_path, SESSION_SECONDS="0", PACK=str(tmp_path / "pack"))
    assert done.returncode == 1  # packing on exit keeps the script's status
    assert (tmp_path / "pack" / "gpu-session.tar.gz").stat().st_size > 0
    assert steps["versions"] == "0" and steps["gpu-tests"] == steps["train"] == steps["bench"] == "skipped"
    assert "failed steps: gpu-tests demo train bench" in (tmp_path / "out" / "session.log").read_text()


def test_gpu_session_script_refuses_to_pack_into_its_own_output(tmp_path):
    root = Path(__file__).resolve().parents[1]
    variables = {**os.environ, "OUT": str(tmp_path / "out"), "PACK": str(tmp_path / "out" / "pack"),
                 "GPU_SESSION_SMOKE": "1", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(root / "bench" / "gpu_session.sh")], cwd=root, env=variables,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 2 and "must not be inside OUT" in done.stderr
    assert not (tmp_path / "out" / "pack").exists()


def test_gpu_session_script_packs_what_it_has_when_terminated(tmp_path):
    """The device tool ends a call that outruns its limit with a signal: the step then running is
    recorded and everything so far is packed at once."""
    import signal
    import time

    root = Path(__file__).resolve().parents[1]
    out, pack = tmp_path / "out", tmp_path / "pack"
    variables = {**os.environ, "OUT": str(out), "PACK": str(pack), "SCRATCH": str(tmp_path / "scratch"),
                 "GPU_SESSION_SMOKE": "1", "PYTHON": sys.executable}
    script = subprocess.Popen(["bash", str(root / "bench" / "gpu_session.sh")], cwd=root, env=variables,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    steps, log = out / "steps.tsv", out / "session.log"
    deadline = time.monotonic() + HANG_GUARD_S
    while not (log.exists() and "== gpu-tests" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    script.send_signal(signal.SIGTERM)
    assert script.wait(timeout=300) == 1
    assert "gpu-tests\tsignal\t" in steps.read_text()
    assert "stopped by a signal during gpu-tests" in log.read_text()
    with tarfile.open(pack / "gpu-session.tar.gz") as archive:
        assert "./steps.tsv" in archive.getnames()


def test_gpu_session_script_runs_the_gpu_tests_of_every_file_that_has_them():
    root = Path(__file__).resolve().parents[1]
    script = (root / "bench" / "gpu_session.sh").read_text()
    [listed] = [line for line in script.splitlines() if line.startswith("GPU_TEST_FILES=")]
    with_gpu_tests = {f"tests/{p.name}" for p in (root / "tests").glob("test_*.py")
                      if re.search(r"^@pytest\.mark\.gpu", p.read_text(), re.MULTILINE)}
    assert with_gpu_tests and with_gpu_tests <= set(listed.split("=(")[1].rstrip(")").split())
    [aoti] = [line for line in script.splitlines() if line.startswith("AOTI_TESTS=(")]
    for test in aoti.split("=(")[1].rstrip(")").split():
        path, name = test.split("::")  # each test run alone must exist, or its --deselect hides nothing
        assert re.search(rf"^def {name}\(", (root / path).read_text(), re.MULTILINE) and "@pytest.mark.gpu" in \
            (root / path).read_text().split(f"def {name}(")[0].rsplit("\n\n\n", 1)[1]


def test_gpu_session_script_runs_only_the_steps_asked_for(tmp_path):
    done, steps = _session(tmp_path, STEPS="train")
    assert done.returncode == 0, done.stdout[-2000:]
    assert steps == {"train": "0"}
    done = subprocess.run(["bash", "bench/gpu_session.sh"], cwd=Path(__file__).resolve().parents[1],
                          env={**os.environ, "OUT": str(tmp_path / "other"), "STEPS": "versions benhc"},
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 2 and "unknown step 'benhc'" in done.stderr


def test_a_signal_swallowed_by_compiled_code_stops_the_bench_at_the_next_row(monkeypatch):
    """torch.compile's guards can swallow the exception a signal handler raises; the handler also
    records the signal, and every bench row checks it before it starts."""
    import signal

    from dmae_fast.base import errors
    from dmae_fast.bench import suite

    monkeypatch.setattr(errors, "_received", signal.SIGTERM)
    with pytest.raises(errors.Interrupted) as stop:
        suite._measure(None, "demo", None, None, 1, 1.0, None)
    assert stop.value.signum == signal.SIGTERM


def test_whole_command_programs_certify_the_same_digits(capsys):
    """bench/commands.py: Cohen et al.'s loop as a program certifies the demo digits it is given,
    and the dmae-certify command lines name the same images and sample counts."""
    from dmae_fast.bench.commands import N0, PROGRAMS, N, argv_for, cohen_program

    cohen_program(2, n0=20, n=200)
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split("\t") == ["idx", "label", "predict", "radius", "correct"] and len(rows) == 2
    assert all(row.split("\t")[4] == "1" and float(row.split("\t")[3]) > 0 for row in rows)  # easy digits
    plain, fast = (argv_for(program, 7, "x.tsv") for program in PROGRAMS[1:])
    for argv in (plain, fast):
        assert argv[argv.index("--max") + 1] == "7" and argv[argv.index("--n") + 1] == str(N)
        assert argv[argv.index("--n0") + 1] == str(N0)
    assert plain[-2:] == ["--body", "plain"] and "--body" not in fast
    assert argv_for(PROGRAMS[0], 7, "x.tsv")[-2:] == ["--images", "7"]
