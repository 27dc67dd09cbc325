"""What ``torchrun`` (or SLURM, or ``dmae-certify --nproc-per-node``) tells each process through its
environment. Light (no torch): a command reads it before its slow imports."""

from __future__ import annotations

import os

from dmae_fast.base.errors import UserError


def world_size() -> int:
    """``WORLD_SIZE`` as set by torchrun; 1 outside it."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        raise UserError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number") from None


def restart_count() -> int:
    """How often torchrun restarted this job (``--max-restarts``): > 0 means an earlier attempt wrote rows."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
