"""A notice said while a progress bar is drawn gets a line of its own (issue 56, item 6)."""

from __future__ import annotations

import re
import sys

from tqdm import tqdm

from dmae_fast.base.messages import print_notice


def test_a_notice_under_a_progress_bar_gets_a_line_of_its_own(capsys):
    bar = tqdm(total=10, desc="certifying", file=sys.stderr, mininterval=0)
    bar.update(3)
    print_notice("the fast body failed mid-run (RuntimeError: std::bad_alloc); continuing on the plain body")
    bar.update(1)
    bar.close()
    err = capsys.readouterr().err
    (line,) = [part for part in re.split(r"[\r\n]", err) if "failed mid-run" in part]
    assert line == ("dmae-fast: the fast body failed mid-run (RuntimeError: std::bad_alloc); continuing on the "
                    "plain body")
    assert "certifying:  40%" in err.split(line)[1]  # the bar drawn again below the notice
