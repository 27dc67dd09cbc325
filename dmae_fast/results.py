"""Tab-separated results files: writing them row by row, and reading them back.

Certification files have the columns of :data:`CERTIFY_COLUMNS`, prediction files those
of :data:`PREDICT_COLUMNS`. Their leading columns are exactly those of Cohen et al.'s
reference ``certify.py`` / ``predict.py`` (same order), so tools written for the reference
files read ours, and :func:`read_results` reads both. Numbers that carry a guarantee are
never rounded in its favour: the radius is written rounded down to 6 decimals (Cohen's
files round it to 3 significant digits, which can round it UP: 0.79964 -> 0.8),
``pA_lower`` rounded down to 10 decimals, the PREDICT p-value rounded up.
"""

from __future__ import annotations

import datetime
import decimal
import math
import os
import re
import time
from dataclasses import astuple, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Callable, Literal, TextIO

import numpy as np

from dmae_fast.errors import UserError
from dmae_fast.files import read_regular_file

CERTIFY_COLUMNS: tuple[str, ...] = (
    "idx", "label", "predict", "radius", "correct", "time",
    "n0", "n", "nA", "pA_lower", "sigma", "procedure",
)
PREDICT_COLUMNS: tuple[str, ...] = (
    "idx", "label", "predict", "correct", "time",
    "n", "count1", "count2", "pvalue", "sigma",
)
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "certify": ("idx", "label", "predict", "radius", "correct", "time"),
    "predict": ("idx", "label", "predict", "correct", "time"),
}
MAX_RESULTS_BYTES = 256 * 2**20  # ~2.5M rows of ours (about 110 bytes each); a larger file is refused, not read
SYNC_SECONDS = 1.0  # the most a power failure can take from a results file (see ResultsWriter)

Kind = Literal["certify", "predict"]
Mode = Literal["new", "append", "overwrite"]
PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class CertifyRow:
    """One certified test image. ``predict == -1`` means abstain; ``time`` is in seconds."""

    idx: int
    label: int
    predict: int
    radius: float
    correct: int
    time: float
    n0: int
    n: int
    nA: int
    pA_lower: float
    sigma: float
    procedure: str


@dataclass(frozen=True)
class PredictRow:
    """One smoothed prediction. ``predict == -1`` means abstain; ``time`` is in seconds."""

    idx: int
    label: int
    predict: int
    correct: int
    time: float
    n: int
    count1: int
    count2: int
    pvalue: float
    sigma: float


Row = CertifyRow | PredictRow  # one result row of either kind


def _fmt_time(seconds: float) -> str:
    return str(datetime.timedelta(seconds=float(seconds)))


def _fmt_text(value: str) -> str:
    if "\t" in value or "\n" in value or "\r" in value:
        raise ValueError(f"results field {value!r} contains a tab or a line break")
    return value


# Exact decimal arithmetic on a float's full expansion (at most 1,074 digits).
_EXACT = decimal.Context(prec=2000)
RADIUS_DECIMALS = 6
P_LOWER_DECIMALS = 10
PVALUE_DIGITS = 6


def floor_decimals(value: float, decimals: int) -> str:
    """``value`` (finite, >= 0) rounded DOWN to ``decimals`` places, e.g. 0.7999999 -> '0.799999'.

    Certified radii and lower confidence bounds are written this way so that a reader never
    sees more than was proven: the number read back is never above ``value``.
    """
    exact = decimal.Decimal(float(value))
    if not exact.is_finite() or exact < 0:
        raise ValueError(f"cannot write {value!r} as a radius or bound (finite and >= 0 only)")
    quantum = decimal.Decimal(1).scaleb(-decimals)
    return f"{exact.quantize(quantum, rounding=decimal.ROUND_FLOOR, context=_EXACT):f}"


