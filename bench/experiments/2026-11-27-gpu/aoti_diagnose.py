"""Where does an AOTInductor package crash on CUDA? (issue 38, target 4; a one-off device experiment)

On an H200 (2026-11-26) a test (tests/test_fast_body.py, the fused front end feeding a CUDA
``.pt2`` token engine under a CUDA graph) died with a segmentation fault inside
``aoti_load_package`` while dmae-export verified a fp16 token package; a fp32 image package of
the demo loaded and ran. Each step below runs in a child process with the fault handler on, so
a crash is a row of the table, not the end of the run:

0. the toolchain (DIR/toolchain.txt): the compiler AOTInductor builds with, torch's C++ ABI and build;
1. compile a tiny classifier into ``.pt2`` packages (no verification): a CPU fp32 image package (on an
   H100, 2026-11-27, loading one crashed the process too) and CUDA fp16 token and image packages;
2. per package and loader setting (``run_single_threaded`` off / on), in one child: load it, run a
   batch, capture a CUDA graph of the call and replay it; the child's last line says how far it got.
   Under ``cuda-gdb`` (or ``gdb``) when there is one, so a crash leaves a native backtrace in the row.

Rows are written to DIR/aoti.json as they come (a step cut short keeps what came before).

    python bench/experiments/2026-11-27-gpu/aoti_diagnose.py --out DIR    # DIR/aoti.json, DIR/aoti.md
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

CASES = [("image", "fp32", "cpu"), ("tokens", "fp16", "cuda"), ("image", "fp16", "cuda")]  # input, precision, device
LOADERS = ["default", "single-threaded"]
ACTIONS = ["graph"]  # "load" and "run" stop earlier (to rerun one stage alone)


def _model():
    import torch

    from dmae_fast.model import ClassifierSpec, EncoderConfig, SmoothingClassifier

    torch.manual_seed(0)
    spec = ClassifierSpec(EncoderConfig(32, 2, 2, patch_size=4, img_size=16), num_classes=10, input_size=16, sigma=0.5)
    return SmoothingClassifier(spec).eval()


def export(path: Path, input_kind: str, precision: str, device_name: str) -> None:
    import torch

    from dmae_fast.engines.graphs import build_graph, example_input
    from dmae_fast.engines.sidecar import BatchRange
    from dmae_fast.export.aoti_export import write_pt2

    device = torch.device(device_name)
    model = _model()
    graph = build_graph(model, input_kind, precision).to(device)
    write_pt2(graph, example_input(model, input_kind, 2, device), path, BatchRange(1, 64, 256), {})
    print(f"aoti: exported {path} ({path.stat().st_size} bytes)", flush=True)


def act(path: Path, input_kind: str, loader: str, action: str, device_name: str) -> None:
    import torch

    from dmae_fast.engines.graphs import example_input

    device = torch.device(device_name)
    options = {"run_single_threaded": True, "device_index": 0} if loader == "single-threaded" else {}
    if device.type == "cpu":
        options.pop("device_index", None)
    print(f"aoti: loading with {options or 'the defaults'}", flush=True)
    package = torch._inductor.aoti_load_package(str(path), **options)
    print("aoti: loaded", flush=True)
    if action == "load":
        return
    x = example_input(_model(), input_kind, 64, device)
    logits = package(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    print(f"aoti: ran: logits {tuple(logits.shape)} finite {bool(torch.isfinite(logits).all())}", flush=True)
    if device.type == "cpu":
        print("aoti: no capture on a CPU", flush=True)
        return
    if action == "run":
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            package(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = package(x)
    graph.replay()
    torch.cuda.synchronize()
    print(f"aoti: captured and replayed: max |difference| {float((captured - logits).abs().max()):.3g}", flush=True)


def toolchain() -> str:
    """The compiler AOTInductor builds packages with, and what torch itself was built with."""
    import torch
    from torch._inductor import config

    compiler = config.cpp.cxx[0] if isinstance(config.cpp.cxx, tuple) else config.cpp.cxx
    lines = [f"torch {torch.__version__}, C++11 ABI {torch._C._GLIBCXX_USE_CXX11_ABI}",
             f"AOTInductor's compiler: {compiler}"]
    for command in ([compiler or "g++", "--version"], ["gcc", "--version"], ["ldd", "--version"]):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
            lines.append(f"{' '.join(command)}: {(done.stdout or done.stderr).splitlines()[0]}")
        except (OSError, subprocess.TimeoutExpired, IndexError) as error:
            lines.append(f"{' '.join(command)}: {error}")
    return "\n".join(lines + ["torch's build:", torch.__config__.show()])


def child(args: list[str], timeout: float) -> dict:
    start = time.perf_counter()
    debugger = shutil.which("cuda-gdb") or shutil.which("gdb")
    under = [debugger, "-q", "-batch", "-ex", "run", "-ex", "bt 40", "--args"] if debugger else []
    try:
        done = subprocess.run([*under, sys.executable, "-X", "faulthandler", __file__, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as error:
        code = "timeout"
        output = error.stdout.decode() if isinstance(error.stdout, bytes) else (error.stdout or "")
    lines = output.strip().splitlines()
    if debugger:  # the debugger's own exit status says nothing of the program's
        code = _status_under_debugger(lines, code)
    crashed = [i for i, line in enumerate(lines) if "received signal" in line or "Fatal Python error" in line]
    return {"args": args, "exit": code, "seconds": round(time.perf_counter() - start, 1), "tail": lines[-25:],
            "last": _last_said(lines), "crash": lines[crashed[0]:crashed[0] + 60] if crashed else []}


def _status_under_debugger(lines: list[str], code: int | str) -> int | str:
    """The program's exit status from gdb's report of it ("exited normally", "exited with code 01",
    "received signal SIGSEGV"); the debugger's own ``code`` (e.g. "timeout") when it has none."""
    for line in lines:
        if "received signal" in line:
            return "signal " + line.split("received signal", 1)[1].strip().split(",")[0]
        if "exited normally" in line:
            return 0
        found = re.search(r"exited with code (\d+)", line)
        if found:
            return int(found.group(1), 8)  # gdb prints it in octal
    return code


