"""Summaries of results files: certified accuracy, ACR, tables and plots."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Sequence

import numpy as np

from dmae_fast.base.errors import UserError
from dmae_fast.base.files import read_regular_file
from dmae_fast.model.config import MAX_SIGMA
from dmae_fast.results.checks import BELOW_ONE, COUNT_COLUMNS, row_problems
from dmae_fast.results.format import RADIUS_DECIMALS, ResultsTable
from dmae_fast.stats.bounds import radius as certified_radius
from dmae_fast.stats.decisions import ABSTAIN
from dmae_fast.stats.radii import RADIUS_STEP
from dmae_fast.stats.rules import RowRules

if TYPE_CHECKING:
    from dmae_fast.stats.procedure import Procedure

DEFAULT_RADII: tuple[float, ...] = tuple(RADIUS_STEP * i for i in range(13))
PLOT_RADIUS_STEP = 0.01
PLOT_FORMATS = (".png", ".pdf")
# No certificate states more: sigma <= MAX_SIGMA (100, the most dmae-certify accepts; images are in [0, 1])
# times Phi^-1 of the largest pA_lower below 1 (820.95), rounded up to 821 as Cohen's 3 digits write it.
RADIUS_CEILING = float(math.ceil(certified_radius(BELOW_ONE, MAX_SIGMA)))
MAX_RECORD_BYTES = 16 * 2**20  # a run record is a few KiB

Style = Literal["text", "markdown", "latex"]


def _first_few(values: Sequence[object] | np.ndarray) -> str:
    """'3, 8, 9 (+2 more)': the first five of ``values``."""
    return ", ".join(map(str, values[:5])) + (f" (+{len(values) - 5} more)" if len(values) > 5 else "")


def _require_rows(table: ResultsTable) -> None:
    """Refuse no rows, repeated images, an inconsistent ``correct``, abstains above radius 0, radii over the ceiling."""
    if len(table) == 0:
        raise UserError(f"{table.path} has a header but no result rows")
    repeated = table.duplicate_indices()
    if repeated:
        raise UserError(f"{table.path}: image idx {_first_few(repeated)} appear(s) in more than one row; every image "
                        "must be counted once (remove the repeated rows)")
    inconsistent = np.flatnonzero(table.correct != ((table.predict == table.label) & (table.predict != ABSTAIN)))
    if table.radius is not None:
        inconsistent = np.union1d(inconsistent, np.flatnonzero((table.predict == ABSTAIN) & (table.radius > 0)))
    if inconsistent.size:
        row = int(inconsistent[0])
        raise UserError(f"{table.path}: the row of image idx {table.idx[row]} contradicts itself (correct must be "
                        "1 exactly when predict == label, and an abstain (-1) has radius 0)")
    if table.radius is not None:
        beyond = np.flatnonzero(table.radius > RADIUS_CEILING)
        if beyond.size:
            raise UserError(f"{table.path}: {beyond.size} row(s) state a radius above {RADIUS_CEILING:g}, more than "
                            f"any certificate can (sigma <= {MAX_SIGMA:g}): idx {_first_few(table.idx[beyond])}")


def run_record(table: ResultsTable) -> tuple[dict | None, str]:
    """The run record ``<file>.json`` beside a results file, or None and why (missing, unreadable, too large, not
    a JSON object)."""
    path = f"{table.path}.json"
    if not os.path.exists(path):
        return None, f"there is no run record {path}"
    try:
        record = json.loads(read_regular_file(path, MAX_RECORD_BYTES, "run record").decode("utf-8"))
    except UserError as exc:
        return None, str(exc)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, f"{path} is not JSON"
    if not isinstance(record, dict):
        return None, f"{path} is not a run record"
    return record, ""


def recorded_procedure(table: ResultsTable, record: dict) -> tuple[Procedure | None, str]:
    """The procedure of the run a record describes, rebuilt from its settings as ``--resume`` builds it; None, and
    why, when it cannot be rebuilt, its settings give another procedure than its ``procedure`` field names, or the
    rows name another."""
    from dmae_fast.run.config import CertifyConfig
    from dmae_fast.stats.procedure import Procedure

    path = f"{table.path}.json"
    try:
        settings = {key: tuple(v) if isinstance(v, list) else v for key, v in record["config"].items()}
        config = CertifyConfig.from_settings(settings)
        config.validate()
        procedure = Procedure(config.procedure_spec())
    except (KeyError, AttributeError, TypeError, ValueError, ArithmeticError, UserError):
        return None, f"{path} holds no settings this version can rebuild the procedure from"
    if procedure.name != record.get("procedure"):
        return None, (f"the settings in {path} give procedure {procedure.name}, its procedure field says "
                      f"{record.get('procedure')}")
    named = sorted(set(map(str, table.extra["procedure"]))) if "procedure" in table.extra else [table.kind]
    if procedure.kind != table.kind or procedure.name not in named:
        return None, f"{path} is for procedure {procedure.name}, the rows name {', '.join(named)}"
    return procedure, ""


def check_rows(table: ResultsTable) -> str | None:
    """Refuse (UserError, one line) a results file with a row its run cannot have written; a one-line warning when
    its rows could only be checked without their run record, else None. Rows with counts (dmae-certify's) are
    checked as ``--resume`` checks them, under the procedure rebuilt from the run record ``<file>.json``, else by
    what they prove at any alpha; every file gets the range checks of every summary (:func:`_require_rows`)."""
    if not any(name in table.extra for name in COUNT_COLUMNS[table.kind]):
        _require_rows(table)
        return None
    record, why = run_record(table)
    procedure, why = recorded_procedure(table, record) if record is not None else (None, why)
    rules = procedure.rules() if procedure is not None else None
    bad = list(row_problems(table, rules or RowRules.unknown(table.kind)))
    if bad:
        (row, problem), others = bad[0], [other for other, _ in bad[1:]]
        basis = (f"against their run record {table.path}.json (those --resume makes)" if rules
                 else f"of what their counts alone prove at any alpha ({why})")
        also = f"; so do idx {_first_few(table.idx[others])}" if others else ""
        raise UserError(f"{table.path}: {len(bad)} of {len(table)} rows fail the checks {basis}: the row of image "
                        f"idx {table.idx[row]} {problem}{also}; the file was edited or its rows come from another run")
    _require_rows(table)
    if rules is None:
        return (f"{table.path}: rows checked without their run record ({why}): only what their counts prove at any "
                "alpha, not the run's own settings")
    return None


def rounding_warning(table: ResultsTable) -> str | None:
    """A one-line caveat for files whose radii may have been rounded up, else None."""
    if not table.coarse_radii:
        return None
    return (f"{table.path}: radii are not written rounded down to {RADIUS_DECIMALS} decimals (Cohen et al.'s "
            "3-significant-digit format, or an older dmae-certify); a radius may be rounded UP by half a unit in "
            "its last digit, so certified accuracy at a radius just above a written value can be overstated")


def _certified_radii(table: ResultsTable) -> np.ndarray:
    if table.radius is None:
        raise UserError(f"{table.path} is a prediction file; it has no certified radii")
    _require_rows(table)
    return table.radius


def certified_accuracy(table: ResultsTable, radii: Sequence[float] | np.ndarray) -> np.ndarray:
    """Fraction of rows that are correct with certified radius >= r, for each r in radii."""
    radius = _certified_radii(table)
    certified = np.sort(radius[table.correct == 1])
    r = np.asarray(radii, dtype=np.float64).reshape(-1)
    return (certified.size - np.searchsorted(certified, r, side="left")) / len(table)


def average_certified_radius(table: ResultsTable) -> float:
    """Mean of ``correct * radius`` (ACR); abstains and errors count as radius 0."""
    radius = _certified_radii(table)
    return float(np.mean(table.correct * radius))


def clean_accuracy(table: ResultsTable) -> float:
    """Fraction of rows whose (smoothed) prediction is correct."""
    _require_rows(table)
    return float(np.mean(table.correct))


def abstain_rate(table: ResultsTable) -> float:
    """Fraction of rows where the smoothed classifier abstained."""
    _require_rows(table)
    return float(np.mean(table.predict == ABSTAIN))


def _escape(text: str, style: Style) -> str:
    if style == "markdown":
        return text.replace("|", r"\|")
    if style == "latex":
        special = {"\\": r"\textbackslash{}", "~": r"\textasciitilde{}",
                   "^": r"\textasciicircum{}", **{c: "\\" + c for c in "&%$#_{}"}}
        return "".join(special.get(c, c) for c in text)
    return text


def _render(header: list[str], rows: list[list[str]], style: Style) -> str:
    if style == "markdown":
        lines = [header, [":---"] + ["---:"] * (len(header) - 1), *rows]
        return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)
    if style == "latex":
        lines = [" & ".join(cells) + r" \\" for cells in [header, *rows]]
        return "\n".join([r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}", r"\toprule", lines[0], r"\midrule",
                          *lines[1:], r"\bottomrule", r"\end{tabular}"])
    widths = [max(len(cells[i]) for cells in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join([cells[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def reachable_radii(radii: Sequence[float], cap: float | None) -> tuple[list[float], str | None]:
    """(the radii at most ``cap``, the largest radius the run could certify (sigma * Phi^-1(alpha^(1/n)); None:
    unknown), a one-line note on those left out or None): a column above it would be 0% by construction."""
    kept = [r for r in radii if cap is None or r <= cap]
    left = ", ".join(f"{r:g}" for r in radii if cap is not None and r > cap)
    return kept, (f"radii above {cap:.3f} (the largest radius n samples can certify at the run's alpha) cannot be "
                  f"certified by this run and are not listed: {left}" if left else None)


def recorded_cap(table: ResultsTable) -> float | None:
    """The largest radius the run behind a results file could certify, from the procedure its run record's settings
    rebuild (None where they do not); UserError when the record's ``max_radius`` says otherwise (an edited record
    would hide the summary's columns)."""
    record, _ = run_record(table)
    procedure, _ = recorded_procedure(table, record) if record is not None else (None, "")
    if procedure is None:
        return None
    cap, written = procedure.max_radius(), record.get("max_radius")
    if cap is None:  # not known from the settings alone (an incremental run's is its reference's)
        return None
    edited = isinstance(written, bool) or not isinstance(written, (int, float)) or not math.isclose(written, cap,
                                                                                                 rel_tol=1e-9)
    if written is not None and edited:  # an older record may lack it
        raise UserError(f"{table.path}.json: its max_radius {written!r} is not the largest radius its procedure "
                        f"{procedure.name} can certify ({cap:.6f}): an edited run record")
    return cap


def _names(tables: Sequence[ResultsTable], labels: Sequence[str] | None) -> list[str]:
    names = list(labels) if labels is not None else [t.name for t in tables]
    if len(names) != len(tables):
        raise UserError(f"got {len(names)} labels for {len(tables)} results files")
    return names


def format_table(tables: Sequence[ResultsTable], radii: Sequence[float] = DEFAULT_RADII,
                 style: Style = "text", labels: Sequence[str] | None = None) -> str:
    """One row per file (named by ``labels``, else the file stem): certified accuracy (%) at each radius and ACR
    for certification files; then, after a blank line, clean accuracy (%) and abstain rate (%) for prediction files."""
    if style not in ("text", "markdown", "latex"):
        raise ValueError(f"unknown table style {style!r}")
    names = [_escape(name, style) for name in _names(tables, labels)]
    radius_header = [f"$r={r:g}$" if style == "latex" else f"r={r:g}" for r in radii]
    certify_rows = [[name, *(f"{100 * a:.1f}" for a in certified_accuracy(t, radii)),
                     f"{average_certified_radius(t):.3f}"] for name, t in zip(names, tables) if t.kind == "certify"]
    predict_rows = [[name, f"{100 * clean_accuracy(t):.1f}", f"{100 * abstain_rate(t):.1f}"]
                    for name, t in zip(names, tables) if t.kind == "predict"]
    percent = r"\%" if style == "latex" else "%"
    sections = [(["file", *radius_header, "ACR"], certify_rows),
                (["file", f"accuracy ({percent})", f"abstain ({percent})"], predict_rows)]
    return "\n\n".join(_render(header, rows, style) for header, rows in sections if rows)


def plot_certified_accuracy(tables: Sequence[ResultsTable], out_path: str | os.PathLike[str],
                            labels: Sequence[str] | None = None) -> None:
    """Plot certified accuracy against radius, one step curve per file, to a PNG or PDF (overwritten); the
    radius grid has step 0.01 and ends at the largest radius in the data plus 0.25."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_path)
    if out.suffix.lower() not in PLOT_FORMATS:
        raise UserError(f"{out}: plot file name must end in {' or '.join(PLOT_FORMATS)}")
    if not out.parent.is_dir():
        raise UserError(f"cannot write {out}: directory {out.parent} does not exist")
    if not tables:
        raise UserError("no results files to plot")
    names = _names(tables, labels)
    max_radius = max(float(_certified_radii(t).max()) for t in tables) + 0.25
    grid = np.arange(int(max_radius / PLOT_RADIUS_STEP + 1e-9) + 1) * PLOT_RADIUS_STEP
    fig = Figure(figsize=(6.4, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    curves = [ax.step(grid, certified_accuracy(t, grid), where="post")[0] for t in tables]
    ax.legend(curves, names)
    ax.set(xlabel=r"radius ($\ell_2$)", ylabel="certified accuracy", xlim=(0.0, float(grid[-1])), ylim=(0.0, 1.0))
    ax.grid(True, alpha=0.4)
    try:
        fig.savefig(out, dpi=150)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
