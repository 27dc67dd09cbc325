"""Where does an AOTInductor package crash on CUDA? (issue 38, target 4; a one-off device experiment)

On an H200 (2026-11-26) a test (tests/test_fast_stream.py, the fused front end feeding a CUDA
``.pt2`` token engine under a CUDA graph) died with a segmentation fault inside
``aoti_load_package`` while dmae-export verified a fp16 token package; a fp32 image package of
the demo loaded and ran. Each step below runs in a child process with the fault handler on, so
a crash is a row of the table, not the end of the run:

1. compile a tiny classifier's token and image graphs (fp16) into ``.pt2`` packages (no verification);
2. per package and loader setting (``run_single_threaded`` off / on), in one child: load it, run a
   batch, capture a CUDA graph of the call and replay it; the child's last line says how far it got.

    python bench/experiments/2026-11-27-gpu/aoti_diagnose.py --out DIR    # DIR/aoti.json, DIR/aoti.md
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

CASES = [("tokens", "fp16"), ("image", "fp16")]
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
    print(f"exported {path} ({path.stat().st_size} bytes)", flush=True)


def act(path: Path, input_kind: str, loader: str, action: str, device_name: str) -> None:
    import torch

    from dmae_fast.engines.graphs import example_input

    device = torch.device(device_name)
    options = {"run_single_threaded": True, "device_index": 0} if loader == "single-threaded" else {}
    if device.type == "cpu":
        options.pop("device_index", None)
    print(f"loading with {options or 'the defaults'}", flush=True)
    package = torch._inductor.aoti_load_package(str(path), **options)
    print("loaded", flush=True)
    if action == "load":
        return
    x = example_input(_model(), input_kind, 64, device)
    logits = package(x)
    if device.type == "cpu":
        print(f"ran: logits {tuple(logits.shape)} finite {bool(torch.isfinite(logits).all())}; no capture on a CPU")
        return
    torch.cuda.synchronize()
    print(f"ran: logits {tuple(logits.shape)} finite {bool(torch.isfinite(logits).all())}", flush=True)
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
    print(f"captured and replayed: max |difference| {float((captured - logits).abs().max()):.3g}", flush=True)


def child(args: list[str], timeout: float) -> dict:
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-X", "faulthandler", __file__, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout
    except subprocess.TimeoutExpired as error:
        code = "timeout"
        output = error.stdout.decode() if isinstance(error.stdout, bytes) else (error.stdout or "")
    lines = output.strip().splitlines()
    return {"args": args, "exit": code, "seconds": round(time.perf_counter() - start, 1), "tail": lines[-25:],
            "last": _last_said(lines)}


def _last_said(lines: list[str]) -> str:
    """The last line that is not one of torch's log lines (``W1127 14:02:48...``)."""
    said = [line for line in lines if not re.match(r"[DIWE]\d{4} ", line)]
    return said[-1] if said else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to check this script")
    parser.add_argument("--child", nargs="+")  # internal: export PATH INPUT PRECISION | act PATH INPUT LOADER ACTION
    args = parser.parse_args()
    if args.child:
        what, path, *rest = args.child
        export(Path(path), *rest, args.device) if what == "export" else act(Path(path), *rest, args.device)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    packages = {case: out / f"tiny-{case[0]}-{case[1]}.pt2" for case in CASES}
    common = [sys.executable, "-X", "faulthandler", __file__, "--out", str(out), "--device", args.device, "--child"]
    exports = [subprocess.Popen([*common, "export", str(path), *case], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
               for case, path in packages.items()]  # concurrently: each compiles for ~30 s
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
                row = child([*common[4:], "act", str(path), case[0], loader, action], 120)
                rows.append(row)
                print(f"{case[0]} {case[1]} {loader} {action}: exit {row['exit']} ({row['seconds']} s); "
                      f"{row['last']}", flush=True)
                if row["exit"] != 0:
                    break  # the later actions include this one
    (out / "aoti.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| step | exit | last line |", "| --- | --- | --- |"]
    for row in rows:
        step = " ".join(a for a in row["args"] if a not in ("--out", str(out), "--child", "--device", args.device)
                        and not a.endswith(".pt2"))
        lines.append(f"| {step} | {row['exit']} | {row['last'][:160]} |")
    (out / "aoti.md").write_text("\n".join(lines) + "\n")
    for path in packages.values():
        path.unlink(missing_ok=True)  # megabytes each: not brought back
    return 0


if __name__ == "__main__":
    sys.exit(main())