def ceil_significant(value: float, digits: int) -> str:
    """``value`` (finite, >= 0) rounded UP to ``digits`` significant digits, in the form
    '1.00005e-03'. p-values are written this way: one read back is never below the true one."""
    exact = decimal.Decimal(float(value))
    if not exact.is_finite() or exact < 0:
        raise ValueError(f"cannot write {value!r} as a p-value (finite and >= 0 only)")
    if exact == 0:
        return f"{0.0:.{digits - 1}e}"
    exponent = exact.adjusted()
    quantum = decimal.Decimal(1).scaleb(1 - digits)
    mantissa = exact.scaleb(-exponent, context=_EXACT).quantize(quantum, rounding=decimal.ROUND_CEILING,
                                                                 context=_EXACT)
    if mantissa >= 10:
        mantissa, exponent = decimal.Decimal(1).quantize(quantum), exponent + 1
    return f"{mantissa:f}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"


_FORMATTERS: dict[str, Callable[[object], str]] = {
    "radius": lambda v: floor_decimals(v, RADIUS_DECIMALS),
    "time": _fmt_time,
    "pA_lower": lambda v: floor_decimals(v, P_LOWER_DECIMALS),
    "pvalue": lambda v: ceil_significant(v, PVALUE_DIGITS),
    "sigma": lambda v: repr(float(v)),
    "procedure": lambda v: _fmt_text(str(v)),
}


def _format_row(row: CertifyRow | PredictRow, columns: tuple[str, ...]) -> str:
    cells = [_FORMATTERS.get(name, lambda v: str(int(v)))(value)
             for name, value in zip(columns, astuple(row))]
    return "\t".join(cells) + "\n"


class ResultsWriter:
    """Writes a results file row by row; use as a context manager.

    ``mode="new"`` refuses an existing file; ``"append"`` continues a file whose header
    matches (creating it if missing, dropping a last line cut off by a crash);
    ``"overwrite"`` writes ``path + ".partial"`` and renames it over ``path`` only when
    the ``with`` block ends without an exception.

    Durability: every row is handed to the operating system as it is written, so a crash
    of the process (even SIGKILL) loses nothing; the file is fsynced at most every
    ``SYNC_SECONDS`` and when it is closed, so a power failure or OS crash loses at most
    the rows of the last ``SYNC_SECONDS`` (a torn last line is dropped on ``--resume``).
    """

    def __init__(self, path: PathLike, kind: Kind = "certify", mode: Mode = "new") -> None:
        if kind not in REQUIRED_COLUMNS:
            raise ValueError(f"unknown results kind {kind!r}")
        self.path = os.fspath(path)
        self.kind = kind
        self.mode = mode
        self._row_type = CertifyRow if kind == "certify" else PredictRow
        self._columns = columns_of(kind)
        header = "\t".join(self._columns)
        if mode == "new":
            self._target = self.path
            self._file = self._open(self.path, "x")
            self._file.write(header + "\n")
        elif mode == "append":
            self._target = self.path
            needs_header = _prepare_append(self.path, header, kind)
            self._file = self._open(self.path, "a")
            if needs_header:
                self._file.write(header + "\n")
        elif mode == "overwrite":
            if os.path.isdir(self.path):
                raise UserError(f"{self.path} is a directory, not a results file")
            self._target = self.path + ".partial"
            self._file = self._open(self._target, "w")
            self._file.write(header + "\n")
        else:
            raise ValueError(f"unknown ResultsWriter mode {mode!r}")
        self._sync()

    def _open(self, path: str, how: str) -> TextIO:
        try:
            return open(path, how, encoding="utf-8", newline="\n")
        except FileExistsError:
            raise UserError(
                f"{path} exists; pass --overwrite to replace it or --resume to continue it"
            ) from None
        except FileNotFoundError:
            raise UserError(
                f"cannot create {path}: directory {os.path.dirname(path) or '.'} does not exist"
            ) from None
        except IsADirectoryError:
            raise UserError(f"{path} is a directory, not a results file") from None
        except OSError as exc:
            raise UserError(f"cannot open {path}: {exc.strerror}") from None

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._synced = time.monotonic()

    def write(self, row: CertifyRow | PredictRow) -> None:
        """Append one row: to the operating system at once, to the disk within SYNC_SECONDS."""
        if not isinstance(row, self._row_type):
            raise TypeError(f"a {self.kind} results file takes {self._row_type.__name__}, "
                            f"got {type(row).__name__}")
        self._file.write(_format_row(row, self._columns))
        self._file.flush()
        if time.monotonic() - self._synced >= SYNC_SECONDS:
            self._sync()

    def close(self, success: bool = True) -> None:
        """Close the file; in overwrite mode, replace ``path`` only if ``success``."""
        if self._file.closed:
            return
        self._sync()
        self._file.close()
        if self.mode == "overwrite" and success:
            os.replace(self._target, self.path)

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(success=exc_type is None)


