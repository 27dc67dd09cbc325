"""Rank-0 logging: a JSON-lines file (``log.jsonl``) and TensorBoard scalars when available."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


class RunLog:
    """Appends one JSON object per record; mirrors numbers to TensorBoard if it is installed."""

    def __init__(self, out: Path, enabled: bool, tensorboard: bool = True) -> None:
        self.enabled, self.path, self.writer = enabled, out / "log.jsonl", None
        if not enabled or not tensorboard:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            print("dmae-train: tensorboard is not installed; logging to log.jsonl only", file=sys.stderr)
            return
        self.writer = SummaryWriter(str(out / "tensorboard"))

    def write(self, record: dict[str, Any], step: int) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as file:
            file.write(json.dumps({"time": round(time.time(), 3), **record}) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("epoch", "step"):
                    self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
