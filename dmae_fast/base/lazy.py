"""Package attributes loaded on first use: a package lists where each public name lives, so
that importing one light submodule (a parser's choices, a sidecar reader) does not import the
heavy ones (torch, timm) that its siblings need; and modules kept importable by their former names."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def lazy_attributes(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` is read from the submodule ``homes[name]``."""

    def attribute(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)

    return attribute


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of a module by its former name give the module at its new home (the same object)."""

    def __init__(self, moves: dict[str, str]) -> None:
        self.moves = moves

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if name in self.moves else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.moves[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the module ran at its new home."""


def keep_former_names(moves: dict[str, str]) -> None:
    """Let ``import old`` keep working for every module moved from ``old`` to ``moves[old]``."""
    sys.meta_path.append(_MovedModules(moves))
