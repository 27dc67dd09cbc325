"""One rank of ``dmae-certify --nproc-per-node K``: the launcher
(:func:`dmae_fast.certification.launch.launch_local`) starts ``python -m dmae_fast.cli.certify_rank
argv`` K times; each runs ``dmae-certify argv`` as one rank, tied to the launcher's life."""

from __future__ import annotations

import sys

from dmae_fast.certification.launch import die_with_launcher
from dmae_fast.errors import Interrupted, interrupt_on_signals


def rank_main(argv: list[str]) -> int:
    """``dmae-certify argv`` in this rank; the rank dies with the launcher."""
    die_with_launcher()
    interrupt_on_signals()  # before the slow imports
    try:
        from dmae_fast.cli.certify import main
    except Interrupted as stop:  # the launcher says so
        return stop.exit_status
    return main(argv)


if __name__ == "__main__":
    sys.exit(rank_main(sys.argv[1:]))
