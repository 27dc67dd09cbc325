"""Facts about the machine a run is on, for run records and benchmark files."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU model and torch's thread count (for run records)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        model = next(line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.machine()
    return f"{model}, {torch.get_num_threads()} threads"
