"""Writing results files (see :mod:`dmae_fast.results.format`) row by row.

Numbers that carry a guarantee are never rounded in its favour: the radius is written rounded down to 6 decimals
(Cohen's 3 significant digits can round it UP: 0.79964 -> 0.8), ``pA_lower`` rounded down to 10 decimals, the
PREDICT p-value rounded up."""

from __future__ import annotations

import datetime
import decimal
import os
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Callable, TextIO

from dmae_fast.base.errors import UserError
from dmae_fast.base.files import read_regular_file
from dmae_fast.results.format import (
    COLUMNS,
    MAX_RESULTS_BYTES,
    P_LOWER_DECIMALS,
    PARTIAL_SUFFIX,
    PVALUE_DIGITS,
    RADIUS_DECIMALS,
    Kind,
    Mode,
    PathLike,
)

SYNC_SECONDS = 1.0  # the most a power failure can take from a results file (see ResultsWriter)
_OPEN_MODES = {"new": "x", "append": "a", "overwrite": "w"}  # ResultsWriter's mode -> open()'s


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
    grid_radius: float | None = None  # the exact sequential test's certified grid radius (its own column)
    # an incremental run's columns (docs/certify.md): its paired samples' disagreements with the reference's class,
    # their upper bound, the reference's pA_lower, and the total failure probability
    disagreements: int | None = None
    zeta_upper: float | None = None
    reference_pA_lower: float | None = None
    alpha: float | None = None


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


def _fmt_text(value: str) -> str:
    if "\t" in value or "\n" in value or "\r" in value:
        raise ValueError(f"results field {value!r} contains a tab or a line break")
    return value


# Exact decimal arithmetic on a float's full expansion (at most 1,074 digits).
_EXACT = decimal.Context(prec=2000)


def floor_decimals(value: float, decimals: int) -> str:
    """``value`` (finite, >= 0) rounded DOWN to ``decimals`` places, e.g. 0.7999999 -> '0.799999'. Certified
    radii and lower confidence bounds are written this way: one read back is never above what was proven."""
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
    mantissa = exact.scaleb(-exponent, context=_EXACT).quantize(quantum, decimal.ROUND_CEILING, _EXACT)
    if mantissa >= 10:
        mantissa, exponent = decimal.Decimal(1).quantize(quantum), exponent + 1
    return f"{mantissa:f}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"


_FORMATTERS: dict[str, Callable[[object], str]] = {
    "radius": lambda v: floor_decimals(v, RADIUS_DECIMALS),
    "time": lambda v: str(datetime.timedelta(seconds=float(v))),
    "pA_lower": lambda v: floor_decimals(v, P_LOWER_DECIMALS),
    "pvalue": lambda v: ceil_significant(v, PVALUE_DIGITS),
    "sigma": lambda v: repr(float(v)),
    "procedure": lambda v: _fmt_text(str(v)),
}
_FORMATTERS["grid_radius"] = _FORMATTERS["radius"]  # written as radii are: rounded down
_FORMATTERS["reference_pA_lower"] = _FORMATTERS["pA_lower"]  # a lower bound: rounded down
_FORMATTERS["zeta_upper"] = lambda v: ceil_significant(v, PVALUE_DIGITS)  # an upper bound: rounded up
_FORMATTERS["alpha"] = _FORMATTERS["sigma"]


def _format_row(row: Row, columns: tuple[str, ...]) -> str:
    """One row's line: each column, in order, written by its formatter, integers as integers."""
    cells = [_FORMATTERS.get(name, lambda v: str(int(v)))(getattr(row, name)) for name in columns]
    return "\t".join(cells) + "\n"


class ResultsWriter:
    """Writes a results file row by row; use as a context manager.

    ``mode="new"`` refuses an existing file; ``"append"`` continues a file whose header matches (creating it if
    missing, dropping a last line cut off by a crash); ``"overwrite"`` writes ``path + ".partial"`` and renames it
    over ``path`` only when the ``with`` block ends without an exception. Each row reaches the operating system as
    it is written, the disk within ``SYNC_SECONDS`` and on close."""

    def __init__(self, path: PathLike, kind: Kind = "certify", mode: Mode = "new", extra: tuple[str, ...] = ()) -> None:
        if kind not in COLUMNS:
            raise ValueError(f"unknown results kind {kind!r}")
        self.path, self.kind, self.mode = os.fspath(path), kind, mode
        self._row_type = CertifyRow if kind == "certify" else PredictRow
        self.columns = COLUMNS[kind] + extra  # extra: the procedure's own columns (e.g. grid_radius)
        header = "\t".join(self.columns)
        if mode not in _OPEN_MODES:
            raise ValueError(f"unknown ResultsWriter mode {mode!r}")
        if mode == "overwrite" and os.path.isdir(self.path):
            raise UserError(f"{self.path} is a directory, not a results file")
        self._target = self.path + PARTIAL_SUFFIX if mode == "overwrite" else self.path
        needs_header = mode != "append" or _prepare_append(self.path, header, kind)
        self._file = self._open(self._target, _OPEN_MODES[mode])
        if needs_header:
            self._file.write(header + "\n")
        self._sync()

    def _open(self, path: str, how: str) -> TextIO:
        try:
            return open(path, how, encoding="utf-8", newline="\n")
        except FileExistsError:
            raise UserError(f"{path} exists; pass --overwrite to replace it or --resume to continue it") from None
        except FileNotFoundError:
            raise UserError(f"cannot create {path}: directory {os.path.dirname(path) or '.'} does not exist") from None
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
            raise TypeError(f"a {self.kind} results file takes {self._row_type.__name__}, got {type(row).__name__}")
        self._file.write(_format_row(row, self.columns))
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
    """Check an existing file's header and cut off an unterminated last line; whether the header must be written."""
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
        os.truncate(path, keep)
    return keep == 0