def _prepare_append(path: str, header: str, kind: Kind) -> bool:
    """Check the header of an existing file and cut off an unterminated last line.

    Returns True when the file is missing or empty, so the header still has to be written.
    """
    if not os.path.exists(path):
        return True
    data = read_regular_file(path, MAX_RESULTS_BYTES)
    first, newline, _ = data.partition(b"\n")
    found = first.rstrip(b"\r").decode("utf-8", errors="replace")
    if newline and found != header or not newline and not header.startswith(found):
        raise UserError(f"{path} cannot be resumed: its header {found!r} is not that of a "
                        f"{kind} results file ({header!r}); pass --overwrite to replace it")
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with open(path, "rb+") as f:
            f.truncate(keep)
    return keep == 0


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
        """The file name without directory and extension."""
        return Path(self.path).stem

    def __len__(self) -> int:
        return len(self.idx)

    def duplicate_indices(self) -> list[int]:
        """Image indices that appear in more than one row."""
        values, counts = np.unique(self.idx, return_counts=True)
        return values[counts > 1].tolist()


_PRECISE_RADIUS = re.compile(r"\d+\.\d{%d}" % RADIUS_DECIMALS)
_TIMEDELTA = re.compile(r"(?:(-?\d+) days?, )?(\d+):([0-5]\d):([0-5]\d(?:\.\d*)?)")


def _parse_time(text: str) -> float:
    """Seconds from ``str(timedelta)`` (``[D day[s], ]H:MM:SS[.ffffff]``) or a plain number."""
    match = _TIMEDELTA.fullmatch(text.strip())
    if match is None:
        seconds = float(text)
        if not math.isfinite(seconds):
            raise ValueError(text)
        return seconds
    days, hours, minutes, secs = match.groups()
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(secs)


def _parse_radius(text: str) -> float:
    radius = float(text)
    if not (math.isfinite(radius) and radius >= 0):
        raise ValueError(text)
    return radius


def _parse_correct(text: str) -> int:
    value = int(text)
    if value not in (0, 1):
        raise ValueError(text)
    return value


def _ascii(convert: Callable[[str], object]) -> Callable[[str], object]:
    """``convert`` for ASCII text only: int() and float() also take other scripts' digits ('٣')."""
    def parse(text: str) -> object:
        if not text.isascii():
            raise ValueError(text)
        return convert(text)
    return parse


def _parse_finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


_INT_COLUMNS = ("idx", "label", "predict", "n0", "n", "nA", "count1", "count2")
_FLOAT_COLUMNS = ("pA_lower", "pvalue", "sigma")
_PARSERS: dict[str, tuple[Callable[[str], object], str, str]] = {
    **{name: (_ascii(int), "an integer", "int64") for name in _INT_COLUMNS},
    **{name: (_ascii(_parse_finite), "a finite number", "float64") for name in _FLOAT_COLUMNS},
    "correct": (_ascii(_parse_correct), "0 or 1", "int64"),
    "radius": (_ascii(_parse_radius), "a finite radius >= 0", "float64"),
    "time": (_ascii(_parse_time), "a duration like 0:00:01.234567", "float64"),
    "procedure": (str, "text", "object"),
}


