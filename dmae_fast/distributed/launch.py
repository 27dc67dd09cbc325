"""``dmae-certify --nproc-per-node K``: K processes on this machine through torch's elastic launcher.

The launcher ``torchrun --standalone`` runs, called directly so that a failing job ends like every command
here, with one line and no launcher traceback: a rank that fails prints its line; a rank killed (``kill -9``,
the OOM killer) or an interrupt is reported by the launcher, with what rank 0 kept. The ranks start in sessions
of their own, so each asks the kernel to kill it when the launcher dies (Linux); when rank 0 was killed, the
launcher marks the run record and removes the lock file. Several nodes need ``torchrun`` (or SLURM) itself.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from dmae_fast.base.errors import UserError, starting

LAUNCHER = "DMAE_CERTIFY_LAUNCHER"  # environment of the ranks: the launcher's pid
KEPT = "DMAE_CERTIFY_KEPT"  # ... and the file where rank 0 leaves what an interrupted run kept
PR_SET_PDEATHSIG = 1  # prctl(2)
KILLED, FAILED, STOPPED = range(3)  # how a rank ended, in the order that explains a failed job


def _cause(exitcode: int) -> int:
    """KILLED by a signal (kill -9, the OOM killer: -N), FAILED on its own (it said why), or STOPPED by
    SIGINT/SIGTERM (handled: 128 + N), which the launcher sends the other ranks when one ends."""
    if -exitcode in (signal.SIGINT, signal.SIGTERM) or exitcode - 128 in (signal.SIGINT, signal.SIGTERM):
        return STOPPED
    return KILLED if exitcode < 0 else FAILED


@dataclass(frozen=True)
class LaunchedRun:
    """What the launcher knows of the run its ranks make: the command, its results file and run record."""

    prog: str
    out: str
    record: Path
    overwrite: bool  # --overwrite: an interrupted run leaves the results file as it was


def launch_local(argv: list[str], run: LaunchedRun, nproc: int, max_restarts: int) -> int:
    """Run ``run.prog argv`` as ``nproc`` ranks, each seeing torchrun's environment; the job's exit status.
    CPU ranks get an equal share of the cores (``OMP_NUM_THREADS``, unless set)."""
    prog = run.prog
    if nproc < 1 or max_restarts < 0:
        raise UserError(f"--nproc-per-node must be >= 1 and --max-restarts >= 0, got {nproc} and {max_restarts}")
    with starting(prog):  # torch's launcher: seconds of imports, before anything is written
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    quiet = logging.getLogger("torch.distributed.elastic")  # its modules set their own levels: cut them off
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=max_restarts,
                          monitor_interval=0.1, start_method="spawn")
    with tempfile.TemporaryDirectory(prefix="dmae-certify-") as folder:
        kept_file = Path(folder, "kept")
        os.environ.update({LAUNCHER: str(os.getpid()), KEPT: str(kept_file)})

        def say(what: str) -> None:
            default = ("the results file is unchanged: run it again with --overwrite" if run.overwrite else
                       "the rows written so far are kept: continue with the same command and --resume")
            kept = (kept_file.read_text() if kept_file.exists() else "") or default
            print(f"{prog}: {what}; {kept}", file=sys.stderr)

        try:
            elastic_launch(launch, entrypoint=sys.executable)("-m", "dmae_fast.cli.certify_rank", *argv)
        except ChildFailedError as failure:
            # torch's timestamps are in seconds: within one, the rank whose end explains the others'
            rank, first = min(failure.failures.items(), key=lambda item: (item[1].timestamp, _cause(item[1].exitcode)))
            cause, code = _cause(first.exitcode), first.exitcode
            if cause == FAILED:
                return code  # the rank printed its line
            signum = -code if code < 0 else code - 128
            name = signal.Signals(signum).name
            what = (f"rank {rank} died (killed by signal {signum}, {name})" if cause == KILLED else
                    f"interrupted by {name} (sent to rank {rank})")
            _end_for_rank_0(run, "failed" if cause == KILLED else "interrupted", what)
            say(f"error: {what}" if cause == KILLED else what)
            return 128 + signum
        except SignalException as stop:  # Ctrl-C or SIGTERM
            what = f"interrupted by {stop.sigval.name}"
            _end_for_rank_0(run, "interrupted", what)
            say(what)
            return 128 + int(stop.sigval)
        finally:
            for variable in (LAUNCHER, KEPT):
                del os.environ[variable]
    return 0


def _end_for_rank_0(run: LaunchedRun, status: str, why: str) -> None:
    """What rank 0 does on its way out, for a rank 0 that could not (``kill -9``): a run record it left
    ``running`` says ``status`` and why, and its lock file goes. Under the lock, so that a run started
    on the same output since is left alone; an --overwrite run's record (the old run's) is not touched."""
    from dmae_fast.base.locking import OutputLock

    try:
        with OutputLock(run.out, "results file"):
            record = json.loads(run.record.read_text())
            if record.get("status") == "running":
                run.record.write_text(json.dumps({**record, "status": status, "error": why}, indent=2) + "\n")
    except (UserError, OSError, ValueError):
        pass  # another run holds the output, or rank 0 never wrote a record


def in_launched_rank() -> bool:
    """Whether this process is a rank started by :func:`launch_local` (which reports deaths and signals)."""
    return LAUNCHER in os.environ


def leave_to_launcher(kept: str) -> bool:
    """In a rank of :func:`launch_local`: leave ``kept`` (what an interrupted run kept; rank 0's
    only) for the launcher to print, and return True; elsewhere False."""
    if not in_launched_rank():
        return False
    if os.environ.get("RANK") == "0":
        Path(os.environ[KEPT]).write_text(kept)
    return True


def die_with_launcher() -> None:
    """Have the kernel SIGKILL this rank when the launcher (its parent) dies; die now if it already has."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != int(os.environ[LAUNCHER]):
            os.kill(os.getpid(), signal.SIGKILL)
