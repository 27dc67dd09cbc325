"""Tab-separated results files: their columns, and reading them back (ours and Cohen et al.'s).

The leading columns of ours are exactly those of Cohen et al.'s reference ``certify.py`` / ``predict.py``
(same order), so tools written for the reference files read ours, and :func:`read_results` reads both.
:mod:`dmae_fast.results.writer` writes them."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np

from dmae_fast.base.errors import UserError
from dmae_fast.base.files import read_regular_file

CERTIFY_COLUMNS = ("idx", "label", "predict", "radius", "correct", "time", "n0", "n", "nA", "pA_lower", "sigma",
                   "procedure")
PREDICT_COLUMNS = ("idx", "label", "predict", "correct", "time", "n", "count1", "count2", "pvalue", "sigma")
COLUMNS = {"certify": CERTIFY_COLUMNS, "predict": PREDICT_COLUMNS}  # ours, by kind
REQUIRED_COLUMNS = {"certify": CERTIFY_COLUMNS[:6], "predict": PREDICT_COLUMNS[:5]}  # the reference files' columns
MAX_RESULTS_BYTES = 256 * 2**20  # ~2.5M rows of ours (about 110 bytes each); a larger file is refused, not read

Kind = Literal["certify", "predict"]
Mode = Literal["new", "append", "overwrite"]
PARTIAL_SUFFIX = ".partial"  # an --overwrite run writes path + PARTIAL_SUFFIX and renames it over path when done
PathLike = str | os.PathLike[str]
# as written: decimals of the radius and of pA_lower, significant digits of the p-value (see results_writer)
RADIUS_DECIMALS = 6
P_LOWER_DECIMALS = 10
PVALUE_DIGITS = 6


@dataclass
class ResultsTable:
    """The columns of one results file; ``radius`` is None for prediction files."""

    path: str
    kind: Kind
    idx: np.ndarray
    label: np.ndarray
    predict: np.ndarray
    correct: np.ndarray
    time: np.ndarray
    radius: np.ndarray | None = None
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    coarse_radii: bool = False  # radii not written rounded down to 6 decimals (e.g. Cohen's 3 digits)

    @property
    def name(self) -> str:
        return Path(self.path).stem

    def __len__(self) -> int:
        return len(self.idx)

    def duplicate_indices(self) -> list[int]:
        values, counts = np.unique(self.idx, return_counts=True)
        return values[counts > 1].tolist()


_PRECISE_RADIUS = re.compile(r"\d+\.\d{%d}" % RADIUS_DECIMALS)
_TIMEDELTA = re.compile(r"(?:(-?\d+) days?, )?(\d+):([0-5]\d):([0-5]\d(?:\.\d*)?)")


def _parse_time(text: str) -> float:
    """Seconds from ``str(timedelta)`` (``[D day[s], ]H:MM:SS[.ffffff]``) or a plain number."""
    match = _TIMEDELTA.fullmatch(text.strip())
    if match is None:
        return float(text)
    days, hours, minutes, secs = match.groups()
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(secs)


def _ascii(convert: Callable[[str], Any], valid: Callable[[Any], bool] = lambda value: True) -> Callable[[str], Any]:
    """``convert`` for ASCII text only (int() and float() also take other scripts' digits), checked by ``valid``."""
    def parse(text: str) -> Any:
        if not text.isascii():
            raise ValueError(text)
        value = convert(text)
        if not valid(value):
            raise ValueError(text)
        return value
    return parse


_INT_COLUMNS = ("idx", "label", "predict", "n0", "n", "nA", "count1", "count2", "disagreements")
_FLOAT_COLUMNS = ("pA_lower", "pvalue", "sigma", "zeta_upper", "reference_pA_lower", "alpha")
_RADIUS = (_ascii(float, lambda value: math.isfinite(value) and value >= 0), "a finite radius >= 0", "float64")
_PARSERS: dict[str, tuple[Callable[[str], object], str, str]] = {
    **{name: (_ascii(int), "an integer", "int64") for name in _INT_COLUMNS},
    **{name: (_ascii(float, math.isfinite), "a finite number", "float64") for name in _FLOAT_COLUMNS},
    "correct": (_ascii(int, lambda value: value in (0, 1)), "0 or 1", "int64"),
    "radius": _RADIUS,
    "time": (_ascii(_parse_time, math.isfinite), "a duration like 0:00:01.234567", "float64"),
    "procedure": (str, "text", "object"),
    "grid_radius": _RADIUS,
}


def _infer_column(values: list[str]) -> np.ndarray:
    for convert, dtype in ((int, "int64"), (float, "float64")):
        try:
            return np.array([convert(v) for v in values], dtype=dtype)
        except (ValueError, OverflowError):
            pass
    return np.array(values, dtype=object)


def _read_lines(path: str, drop_torn: bool = False) -> list[str]:
    """The file's lines without terminators (``drop_torn``: nor an unterminated last line, which a crash leaves)."""
    data = read_regular_file(path, MAX_RESULTS_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a UTF-8 text file") from None
    lines = [line.rstrip("\r") for line in text.split("\n")]
    if lines[-1] == "" or drop_torn:
        lines.pop()
    return lines


def _parse_table(path: str, lines: list[str]) -> ResultsTable | None:
    """The table of a file's ``lines`` (None if all are blank)."""
    if not any(line.strip() for line in lines):
        return None
    header = lines[0].split("\t")
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise UserError(f"{path}: column(s) {', '.join(duplicates)} appear more than once in the header")
    kind: Kind = "certify" if any(name in header for name in ("radius", "n0", "nA", "pA_lower")) else "predict"
    missing = [name for name in REQUIRED_COLUMNS[kind] if name not in header]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)} "
                        f"(a {kind} results file needs {' '.join(REQUIRED_COLUMNS[kind])})")
    rows: list[tuple[int, list[str]]] = []
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) != len(header):
            raise UserError(f"{path}: line {lineno} has {len(cells)} fields, the header has {len(header)}")
        rows.append((lineno, cells))
    columns: dict[str, np.ndarray] = {}
    for col, name in enumerate(header):
        values = [cells[col] for _, cells in rows]
        if name not in _PARSERS:
            columns[name] = _infer_column(values)
            continue
        convert, what, dtype = _PARSERS[name]
        parsed = []
        for lineno, cells in rows:
            try:
                parsed.append(convert(cells[col]))
            except ValueError:
                raise UserError(f"{path}: line {lineno}, column {name}: cannot read {cells[col]!r} as {what}") from None
        try:
            columns[name] = np.array(parsed, dtype=dtype)
        except OverflowError:
            raise UserError(f"{path}: column {name} holds a number too large for a results file") from None
    coarse = kind == "certify" and any(_PRECISE_RADIUS.fullmatch(cells[header.index("radius")]) is None
                                       for _, cells in rows)
    return ResultsTable(path, kind, **{name: columns.pop(name) for name in REQUIRED_COLUMNS[kind]}, extra=columns,
                        coarse_radii=coarse)


def read_results(path: PathLike) -> ResultsTable:
    """Read a certification or prediction file, ours or the reference implementation's."""
    path = os.fspath(path)
    table = _parse_table(path, _read_lines(path))
    if table is None:
        raise UserError(f"{path} is empty; expected a header line")
    return table


def read_kept_rows(path: PathLike) -> ResultsTable | None:
    """The rows a resumed run keeps: all complete lines of ``path`` (None if it is missing or has none)."""
    path = os.fspath(path)
    return _parse_table(path, _read_lines(path, drop_torn=True)) if os.path.exists(path) else None


def read_row_lines(path: PathLike, kind: Kind, extra: tuple[str, ...] = ()) -> list[str]:
    """The complete data lines of a results file we wrote, after checking its header is a ``kind`` file's (with the
    procedure's ``extra`` columns)."""
    path = os.fspath(path)
    lines = _read_lines(path, drop_torn=True)
    header = "\t".join(COLUMNS[kind] + extra)
    if lines and lines[0] != header:
        raise UserError(f"{path}: its header {lines[0]!r} is not that of a {kind} results file ({header!r})")
    return [line for line in lines[1:] if line.strip()]


