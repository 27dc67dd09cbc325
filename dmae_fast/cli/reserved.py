"""Console-script names reserved for commands that arrive with later issues."""

from __future__ import annotations

import sys

_PLANNED = {
    "dmae-train": "DMAE pre-training, fine-tuning and linear probing (the training issue)",
}


def _not_yet(name: str) -> int:
    print(f"{name}: not implemented in this version: {_PLANNED[name]}; see the README's roadmap", file=sys.stderr)
    return 2


def train_main() -> int:
    return _not_yet("dmae-train")
