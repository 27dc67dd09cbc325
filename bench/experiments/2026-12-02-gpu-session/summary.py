"""One step of bench/gpu_session.sh, summed up: OUT/results/<step>.json (always written, for every step, also
one that failed, timed out or was skipped) and one line on stdout for OUT/summary.tsv:

    step <TAB> status <TAB> seconds <TAB> headline (the step's figure, or the failure's one line)

    python summary.py STEP EXIT_STATUS SECONDS LIMIT OUT

EXIT_STATUS is the step's exit status, or 'skipped' / 'signal'. Reads only files (no torch, no package).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# The files each step leaves (relative to OUT), the first one that exists gives the headline.
RESULTS = {
    "body": ["body/throughput.json"], "vit-l": ["vit-l/throughput.json"], "certify": ["certify/certify.json"],
    "sequential": ["sequential/sequential.json"], "sound": ["sound/sound-speed.json"],
    "serve": ["serve/serve-bench.json"], "train": ["train/*-pretrain.json"], "bench": ["bench/*.json"],
    "gpu-tests": ["tests/gpu-tests.xml"], "tests": ["tests/tests.xml"], "gpu-aoti": ["tests/gpu-aoti.xml"],
    "demo": ["demo/gpu.tsv"], "fp8": ["fp8/fp8-agreement.json"], "profile": ["profile/*.json"],
    "scaling": ["scaling/*.json"], "versions": ["logs/versions.log"], "install": ["logs/install.log"],
}
FAILURE = r"error|Error|FAILED|Traceback|Killed|Segmentation|fault|interrupted|refuse|timed out|ERROR"
SIGNALS = {124: "timed out", 137: "killed (timed out, then SIGKILL)", 134: "aborted (SIGABRT)",
           139: "segmentation fault (SIGSEGV)", 143: "terminated (SIGTERM)", 135: "bus error (SIGBUS)"}


def _files(out: Path, step: str) -> list[Path]:
    return [p for pattern in RESULTS.get(step, []) for p in sorted(out.glob(pattern)) if p.is_file()]


def _junit(path: Path) -> str:
    text = path.read_text(errors="replace")
    suite = re.search(r"<testsuite [^>]*", text)
    if not suite:
        return "no test suite in the report"
    field = {k: int(v) for k, v in re.findall(r'(tests|failures|errors|skipped)="(\d+)"', suite.group(0))}
    passed = field.get("tests", 0) - sum(field.get(k, 0) for k in ("failures", "errors", "skipped"))
    counts = (("passed", passed), ("failed", field.get("failures", 0)), ("errors", field.get("errors", 0)),
              ("skipped", field.get("skipped", 0)))
    return ", ".join(f"{v} {k}" for k, v in counts if v) or "no tests ran"


def headline(step: str, out: Path, files: list[Path]) -> str:
    log = out / "logs" / f"{step}.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    if step == "versions":
        keep = [line for line in text.splitlines() if line.split(" ")[0] in ("torch", "triton", "gpu", "cuda")]
        return "; ".join(keep)
    if step == "install":
        return "pip install -e . done" if "Successfully installed" in text else (text.strip().splitlines() or [""])[-1]
    if not files:
        return ""
    path = files[-1]
    if path.suffix == ".xml":
        return _junit(path)
    if path.suffix != ".json":
        return f"{path.relative_to(out)} written"
    data = json.loads(path.read_text())
    if "headline" in data:
        return data["headline"]
    if step == "sound":
        rows = {(r["body"], r["sound"]): r for r in data["rows"]}
        parts = [f"{body}: --sound {rows[(body, True)]['samples_per_s']:,.0f} samples/s = "
                 f"{rows[(body, True)]['ratio_to_default']:.2f}x the default noise's"
                 for body in ("fast", "plain") if (body, True) in rows]
        return f"{data['rows'][0]['model']} {data['precision']}: " + "; ".join(parts)
    if step == "serve":
        return (f"server {data['pooled_saturation_samples_per_s']:,.0f} samples/s at saturation = "
                f"{data['median_paired_ratio']:.2f}x the offline streamer's {data['offline_median']:,.0f}")
    if step == "train":
        result = data["result"]
        return (f"{result['preset']} {result['precision']} batch {result['batch']}: "
                f"{result['images_per_s']:,.1f} images/s")
    if step == "bench":
        rows = [r for r in data.get("throughput", []) if r.get("samples_per_s")]
        best = max(rows, key=lambda r: r["samples_per_s"], default=None)
        return "" if best is None else (f"best {best['model']} {best['variant']} {best['precision']}: "
                                        f"{best['samples_per_s']:,.0f} samples/s")
    return f"{path.relative_to(out)} written"


def failure_line(step: str, out: Path, status: str) -> str:
    log = out / "logs" / f"{step}.log"
    lines = [line.strip() for line in (log.read_text(errors="replace") if log.is_file() else "").splitlines()
             if line.strip()]
    why = SIGNALS.get(int(status), f"exit {status}") if status.isdigit() else status
    hits = [line for line in lines if re.search(FAILURE, line)]
    last = (hits or lines or ["(no output)"])[-1]
    return f"{why}: {last[:300]}"


def main(argv: list[str]) -> int:
    step, status, seconds, limit, out = argv[0], argv[1], argv[2], argv[3], Path(argv[4])
    files = [] if status == "skipped" else _files(out, step)
    try:
        figure = headline(step, out, files)
    except Exception as error:  # a results file cut short: say so, keep the line
        figure = f"(results unreadable: {type(error).__name__}: {error})"
    ok = status == "0"
    if status == "skipped":
        line = f"skipped: {max(int(limit), 0)} s of the session left for it, too few"
    else:
        line = figure if ok else failure_line(step, out, status) + (f" | measured before: {figure}" if figure else "")
    state = "ok" if ok else ("skipped" if status == "skipped" else "failed")
    record = {"step": step, "status": state, "exit": status, "seconds": int(seconds), "limit_s": int(limit),
              "headline": line, "results": [str(p.relative_to(out)) for p in files],
              "log": f"logs/{step}.log", "log_tail": _tail(out / "logs" / f"{step}.log")}
    (out / "results").mkdir(parents=True, exist_ok=True)
    (out / "results" / f"{step}.json").write_text(json.dumps(record, indent=1) + "\n")
    print("\t".join([step, state, seconds, " ".join(line.split())]))
    return 0


def _tail(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines()[-15:] if log.is_file() else []


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
