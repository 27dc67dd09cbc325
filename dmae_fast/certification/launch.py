"""``dmae-certify --nproc-per-node K``: K processes on this machine through torch's elastic launcher.

The same launcher ``torchrun --standalone`` runs (:func:`torch.distributed.launcher.api.elastic_launch`,
a local c10d rendezvous), called directly so that a failing job ends like every command here:
the rank that failed prints its one line, and the job exits with that rank's status, without
the launcher's own traceback and log lines. Several nodes need ``torchrun`` (or SLURM) itself.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid

from dmae_fast.errors import UserError


def launch_local(argv: list[str], nproc: int, max_restarts: int) -> int:
    """Run ``python -m dmae_fast.cli.certify argv`` as ``nproc`` ranks; the job's exit status.

    The ranks see torchrun's environment (``WORLD_SIZE`` > 1), so the same ``argv`` runs one rank
    each. CPU ranks get an equal share of the cores (``OMP_NUM_THREADS``, unless set).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if nproc < 1 or max_restarts < 0:
        raise UserError(f"--nproc-per-node must be >= 1 and --max-restarts >= 0, got {nproc} and {max_restarts}")
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=max_restarts,
                          monitor_interval=0.1, start_method="spawn")
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", "dmae_fast.cli.certify", *argv)
    except ChildFailedError as failure:
        _, first = failure.get_first_failure()
        return first.exitcode if first.exitcode > 0 else 128 - first.exitcode  # -N: killed by signal N
    except SignalException as stop:  # Ctrl-C or SIGTERM: the ranks said what they kept
        return 128 + int(stop.sigval)
    return 0
