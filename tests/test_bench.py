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
from dmae_fast.bench.command import main  # noqa: E402
from dmae_fast.bench.flops import vit_forward_flops  # noqa: E402
from dmae_fast.bench.reference_loops import COHEN, DMAE  # noqa: E402
from dmae_fast.bench.suite import SEQUENTIAL_IMAGES  # noqa: E402
from dmae_fast.bench.throughput import MODEL_SPECS, build_model  # noqa: E402


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


GPU_SESSION_STEPS = ["versions", "install", "body", "certify", "sequential", "sound", "vit-l", "serve", "train",
                     "gpu-aoti"]  # the default steps, most valuable first (.pt2 last: its load crashed torch 2.11)
SMOKE_STEPS = [s for s in GPU_SESSION_STEPS if s not in ("sound", "serve")]  # the smoke run's (as before)


def _summary(out: Path) -> list[list[str]]:
    header, *lines = (out / "summary.tsv").read_text().splitlines()
    assert header.split("\t") == ["step", "status", "seconds", "headline"]
    return [line.split("\t") for line in lines]


def test_gpu_session_script_runs_every_step_in_smoke_mode(tmp_path):
    done, steps = _session(tmp_path, PACK=str(tmp_path / "pack"))
    assert done.returncode == 0, done.stdout[-2000:]
    assert list(steps) == SMOKE_STEPS and set(steps.values()) == {"0"}
    out = tmp_path / "out"
    # every step: a results file and one summary line (step, status, seconds, its headline figure)
    summary = _summary(out)
    assert [line[0] for line in summary] == SMOKE_STEPS and {line[1] for line in summary} == {"ok"}
    headline = {line[0]: line[3] for line in summary}
    for step in SMOKE_STEPS:
        result = json.loads((out / "results" / f"{step}.json").read_text())
        assert result["status"] == "ok" and result["headline"] == headline[step], step
        assert all((out / path).is_file() for path in result["results"]), step
    assert headline["versions"].startswith("torch ") and "PYTHONPATH shim" in headline["install"]
    body = json.loads((out / "body" / "throughput.json").read_text())
    assert [r["variant"] for r in body["rows"]] == ["reference: Cohen et al.", "reference: DMAE", "ours: eager"]
    assert all(r["status"] == "ok" and r["samples_per_s"] > 0 and r["seconds"] > 0 for r in body["rows"])
    assert headline["body"] == body["headline"] and "samples/s: fp32 " in headline["body"]
    certify = json.loads((out / "certify" / "certify.json").read_text())
    assert certify["fixed_n"]["finished"] == 4 and certify["fixed_n"]["drawn"] == 4 * (20 + 200)
    sequential = json.loads((out / "sequential" / "sequential.json").read_text())
    assert sequential["sequential"]["finished"] == 8 and sequential["procedure"].startswith("group-sequential")
    assert sequential["fixed_n"] == certify["fixed_n"] and "certify step" in sequential["fixed_n_source"]
    assert "drawn/s vs fixed-n" in headline["sequential"]
    vit_l = json.loads((out / "vit-l" / "throughput.json").read_text())
    assert [r["variant"] for r in vit_l["rows"]] == ["ours: eager"]
    [trained] = [json.loads(p.read_text()) for p in (out / "train").glob("*.json")]
    assert trained["result"]["preset"] == "demo-pretrain" and trained["result"]["images_per_s"] > 0
    assert headline["gpu-aoti"] == "2 skipped"  # collected, skipped without CUDA
    log = (out / "session.log").read_text()
    assert "failed steps: none" in log and "== certify (limit 900s)" in log  # smoke limits: hang guards, not 90 s
    # PACK: what the device tool brings back (8 files at most) holds everything under OUT
    pack = tmp_path / "pack"
    assert sorted(p.name for p in pack.iterdir()) == ["gpu-session.tar.gz", "session.log", "steps.tsv", "summary.tsv"]
    with tarfile.open(pack / "gpu-session.tar.gz") as archive:
        packed = {name.removeprefix("./") for name in archive.getnames()}
    assert {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} <= packed
    assert (pack / "session.log").read_text() == (out / "session.log").read_text()
    assert (pack / "summary.tsv").read_text() == (out / "summary.tsv").read_text()


