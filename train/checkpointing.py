"""Resumable training state: model, optimizer, gradient scaler, epoch, best score and every RNG.

Written by rank 0 at epoch ends as ``checkpoint.pt`` (atomically: a temporary file, then
rename) with the resolved configuration inside and as ``config.json`` beside it. Read
back with ``torch.load(weights_only=True)``: the RNG states are stored as tensors and
plain numbers, never as pickled objects.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dmae_fast.errors import UserError

CHECKPOINT = "checkpoint.pt"
CONFIG = "config.json"


def rng_state() -> dict[str, Any]:
    _, keys, pos, has_gauss, cached = np.random.get_state()
    version, mt, gauss_next = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "python": {"version": version, "state": torch.tensor(mt, dtype=torch.int64), "gauss_next": gauss_next},
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"].tolist()), p["gauss_next"]))


STATUS = "status.json"


def write_status(out: Path, status: str, **details: Any) -> None:
    """``DIR/status.json``: running, complete, stopped (--stop-after-epochs) or interrupted."""
    (out / STATUS).write_text(json.dumps({"status": status, **details}) + "\n")


def write_config(out: Path, config_json: dict[str, Any]) -> None:
    (out / CONFIG).write_text(json.dumps(config_json, indent=2) + "\n")


def save_training_state(out: Path, state: dict[str, Any]) -> Path:
    path = out / CHECKPOINT
    temporary = path.with_suffix(".pt.tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)
    return path


def load_training_state(out: Path) -> dict[str, Any]:
    path = out / CHECKPOINT
    if not path.is_file():
        raise UserError(f"--resume: no {CHECKPOINT} in {out} (nothing to resume)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 (a truncated or foreign file fails in many ways)
        raise UserError(f"--resume: cannot read {path}: {str(error).strip().splitlines()[0]}") from None


def read_config(out: Path) -> Any:
    """The parsed ``config.json`` of a run directory (validated by ``config.from_json``)."""
    path = out / CONFIG
    if not path.is_file():
        raise UserError(f"--resume: no {CONFIG} in {out} (nothing to resume)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise UserError(f"--resume: {path} is not valid JSON ({error})") from None
