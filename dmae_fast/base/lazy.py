"""Package attributes loaded on first use: a package lists where each public name lives, so
that importing one light submodule (a parser's choices, a sidecar reader) does not import the
heavy ones (torch, timm) that its siblings need."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_attributes(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` is read from the submodule ``homes[name]``."""

    def attribute(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)

    return attribute
