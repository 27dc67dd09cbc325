"""The processes of a run as one of them sees them: a world of one (:class:`World`), or one rank of a
``torchrun`` job (:class:`Ranks`); :func:`join` gives this process's, so the run driver is the same code for both.

The ranks share a process group (NCCL for CUDA tensors, gloo for the host) and its key-value store, through
which they claim images (an atomic counter), report progress and figures, and flag a failure so the others stop
instead of waiting; small Python objects (start-up errors, the list of images) travel by gloo collectives.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from dmae_fast.base.errors import AlreadyReported, Interrupted, UserError
from dmae_fast.base.messages import one_line
from dmae_fast.distributed.launch import in_launched_rank
from dmae_fast.distributed.torchrun_env import restart_count, world_size

T = TypeVar("T")
START_TIMEOUT = timedelta(minutes=30)  # ranks must all reach start-up within this (loading a large engine)
POLL_SECONDS = 0.2
_runs = 0  # certification runs started in this process (a key prefix per run)


def join(device: str) -> World:
    """This process's world: a rank of torchrun's job when ``WORLD_SIZE`` > 1, else a world of one. ``device`` is
    the configured one; with ``auto``/``cuda`` a rank's is its node's GPU ``cuda:LOCAL_RANK`` (when CUDA is there);
    a named ``cuda:N`` is every rank's (the ranks share that GPU)."""
    if world_size() == 1:
        return World()
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    mine, error = device, None
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        mine = f"cuda:{local_rank}"
        if torch.cuda.device_count() <= local_rank:  # said once every rank has started (Ranks.agree)
            mine, error = "cpu", (f"LOCAL_RANK {local_rank} has no GPU: this node has {torch.cuda.device_count()}; "
                                  "start at most that many processes per node")
    shared_gpu = mine.startswith("cuda:") and device == mine and int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1) > 1
    ranks = Ranks.join(mine, shared_gpu)
    ranks.device, ranks.device_error = mine, error
    return ranks