def _infer_column(values: list[str]) -> np.ndarray:
    for convert, dtype in ((int, "int64"), (float, "float64")):
        try:
            return np.array([convert(v) for v in values], dtype=dtype)
        except (ValueError, OverflowError):
            pass
    return np.array(values, dtype=object)


def _read_lines(path: str) -> tuple[list[str], bool]:
    """The file's lines without terminators, and whether the last one was terminated."""
    data = read_regular_file(path, MAX_RESULTS_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a UTF-8 text file") from None
    lines = [line.rstrip("\r") for line in text.split("\n")]
    terminated = lines[-1] == ""
    if terminated:
        lines.pop()
    return lines, terminated


def _parse_table(path: str, lines: list[str]) -> ResultsTable:
    header = lines[0].split("\t")
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise UserError(f"{path}: column(s) {', '.join(duplicates)} appear more than once "
                        "in the header")
    is_certify = any(name in header for name in ("radius", "n0", "nA", "pA_lower"))
    kind: Kind = "certify" if is_certify else "predict"
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
            raise UserError(f"{path}: line {lineno} has {len(cells)} fields, "
                            f"the header has {len(header)}")
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
                raise UserError(f"{path}: line {lineno}, column {name}: cannot read "
                                f"{cells[col]!r} as {what}") from None
        try:
            columns[name] = np.array(parsed, dtype=dtype)
        except OverflowError:
            raise UserError(f"{path}: column {name} holds a number too large for a results file") from None
    coarse = kind == "certify" and any(
        _PRECISE_RADIUS.fullmatch(cells[header.index("radius")]) is None for _, cells in rows)
    return ResultsTable(
        path=path, kind=kind,
        **{name: columns.pop(name) for name in REQUIRED_COLUMNS[kind]},
        extra=columns, coarse_radii=coarse,
    )


def read_results(path: PathLike) -> ResultsTable:
    """Read a certification or prediction file, ours or the reference implementation's."""
    path = os.fspath(path)
    lines, _ = _read_lines(path)
    if not any(line.strip() for line in lines):
        raise UserError(f"{path} is empty; expected a header line")
    return _parse_table(path, lines)


def read_kept_rows(path: PathLike) -> ResultsTable | None:
    """The rows a resumed run keeps: all complete lines of ``path`` (None if it has none).

    A missing or empty file gives None; an unterminated last line (a crash while it was
    written) is ignored, as :class:`ResultsWriter` in append mode drops it.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        return None
    lines, terminated = _read_lines(path)
    if not terminated:
        lines.pop()
    if not any(line.strip() for line in lines):
        return None
    return _parse_table(path, lines)


def columns_of(kind: Kind) -> tuple[str, ...]:
    """The columns a results file of ``kind`` has, in order."""
    return CERTIFY_COLUMNS if kind == "certify" else PREDICT_COLUMNS


def read_row_lines(path: PathLike, kind: Kind) -> list[str]:
    """The complete data lines of a results file we wrote (no header; a torn last line dropped),
    after checking its header is that of a ``kind`` file."""
    path = os.fspath(path)
    lines, terminated = _read_lines(path)
    if not terminated:
        lines.pop()
    header = "\t".join(columns_of(kind))
    if lines and lines[0] != header:
        raise UserError(f"{path}: its header {lines[0]!r} is not that of a {kind} results file ({header!r})")
    return [line for line in lines[1:] if line.strip()]


def read_done_indices(path: PathLike) -> set[int]:
    """Indices of the images already in a results file (see :func:`read_kept_rows`)."""
    table = read_kept_rows(path)
    return set() if table is None else set(table.idx.tolist())
