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
            if (folder == "bench" and parts[0] in ("experiments", "results")) or \
                    (folder == "dmae_fast" and parts[0] in FOLDERS.values()):
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
    assert "dmae_fast.run.driver" in known and "dmae_fast.bench.cpu" in known
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert graph["dmae_fast.run.driver"] >= {"dmae_fast.run.shards"}
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def reach(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every node ``start`` reaches in ``graph``, with one path to it (``start`` first)."""
    paths, todo = {start: [start]}, [start]
    while todo:
        node = todo.pop()
        for nxt in sorted(graph.get(node, ())):
            if nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                todo.append(nxt)
    return paths


def test_the_certifier_and_the_server_use_no_export_tool():
    """Certification and serving run engines; they never reach the exporter (``dmae_fast.export``),
    not even lazily nor through another module: the CPU fast body's in-memory export lives with it
    (dmae_fast.batching.cpu), and the engines import no export module."""
    known = modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    for name in known:
        if name.startswith(("dmae_fast.batching", "dmae_fast.run", "dmae_fast.serve", "dmae_fast.engines")):
            paths = reach(graph, name)
            reached = sorted(m for m in paths if m.startswith("dmae_fast.export"))
            assert not reached, " -> ".join(paths[reached[0]])


# ------------------------------------------------------------------ packages and layers
# A package is a folder of the package (dmae_fast.engines, dmae_fast.export, ...); a module directly in
# dmae_fast/ is a package of its own.
# The layers, low to high: a package imports (lazily included) only packages of its own layer or below.
LAYERS = (
    ("dmae_fast", "dmae_fast.base", "dmae_fast.demo_files"),
    ("dmae_fast.stats",),
    ("dmae_fast.noise",),  # with dmae_fast.kernels (BESIDE)
    ("dmae_fast.model", "dmae_fast.data"),
    ("dmae_fast.results",),
    ("dmae_fast.engines",),
    ("dmae_fast.batching",),
    ("dmae_fast.distributed",),
    ("dmae_fast.run",),
    ("dmae_fast.export", "dmae_fast.serve", "dmae_fast.train", "dmae_fast.analysis"),
    ("dmae_fast.cli", "dmae_fast.bench", "dmae_fast.demo"),
)


# kernels/ (dmae_fast.kernels) holds the noise's kernels beside the references in dmae_fast.noise that they are
# checked against, and the compiled noise chooses among them: one package of the graph.
BESIDE = {"dmae_fast.kernels": "dmae_fast.noise"}


def package(module: str, known: dict[str, Path]) -> str:
    """The package ``module`` belongs to: its folder's, or itself for a module directly in dmae_fast/."""
    parts = module.split(".")
    folder = ".".join(parts[:2])
    return BESIDE.get(folder, folder) if folder in known and known[folder].name == "__init__.py" else module


def packages() -> dict[str, set[str]]:
    """Each package -> the other packages its modules import."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        source = package(name, known)
        graph.setdefault(source, set()).update(package(m, known) for m in imported(name, path, known))
    return {source: targets - {source} for source, targets in graph.items()}


def upward(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Every path of ``graph`` from a package to one of a higher layer (none if the order holds);
    a package in no layer is named too."""
    layer = {name: level for level, names in enumerate(layers) for name in names}
    found = [f"{name} is in no layer" for name in sorted(graph) if name not in layer]
    for name in sorted(graph.keys() & layer.keys()):
        paths = reach(graph, name)
        found += [" -> ".join(path) for target, path in sorted(paths.items()) if layer.get(target, -1) > layer[name]]
    return found


def test_no_cycle_between_packages():
    graph = packages()
    assert {"dmae_fast.engines", "dmae_fast.export", "dmae_fast.batching", "dmae_fast.run",
            "dmae_fast.base"} <= graph.keys()
    assert "dmae_fast.run" in graph["dmae_fast.cli"] and "dmae_fast.export" in graph["dmae_fast.bench"]
    assert cycle(graph) is None, " -> ".join(cycle(graph))


def test_each_layer_imports_only_those_below_it():
    found = upward(packages(), LAYERS)
    assert not found, "\n".join(found)


def test_the_layer_check_finds_an_upward_import_through_a_lower_package():
    layers = (("low",), ("middle",), ("high",))
    assert upward({"low": {"middle"}, "middle": set(), "high": {"low"}}, layers) == ["low -> middle"]
    assert upward({"low": set(), "middle": {"low"}, "high": {"middle"}}, layers) == []
    assert upward({"low": set(), "middle": {"low"}, "stray": set()}, layers) == ["stray is in no layer"]
    chain = {"middle": {"low"}, "low": {"high"}, "high": set()}
    assert upward(chain, layers) == ["low -> high", "middle -> low -> high"]


def stats_modules(known: dict[str, Path]) -> list[str]:
    return sorted(name for name in known if name == "dmae_fast.stats" or name.startswith("dmae_fast.stats."))


def test_the_statistics_import_nothing_above_them():
    """``dmae_fast.stats`` imports (lazily included) nothing of the package but itself and the base modules
    ``errors``, ``files`` and ``disk_cache`` (the standard library only), and of other packages only the standard
    library, numpy, scipy and mpmath."""
    known = modules()
    inside = stats_modules(known)
    assert {"dmae_fast.stats.bounds", "dmae_fast.stats.procedure"} <= set(inside)
    allowed = {*sys.stdlib_module_names, "__future__", "numpy", "scipy", "mpmath"}
    for name in inside:
        names = imported(name, known[name])
        base = ("dmae_fast", "dmae_fast.base.errors", "dmae_fast.base.files", "dmae_fast.base.disk_cache")
        above = {m for m in names & known.keys() if m not in inside and m not in base}
        outside = {m for m in names if m.split(".")[0] not in allowed | {"dmae_fast"}}
        assert not above and not outside, f"{name} imports {sorted(above | outside)}"


def test_the_statistics_import_without_torch():
    """A fresh interpreter that imports every module of ``dmae_fast.stats`` has loaded neither torch nor
    ``scipy.stats`` (0.4 s of every command's start: imported where first used)."""
    names = stats_modules(modules())
    code = (f"import importlib, sys\nfor name in {names!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in ('torch', 'scipy.stats') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_cycle_finder_finds_a_lazy_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert cycle(graph) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_of_the_package_is_over_350_lines():
    """A module of ``dmae_fast/`` that grows past 350 lines is split by job (the house rule)."""
    long = {name: lines for name, path in modules().items()
            if path.is_relative_to(ROOT / "dmae_fast") and (lines := len(path.read_text().splitlines())) > 350}
    assert not long, f"split these modules: {long}"
