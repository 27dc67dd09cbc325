"""One rank of ``dmae-certify --nproc-per-node K``: the launcher
(:func:`dmae_fast.distributed.launch.launch_local`) starts ``python -m dmae_fast.cli.certify_rank
argv`` K times; each runs ``dmae-certify argv`` as one rank, tied to the launcher's life."""

from __future__ import annotations

import sys

from dmae_fast.base.errors import exit_on_signals

exit_on_signals(None)  # before the imports below: a signal now ends this rank silently (the launcher says it)

from dmae_fast.cli.entry import start  # noqa: E402
from dmae_fast.distributed.launch import die_with_launcher  # noqa: E402


def rank_main() -> int:
    """``dmae-certify`` with this process's arguments, as a rank that dies with its launcher (which reports signals)."""
    die_with_launcher()
    return start(None, "dmae_fast.cli.certify")


if __name__ == "__main__":
    sys.exit(rank_main())
