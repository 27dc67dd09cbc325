"""The one-off experiment scripts under bench/experiments/ (issue 26, item 6).

Result folders under bench/results/ keep data and READMEs only; the scripts that produced their
figures live in bench/experiments/<date>-<topic>/. No test runs or imports them (minutes each, some need a
GPU or a server; importing them would freeze the internals they name): each is pinned to the commit it ran on
(bench/experiments/README.md), says what it measures, keeps its work under ``if __name__ == "__main__":`` and
names only dmae_fast's public names, checked from its source.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "bench" / "experiments"
RESULTS = ROOT / "bench" / "results"
SCRIPTS = sorted(EXPERIMENTS.rglob("*.py"))
IDS = [str(path.relative_to(EXPERIMENTS)) for path in SCRIPTS]


def test_the_experiments_are_found() -> None:
    assert len(SCRIPTS) >= 3, SCRIPTS


def test_result_folders_hold_no_scripts() -> None:
    scripts = sorted(str(p.relative_to(ROOT)) for pattern in ("*.py", "*.sh") for p in RESULTS.rglob(pattern))
    assert not scripts, f"scripts belong in bench/experiments/<date>-<topic>/, not with the results: {scripts}"


def test_the_readme_names_every_experiment_and_its_folder() -> None:
    """bench/experiments/README.md's table says which results each script made: none is left out."""
    readme = (EXPERIMENTS / "README.md").read_text()
    scripts = [p for pattern in ("*.py", "*.sh") for p in EXPERIMENTS.rglob(pattern)]
    missing = sorted(str(p.relative_to(EXPERIMENTS)) for p in scripts  # by name, or as folder/*.py
                     if not (p.name in readme and p.parent.name in readme or f"{p.parent.name}/*{p.suffix}" in readme))
    assert not missing, f"bench/experiments/README.md does not name {missing}"


@pytest.mark.parametrize("path", SCRIPTS, ids=IDS)
def test_an_experiment_says_what_it_measures(path: Path) -> None:
    assert ast.get_docstring(ast.parse(path.read_text(), str(path))), \
        f"{path.name}: say what it measures and how to run it in its docstring"


@pytest.mark.parametrize("path", SCRIPTS, ids=IDS)
def test_an_experiment_keeps_its_work_under_main(path: Path) -> None:
    """Only imports, definitions and constants at the top level; the work under ``if __name__ == "__main__":``."""
    tree = ast.parse(path.read_text(), str(path))
    guarded = [node for node in tree.body if isinstance(node, ast.If) and _is_main_guard(node.test)]
    assert guarded, f"{path.name}: no `if __name__ == \"__main__\":` block"
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
               ast.AnnAssign)
    for node in tree.body:
        if node in guarded or (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            continue
        assert isinstance(node, allowed), f"{path.name}:{node.lineno}: work at import time ({type(node).__name__})"
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            calls = [c for c in ast.walk(node.value) if isinstance(c, ast.Call)
                     and not (isinstance(c.func, ast.Name) and c.func.id in _CHEAP_CALLS)
                     and not (isinstance(c.func, ast.Attribute) and c.func.attr in _CHEAP_METHODS)]
            assert not calls, f"{path.name}:{node.lineno}: a call at import time ({ast.unparse(node.value)[:60]})"


_CHEAP_CALLS = {"int", "float", "str", "dict", "tuple", "list", "set", "frozenset", "range", "len"}
_CHEAP_METHODS = {"get", "Counter"}  # os.environ.get(...), collections.Counter()


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize("path", SCRIPTS, ids=IDS)
def test_an_experiment_uses_public_names_only(path: Path) -> None:
    """No private name of dmae_fast (or its bench/export/... modules), and no private attribute but torch's
    and a class's own (``torch._inductor.config`` is torch's documented way to set Inductor's options)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dmae_fast":
            assert not any(_private(part) for part in node.module.split(".")), f"{where}: private module {node.module}"
            names = [alias.name for alias in node.names if _private(alias.name)]
            assert not names, f"{where}: private name(s) {names} from {node.module}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                assert parts[0] == "torch" or not any(map(_private, parts)), f"{where}: private module {alias.name}"
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            assert isinstance(root, ast.Name) and root.id in ("torch", "self"), \
                f"{where}: private attribute {ast.unparse(node)}"
