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

from dmae_fast.base.errors import UserError
from dmae_fast.model.checkpoints import load_strict

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


def load_training_state(out: Path, mmap: bool = False) -> dict[str, Any]:
    path = _run_file(out, CHECKPOINT)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:  # noqa: BLE001 (a truncated or foreign file fails in many ways)
        raise UserError(f"--resume: cannot read {path}: {_first_line(error)}") from None


#: What :func:`save_training_state` is given by the training loop.
STATE_KEYS = ("model", "optimizer", "scaler", "epoch", "best", "rng", "config")


def check_resumable(out: Path, config_json: dict[str, Any], model: torch.nn.Module) -> int:
    """The number of epochs ``out``'s checkpoint has done, once it is known to be a training
    state of this run: written with this configuration, weights that fit ``model`` (loaded
    into it), an epoch of the schedule. One-line UserError otherwise, before anything is
    written. The tensors are memory-mapped, not read."""
    path = out / CHECKPOINT
    state = load_training_state(out, mmap=True)
    missing = [key for key in STATE_KEYS if key not in state] if isinstance(state, dict) else list(STATE_KEYS)
    if missing:
        raise UserError(f"--resume: {path} is not a dmae-train training state (no {', '.join(missing)})")
    differ = _differences(_plain(state["config"]), _plain(config_json))
    if differ:
        raise UserError(f"--resume: {path} was written by another configuration than {out / CONFIG} "
                        f"(they differ in {', '.join(differ[:4])})")
    epoch, epochs = state["epoch"], config_json["optim"]["epochs"]
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= epochs:
        raise UserError(f"--resume: {path} holds epoch {epoch!r}, not one of the schedule's 0..{epochs}")
    weights = state["model"]
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise UserError(f"--resume: {path} holds no model weights (a dict of tensors)")
    load_strict(model, weights, path, "the model of this run")
    return epoch


def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples become lists)."""
    return json.loads(json.dumps(value, default=repr))


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted names of the fields in which two configurations differ."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else [prefix.rstrip(".") or "the whole configuration"]
    return [name for key in sorted(set(a) | set(b), key=str)
            for name in _differences(a.get(key, _ABSENT), b.get(key, _ABSENT), f"{prefix}{key}.")]


_ABSENT = object()


def read_config(out: Path) -> Any:
    """The parsed ``config.json`` of a run directory (validated by ``config.from_json``)."""
    path = _run_file(out, CONFIG)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise UserError(f"--resume: {path} is not valid JSON ({_first_line(error)})") from None
    except OSError as error:
        raise UserError(f"--resume: cannot read {path}: {error.strerror or error}") from None


def _run_file(out: Path, name: str) -> Path:
    """``out / name``, which --resume needs."""
    path = out / name
    if not path.is_file():
        raise UserError(f"--resume: {path} is not a file" if path.exists() else
                        f"--resume: no {name} in {out} (nothing to resume)")
    return path


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
