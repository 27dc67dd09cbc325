"""What many test files need: a results file's rows without a column (its run time, by default)."""

from __future__ import annotations

from pathlib import Path


def rows_without(path: str | Path, column: str = "time", sort: bool = False) -> list[list[str]]:
    """Every line of the results file ``path`` as cells, the header first, without ``column`` (found by its
    name in the header); ``sort``: the rows after the header in ``idx`` order, each ``idx`` once."""
    lines = [line.split("\t") for line in Path(path).read_text(encoding="utf-8").splitlines()]
    drop = lines[0].index(column)
    cells = [line[:drop] + line[drop + 1:] for line in lines]
    if not sort:
        return cells
    rows = sorted(cells[1:], key=lambda row: int(row[0]))
    assert len({row[0] for row in rows}) == len(rows), "an image appears twice"
    return [cells[0], *rows]