class World:
    """A world of one: this process is rank 0 and the only rank; no process group, every step runs
    here, the images are claimed in turn from a local counter (:class:`Ranks` overrides each)."""

    device: str | None = None  # where this rank opens the classifier (None: the configured device)
    device_error: str | None = None  # why this rank has no device (said once every rank has started)

    def __init__(self) -> None:
        self.rank, self.world = 0, 1
        self._done = [0, 0]  # images, samples
        self._figures: list[dict] = []

    @property
    def primary(self) -> bool:
        return self.rank == 0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around the run: what ends it as it ends this process (see :meth:`Ranks.running`)."""
        yield

    def agree(self, step: Callable[[], T]) -> T:
        return step()

    def from_primary(self, step: Callable[[], T]) -> T:
        return step()

    def claims(self, total: int) -> Iterator[int]:
        return iter(range(total))

    def add_progress(self, images: int, samples: int) -> None:
        self._done[0] += images
        self._done[1] += samples

    def progress(self) -> tuple[int, int]:
        """(images, samples) finished so far."""
        return self._done[0], self._done[1]

    def fail(self, message: str) -> bool:
        return True  # no one else to tell: this process says why

    def failed(self) -> str | None:
        return None

    def check_failed(self) -> None:
        if self.failed() is not None:
            raise AlreadyReported(2)

    def finish(self, figures: dict) -> None:
        self._figures.append(figures)

    def wait_for_all(self, tick: Callable[[], None]) -> list[dict]:
        return self._figures


@dataclass
class Ranks(World):
    """This process's place in a torchrun job, and the job-wide channels."""

    rank: int
    world: int
    store: dist.Store
    objects: dist.ProcessGroup | None  # gloo group for Python objects (None: the default group is gloo)
    owns_group: bool
    device: str | None = None
    device_error: str | None = None

    @classmethod
    def join(cls, device: str, shared_gpu: bool = False) -> Ranks:
        """Join the process group torchrun's environment describes (or use one the caller set up).
        ``shared_gpu``: the node's ranks share one GPU, which NCCL refuses ("invalid usage": one rank
        per GPU), so every collective goes through gloo."""
        global _runs
        owns = not dist.is_initialized()
        if owns:
            backend = "cpu:gloo,cuda:nccl" if device.startswith("cuda") and not shared_gpu else "gloo"
            try:
                store, rank, world = next(dist.rendezvous("env://", timeout=START_TIMEOUT))
                # A torchrun restart may meet the keys of the attempt it replaces: one namespace per attempt.
                store = dist.PrefixStore(f"dmae-certify/attempt-{restart_count()}/", store)
                dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=START_TIMEOUT)
            except (ValueError, RuntimeError) as error:
                raise UserError(f"cannot join the torchrun process group: {one_line(error, first=True)}") from None
        else:
            store = dist.distributed_c10d._get_default_store()  # the caller's group: its store
        objects = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
        _runs += 1
        return cls(dist.get_rank(), dist.get_world_size(), dist.PrefixStore(f"run-{_runs}/", store), objects, owns)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around the run: an interrupted rank stays silent when a rank failed (it said why) and unless
        it is rank 0; a store that is gone ends it with :meth:`lost`; the process group is left."""
        try:
            yield
        except Interrupted as stop:
            failed = self.failed() is not None
            if failed or not self.primary:  # the failing rank, or rank 0, says what happened
                raise AlreadyReported(2 if failed else stop.exit_status) from None
            raise
        except dist.DistError as error:  # from the store: the launcher that holds it is gone
            raise self.lost(error) from None
        finally:
            if self.owns_group and dist.is_initialized():
                dist.destroy_process_group()

    def agree(self, step: Callable[[], T]) -> T:
        """Run ``step`` on every rank; if it fails anywhere, fail everywhere with the first rank's line
        (printed by rank 0 only: other ranks raise :class:`AlreadyReported`)."""
        result, error = _attempt(step)
        errors = [None] * self.world
        with self.reaching_peers():
            dist.all_gather_object(errors, error, group=self.objects)
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            self._raise(first)
        return result

    def from_primary(self, step: Callable[[], T]) -> T:
        """Run ``step`` on rank 0 and hand its result (or its error) to every rank."""
        message = [_attempt(step) if self.primary else None]
        with self.reaching_peers():
            dist.broadcast_object_list(message, src=0, group=self.objects)
        result, error = message[0]
        if error is not None:
            self._raise(error)
        return result

    @contextlib.contextmanager
    def reaching_peers(self) -> Iterator[None]:
        """Around a collective: if another rank is gone, end this one with one line from rank 0 at
        most (none under ``dmae-certify --nproc-per-node``, whose launcher reports the death)."""
        try:
            yield
        except RuntimeError as error:
            raise self.lost(error) from None

    def lost(self, error: RuntimeError) -> Exception:
        """What ends this rank after ``error`` from a collective or the store: another rank, or the
        launcher that holds the store, is gone."""
        if self.failed() is not None or not self.primary or in_launched_rank():
            return AlreadyReported(2)
        return UserError(f"lost another rank of the job, or its launcher ({one_line(error, first=True)})")

    def _raise(self, message: str):
        if self.primary:
            raise UserError(message)
        raise AlreadyReported(2)

    def summed(self, local: torch.Tensor) -> torch.Tensor:
        """Every rank's ``local`` counts summed, on the host (sample sharding; a collective)."""
        # NCCL sums device tensors; with gloo (CPU ranks, or ranks sharing one GPU) the counts go by the host
        summed = local.clone() if dist.get_backend() != "gloo" else local.to("cpu", copy=True)
        with self.reaching_peers():
            dist.all_reduce(summed)
        return summed.cpu()

    def share_stream(self, source: Iterable[T] | None) -> Iterator[T]:
        """Rank 0 reads ``source`` and every rank gets each item (sample sharding: one reader)."""
        items = iter(source) if self.primary else None
        while True:
            message = [None]
            if self.primary:
                try:
                    item = next(items, StopIteration)
                    message = [("item", item) if item is not StopIteration else ("end", None)]
                except UserError as error:
                    message = [("error", str(error))]
            with self.reaching_peers():
                dist.broadcast_object_list(message, src=0, group=self.objects)
            kind, value = message[0]
            if kind == "end":
                return
            if kind == "error":
                self._raise(value)
            yield value

    def claims(self, total: int) -> Iterator[int]:
        """Positions 0..total-1, each handed to exactly one rank, in order of asking (dynamic sharing)."""
        while True:
            self.check_failed()
            position = self.store.add("claimed", 1) - 1
            if position >= total:
                return
            yield position

    def add_progress(self, images: int, samples: int) -> None:
        self.store.add("images", images)
        self.store.add("samples", samples)

    def progress(self) -> tuple[int, int]:
        """(images, samples) finished by all ranks so far."""
        return self.store.add("images", 0), self.store.add("samples", 0)

    def fail(self, message: str) -> bool:
        """Tell the other ranks this one failed (they stop without printing); whether it is the first
        to fail, the one that says why."""
        try:
            return self.store.compare_set("failed", "", message) == message.encode()
        except RuntimeError:
            return True  # the store is gone: the launcher stops the job anyway

    def failed(self) -> str | None:
        try:
            return self.store.get("failed").decode() if self.store.check(["failed"]) else None
        except RuntimeError:
            return None

    def finish(self, figures: dict) -> None:
        """Publish this rank's figures and count it done."""
        self.store.set(f"rank/{self.rank}", json.dumps(figures))
        self.store.add("done", 1)

    def wait_for_all(self, tick: Callable[[], None]) -> list[dict]:
        """Rank 0: wait until every rank finished (calling ``tick`` meanwhile); their figures."""
        while self.store.add("done", 0) < self.world:
            self.check_failed()
            tick()
            time.sleep(POLL_SECONDS)
        return [json.loads(self.store.get(f"rank/{rank}")) for rank in range(self.world)]


def _attempt(step: Callable[[], T]) -> tuple[T | None, str | None]:
    try:
        return step(), None
    except UserError as error:
        return None, str(error)
