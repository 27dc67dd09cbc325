"""The package's import graph has no cycle: not at module level, and not through the imports
that functions make when they run (a lazy import that closes a circle is still a circle)."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the package and the top-level folders installed inside it (pyproject's package-dir)
FOLDERS = {"dmae_fast": "dmae_fast", "dmae_fast.kernels": "kernels", "dmae_fast.export": "export",
           "dmae_fast.train": "train", "dmae_fast.bench": "bench"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[0] in ("experiments", "results") or (folder == "dmae_fast" and parts[0] in FOLDERS.values()):
                continue  # one-off scripts; the folders mapped above are walked under their own name
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join([package, *parts])] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path] | None = None) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its code (``known`` None: every name
    it imports, of any package, with ``from m import x`` giving both ``m`` and ``m.x``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = name.split(".")[: (len(name.split(".")) - node.level + (path.name == "__init__.py"))] \
                if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return out if known is None else {m for m in out if m in known and m != name}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = 2
        return None

    return next((found for node in sorted(graph) if node not in state and (found := visit(node, []))), None)


def test_the_import_graph_has_no_cycle():
    known = modules()
    assert "dmae_fast.certification.run" in known and "dmae_fast.bench.cpu" in known
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert graph["dmae_fast.certification.run"] >= {"dmae_fast.certification.distributed_run"}
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_the_certifier_and_the_server_use_no_export_tool():
    """Certification and serving run engines; they never import the exporter (``dmae_fast.export``),
    not even lazily: the CPU runtimes' in-memory export lives with the engines."""
    known = modules()
    for name, path in known.items():
        if name.startswith(("dmae_fast.certification", "dmae_fast.serve")):
            reached = {m for m in imported(name, path, known) if m.startswith("dmae_fast.export")}
            assert not reached, f"{name} imports {sorted(reached)}"


def stats_modules(known: dict[str, Path]) -> list[str]:
    return sorted(name for name in known if name == "dmae_fast.stats" or name.startswith("dmae_fast.stats."))


def test_the_statistics_import_nothing_above_them():
    """``dmae_fast.stats`` imports (lazily included) nothing of the package but itself and ``errors``,
    and of other packages only the standard library, numpy and scipy."""
    known = modules()
    inside = stats_modules(known)
    assert {"dmae_fast.stats.bounds", "dmae_fast.stats.procedure"} <= set(inside)
    allowed = {*sys.stdlib_module_names, "__future__", "numpy", "scipy"}
    for name in inside:
        names = imported(name, known[name])
        above = {m for m in names & known.keys() if m not in inside and m not in ("dmae_fast", "dmae_fast.errors")}
        outside = {m for m in names if m.split(".")[0] not in allowed | {"dmae_fast"}}
        assert not above and not outside, f"{name} imports {sorted(above | outside)}"


def test_the_statistics_import_without_torch():
    """A fresh interpreter that imports every module of ``dmae_fast.stats`` has not loaded torch."""
    names = stats_modules(modules())
    code = f"import importlib, sys\nfor name in {names!r}: importlib.import_module(name)\nprint('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_the_cycle_finder_finds_a_lazy_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert cycle(graph) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
