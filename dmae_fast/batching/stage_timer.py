"""``--profile``'s per-stage timer of a batch body (:class:`StageTimer`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
from torch.profiler import record_function

STAGES = ("front end", "body", "counting", "host")


class StageTimer:
    """``--profile``'s per-stage wall time and profiler ranges; it synchronizes around each stage, so the
    shares are what each stage costs, not how they overlap in an unprofiled run."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        """Forget what was timed so far (e.g. a trial batch before the run)."""
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.batches = 0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        with record_function(name):
            self._sync()
            start = time.perf_counter()
            yield
            self._sync()
            self.seconds[name] += time.perf_counter() - start

    def table(self, total_seconds: float) -> str:
        """The per-stage breakdown; 'host' is the run's time outside the device stages."""
        seconds = dict(self.seconds)
        seconds["host"] = max(0.0, total_seconds - sum(v for k, v in seconds.items() if k != "host"))
        lines = [f"{'stage':<10} {'seconds':>9} {'share':>7} {'ms/batch':>9}"]
        for name in STAGES:
            share = seconds[name] / total_seconds if total_seconds > 0 else 0.0
            per_batch = 1000 * seconds[name] / max(1, self.batches)
            lines.append(f"{name:<10} {seconds[name]:>9.3f} {share:>7.1%} {per_batch:>9.3f}")
        lines.append(f"{'total':<10} {total_seconds:>9.3f} {'100.0%':>7} {self.batches:>6} batches")
        return "\n".join(lines)


def stage(timer: StageTimer | None, name: str) -> AbstractContextManager[None]:
    """Stage ``name`` timed by ``timer``, or run as is without one."""
    return nullcontext() if timer is None else timer(name)


def count_batch(timer: StageTimer | None) -> None:
    """One more batch for ``timer``'s per-batch figures (none without a timer)."""
    if timer is not None:
        timer.batches += 1