def test_gpu_session_default_budgets_fit_one_call_and_certify_calls_pass_a_seed():
    """The default steps' budgets add up to SESSION_SECONDS (540: 9 minutes); every dmae-certify whose rows
    are compared passes --seed 0 (without it a run draws a fresh seed)."""
    script = (Path(__file__).resolve().parents[1] / "bench" / "gpu_session.sh").read_text()
    [default] = re.findall(r'^DEFAULT_STEPS="([^"]+)"', script, re.MULTILINE)
    assert default.split() == GPU_SESSION_STEPS
    [table] = re.findall(r"^declare -A BUDGET=\(([^)]+)\)", script, re.MULTILINE)
    budget = {k: int(v) for k, v in re.findall(r"\[([\w-]+)\]=(\d+)", table)}
    assert sum(budget[step] for step in GPU_SESSION_STEPS) == 540 and "${SESSION_SECONDS:-540}" in script
    logical = script.replace("\\\n", " ").splitlines()  # backslash continuations joined
    calls = [line for line in logical if "dmae_fast.cli.certify" in line and " analyze " not in line]
    assert len(calls) >= 4
    for line in calls:
        assert "--seed 0" in line or ('"${common[@]}"' in line and re.search(r"common=\(.*--seed 0", script)), line
    [scaling] = [line for line in logical if "bench.command scaling" in line]
    assert "--seed 0" in scaling  # its dmae-certify arguments replace the default ones (with --seed 0)