def _last_said(lines: list[str]) -> str:
    """The program's last progress line ("aoti: ..."), else the last line that is not one of torch's
    log lines (``W1127 14:02:48...``)."""
    said = [line for line in lines if line.startswith("aoti: ")] or \
        [line for line in lines if not re.match(r"[DIWE]\d{4} ", line)]
    return said[-1] if said else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda", help="cuda (default: the cases' own devices), or cpu for all "
                        "(to check this script on a machine without a GPU)")
    parser.add_argument("--child", nargs="+")  # internal: export PATH INPUT PRECISION | act PATH INPUT LOADER ACTION
    args = parser.parse_args()
    if args.child:
        what, path, *rest = args.child
        export(Path(path), *rest, args.device) if what == "export" else act(Path(path), *rest, args.device)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "toolchain.txt").write_text(toolchain() + "\n")
    cases = [case if args.device == "cuda" else (*case[:2], "cpu") for case in CASES]
    packages = {case: out / f"tiny-{'-'.join(case)}.pt2" for case in cases}
    python = [sys.executable, "-X", "faulthandler", __file__, "--out", str(out)]
    exports = [subprocess.Popen([*python, "--device", case[2], "--child", "export", str(path), *case[:2]],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for case, path in packages.items()]  # concurrently: each compiles for 30-60 s
    rows = []
    for (case, path), process in zip(packages.items(), exports):
        try:
            output, _ = process.communicate(timeout=240)
            code = process.returncode
        except subprocess.TimeoutExpired:
            process.kill()
            output, code = process.communicate()[0], "timeout"
        lines = output.strip().splitlines()
        rows.append({"args": ["export", *case], "exit": code, "tail": lines[-25:], "last": _last_said(lines)})
        print(f"export {case}: exit {code}", flush=True)
        if code != 0:
            continue
        for loader in LOADERS:
            for action in ACTIONS:
                row = child(["--out", str(out), "--device", case[2], "--child", "act", str(path), case[0], loader,
                             action], 120)
                rows.append(row)
                (out / "aoti.json").write_text(json.dumps(rows, indent=1) + "\n")
                print(f"{case[0]} {case[1]} {loader} {action}: exit {row['exit']} ({row['seconds']} s); "
                      f"{row['last']}", flush=True)
                if row["exit"] != 0:
                    break  # the later actions include this one
    (out / "aoti.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| step | exit | last line |", "| --- | --- | --- |"]
    for row in rows:
        step = " ".join(a for a in row["args"] if a not in ("--out", str(out), "--child", "--device")
                        and not a.endswith(".pt2"))
        lines.append(f"| {step} | {row['exit']} | {row['last'][:160]} |")
    (out / "aoti.md").write_text("\n".join(lines) + "\n")
    for path in packages.values():
        path.unlink(missing_ok=True)  # megabytes each: not brought back
    return 0


if __name__ == "__main__":
    sys.exit(main())