def test_gpu_session_summary_reads_the_steps_the_smoke_run_leaves_out(tmp_path):
    """summary.py's headline for sound and serve (GPU-only in the smoke run) and a failure's one line."""
    root = Path(__file__).resolve().parents[1]
    tool = root / "bench" / "experiments" / "2026-12-02-gpu-session" / "summary.py"
    (tmp_path / "sound").mkdir()
    (tmp_path / "logs").mkdir()
    rows = [{"model": "vit-b16", "body": b, "sound": s, "samples_per_s": 1000.0 * (1 + s), "ratio_to_default": 1 + s}
            for b in ("fast", "plain") for s in (False, True)]
    (tmp_path / "sound" / "sound-speed.json").write_text(json.dumps({"precision": "fp16", "rows": rows}))
    (tmp_path / "serve").mkdir()
    serve = root / "bench" / "results" / "2026-11-25-h100" / "call2" / "serve" / "serve-bench.json"
    (tmp_path / "serve" / "serve-bench.json").write_text(serve.read_text())
    (tmp_path / "logs" / "vit-l.log").write_text("measure: vit-l16 ...\nRuntimeError: CUDA error: out of memory\n")

    def line(*args: str) -> list[str]:
        done = subprocess.run([sys.executable, str(tool), *args, str(tmp_path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.rstrip("\n").split("\t")

    assert line("sound", "0", "50", "70") == ["sound", "ok", "50", "vit-b16 fp16: fast: --sound 2,000 samples/s = "
                                              "2.00x the default noise's; plain: --sound 2,000 samples/s = 2.00x the "
                                              "default noise's"]
    assert line("serve", "0", "40", "50")[3] == ("server 259,491 samples/s at saturation = 0.59x the offline "
                                                 "streamer's 437,604")
    assert line("vit-l", "124", "45", "45") == ["vit-l", "failed", "45",
                                                "timed out: RuntimeError: CUDA error: out of memory"]
    assert json.loads((tmp_path / "results" / "vit-l.json").read_text())["log_tail"][-1].startswith("RuntimeError")


def test_pretraining_throughput_writes_numbered_results_and_refuses_bad_input(tmp_path, capsys):
    from dmae_fast.bench.train_throughput import main as train_throughput

    args = ["--out", str(tmp_path), "--preset", "demo-pretrain", "--batch", "8", "--seconds", "0.2", "--device", "cpu"]
    assert train_throughput(args) == 0
    [first] = tmp_path.glob("*.json")
    assert first.name.endswith("-cpu-pretrain.json")
    # the next run's files are numbered (result_stem, which names them, has the numbering's own tests)
    assert report.result_stem(tmp_path, torch.device("cpu"), "-pretrain") == f"{first.stem}-2"
    result = json.loads(first.read_text())["result"]
    assert result["batch"] == 8 and result["steps"] >= 1 and math.isfinite(result["final_loss"])
    capsys.readouterr()
    assert train_throughput(["--out", str(tmp_path), "--preset", "demo-finetune"]) == 2
    assert "is for 'dmae-train finetune'" in capsys.readouterr().err


def test_gpu_session_script_records_steps_it_could_not_run(tmp_path):
    done, steps = _session(tmp_path, SESSION_SECONDS="0", PACK=str(tmp_path / "pack"))
    assert done.returncode == 1  # packing on exit keeps the script's status
    assert (tmp_path / "pack" / "gpu-session.tar.gz").stat().st_size > 0
    assert list(steps) == SMOKE_STEPS and set(steps.values()) == {"skipped"}
    summary = _summary(tmp_path / "out")  # a summary line and a results file for a skipped step too
    assert [line[:3] for line in summary] == [[step, "skipped", "0"] for step in SMOKE_STEPS]
    assert json.loads((tmp_path / "out" / "results" / "body.json").read_text())["status"] == "skipped"
    assert "failed steps: " + " ".join(SMOKE_STEPS) in (tmp_path / "out" / "session.log").read_text()


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
                 "GPU_SESSION_SMOKE": "1", "PYTHON": sys.executable, "STEPS": "body"}  # body at once
    script = subprocess.Popen(["bash", str(root / "bench" / "gpu_session.sh")], cwd=root, env=variables,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    steps, log = out / "steps.tsv", out / "session.log"
    deadline = time.monotonic() + HANG_GUARD_S
    while not (log.exists() and "== body" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    script.send_signal(signal.SIGTERM)
    assert script.wait(timeout=300) == 1
    assert "body\tsignal\t" in steps.read_text()
    assert "stopped by a signal during body" in log.read_text()
    [body] = [line for line in _summary(out) if line[0] == "body"]
    assert body[1] == "failed" and body[3].startswith("signal")
    with tarfile.open(pack / "gpu-session.tar.gz") as archive:
        assert {"./steps.tsv", "./summary.tsv", "./results/body.json"} <= set(archive.getnames())
    assert (pack / "summary.tsv").is_file()


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
    """(install: the quickest step in smoke mode; the smoke run checks what each step does)"""
    done, steps = _session(tmp_path, STEPS="install")
    assert done.returncode == 0, done.stdout[-2000:]
    assert steps == {"install": "0"} and [line[:2] for line in _summary(tmp_path / "out")] == [["install", "ok"]]
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
    header, *rows = (line.split("\t") for line in capsys.readouterr().out.splitlines())
    assert header == ["idx", "label", "predict", "radius", "correct"] and len(rows) == 2
    cells = [dict(zip(header, row)) for row in rows]
    assert all(c["correct"] == "1" and float(c["radius"]) > 0 for c in cells)  # easy digits
    plain, fast = (argv_for(program, 7, "x.tsv") for program in PROGRAMS[1:])
    for argv in (plain, fast):
        assert argv[argv.index("--max") + 1] == "7" and argv[argv.index("--n") + 1] == str(N)
        assert argv[argv.index("--n0") + 1] == str(N0)
    assert plain[-2:] == ["--body", "plain"] and "--body" not in fast
    assert argv_for(PROGRAMS[0], 7, "x.tsv")[-2:] == ["--images", "7"]
