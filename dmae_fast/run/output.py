"""Output and resume policy: what a run may do with ``--out`` (new, append, overwrite), what a
resumed run must agree on, which images are left to do, what an interrupted run keeps."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dmae_fast.base.errors import UserError
from dmae_fast.distributed.torchrun_env import restart_count
from dmae_fast.results.checks import check_kept_rows, dataset_labels
from dmae_fast.results.format import PARTIAL_SUFFIX, Mode, ResultsTable, read_kept_rows
from dmae_fast.results.parts import clear_parts, has_parts, merge_parts, parts_dir, replaces_out, replacing_seed
from dmae_fast.results.votes import kept_votes, votes_path

# Light modules only (no torch): the command checks --out before its slow imports.
from dmae_fast.run.config import CertifyConfig

if TYPE_CHECKING:
    from dmae_fast.results.writer import Row
    from dmae_fast.run.opened import OpenedRun
    from dmae_fast.run.reference import Reference

RECOUNTED = {"certify": ("predict", "n0", "n", "nA"), "predict": ("predict", "n", "count1", "count2")}  # by kind
RECOUNT_ROWS = 3  # kept rows a resumed run counts again (another seed matches one with p ~ 1 / (2.5 sd of nA))


def check_out_directory(out: Path) -> None:
    if out.is_dir():
        raise UserError(f"--out {out} is a directory; name a results file")
    if not out.parent.is_dir():
        raise UserError(f"directory of --out {out} does not exist")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise UserError(f"cannot write --out {out}: directory {out.parent} is not writable")

def check_out_before_loading(config: CertifyConfig) -> None:
    """Refuse an ``--out`` this run must not write before anything is loaded: a directory, a missing
    or unwritable directory, an existing results file or parts without --overwrite or --resume. A
    resumed (or restarted) run's record is checked once its settings are resolved."""
    if config.output.resume or restart_count():
        check_out_directory(Path(config.output.out))
    else:
        output_mode(config)

def kept_after_interrupt(config: CertifyConfig, mode: str, finished: int) -> str:
    """What an interrupted run leaves on disk, and how to continue."""
    if mode == "overwrite":
        return (f"{config.output.out} is unchanged; this run's rows ({finished}) are in {config.output.out}.partial "
                "(not resumable: run again with --overwrite)")
    kept = "1 new row is" if finished == 1 else f"{finished} new rows are"
    return (f"{kept} in {config.output.out} (run record marked interrupted); continue with the same "
            "command and --resume")

def output_mode(config: CertifyConfig) -> Mode:
    """How this run treats ``--out``: "new", "append" (--resume, or a torchrun restart of this job)
    or "overwrite"; refuses what it must not touch."""
    out = Path(config.output.out)
    check_out_directory(out)
    if config.output.resume or (restart_count() > 0 and not config.output.overwrite):
        if has_parts(out) and replaces_out(out):
            raise UserError(f"{parts_dir(out)} holds rows of an --overwrite run that did not finish; "
                            "run it again with --overwrite")
        if out.exists() or has_parts(out):
            _check_resumable(config)
        return "append"  # a run stopped before its first row: nothing to check, start it
    if out.exists() and not config.output.overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it or --resume to continue it")
    if has_parts(out) and not config.output.overwrite:
        raise UserError(f"{parts_dir(out)} holds the rows of an unfinished multi-process run on {out}; pass "
                        "--resume to continue it or --overwrite to start over")
    return "overwrite" if config.output.overwrite else "new"

def record_path(config: CertifyConfig) -> Path:
    return Path(config.output.out + ".json")

def run_seed(config: CertifyConfig, mode: Mode, parts: bool) -> int:
    """The run's noise seed: ``--seed``; else that of the rows it continues (the run record's, or for a torchrun
    restart of an --overwrite run its parts'); else a fresh 64-bit seed from the operating system."""
    out = config.output.out
    if config.procedure.seed is not None:
        return config.procedure.seed
    if mode == "append" and (Path(out).exists() or has_parts(out)):
        seed = _recorded_settings(config).get("seed")
        if isinstance(seed, bool) or not (isinstance(seed, int) and 0 <= seed < 2**64):
            raise UserError(f"--resume: the run record {record_path(config)} names no noise seed ({seed!r})")
        return seed
    if mode == "overwrite" and parts and restart_count() > 0 and has_parts(out) and replaces_out(out):
        return replacing_seed(out)
    return secrets.randbits(64)

def check_continued_classifier(config: CertifyConfig, mode: Mode, model_sha256: str,
                               reference: Reference | None = None) -> None:
    """Refuse to continue rows made by another classifier file than ``model_sha256`` (the run record's), or, in an
    incremental run, against another reference run than ``reference``."""
    out = config.output.out
    if mode != "append" or not (Path(out).exists() or has_parts(out)):
        return
    record = _record(config)
    recorded = record.get("model_sha256")
    if recorded != model_sha256:
        raise UserError(f"--resume: {config.classifier.engine_path} is not the classifier file the rows of {out} were "
                        f"made with (SHA-256 {str(model_sha256)[:12]}..., the record says {str(recorded)[:12]}...)")
    if reference is not None and (record.get("reference") or {}).get("results_sha256") != reference.results_sha256:
        raise UserError(f"--resume: {reference.where} is not the reference run the rows of {out} were made against "
                        "(its results' SHA-256 differs from the run record's)")

def _record(config: CertifyConfig) -> dict:
    """The run record of the rows this run continues."""
    sidecar = record_path(config)
    try:
        record = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        raise UserError(f"--resume needs the run record {sidecar} written beside {config.output.out}") from None
    if not isinstance(record, dict):
        raise UserError(f"--resume: the run record {sidecar} is not a record")
    return record

def _recorded_settings(config: CertifyConfig) -> dict:
    recorded = _record(config).get("config")
    if not isinstance(recorded, dict):
        raise UserError(f"--resume: the run record {record_path(config)} holds no settings")
    return recorded

def _check_resumable(config: CertifyConfig) -> None:
    sidecar = record_path(config)
    recorded = _recorded_settings(config)
    current = config.recorded()
    differing = [k for k in config.must_match() if _as_recorded(recorded.get(k)) != _as_recorded(current.get(k))]
    if differing:
        verb = "differs" if len(differing) == 1 else "differ"
        raise UserError(f"--resume: {', '.join(differing)} {verb} from the run recorded in {sidecar}")

def _as_recorded(value):
    """Settings as they read back from JSON (tuples become lists)."""
    return list(value) if isinstance(value, tuple) else value

def rows_file(config: CertifyConfig, mode: Mode) -> str:
    """Where the rows of this run go: ``--out``, or ``--out.partial`` until an --overwrite run completes."""
    return config.output.out + PARTIAL_SUFFIX if mode == "overwrite" else config.output.out

@dataclass(frozen=True)
class KeptRow:
    """A kept row that a resumed run recounts with its seed before it continues (:func:`check_recounted`)."""

    index: int
    values: dict[str, int]  # RECOUNTED's columns of the row


def rows_to_recount(kept: ResultsTable) -> list[KeptRow]:
    """The RECOUNT_ROWS kept rows whose counts depend most on the noise (most votes for the top class times against
    it: a row with every vote for one class reads the same under most seeds), later rows first among equals."""
    columns = RECOUNTED[kept.kind]
    values = np.stack([kept.predict if c == "predict" else kept.extra[c] for c in columns]).astype(np.int64)
    top = values[columns.index("nA" if kept.kind == "certify" else "count1")]
    spread = top * (values[columns.index("n")] - top)
    rows = np.lexsort((-np.arange(len(spread)), -spread))[:RECOUNT_ROWS]
    return [KeptRow(int(kept.idx[r]), {c: int(v) for c, v in zip(columns, values[:, r])}) for r in rows]


def check_recounted(config: CertifyConfig, kept: KeptRow, row: Row) -> None:
    """Refuse to continue rows that are not the recorded seed's: ``row`` is a kept row's image counted again with
    the seed the run record names, and must give the kept row's counts (an edited record would mix two noise
    streams under one seed)."""
    recounted = {column: int(getattr(row, column)) for column in kept.values}
    if recounted != kept.values:
        def said(values: dict[str, int]) -> str:
            return " ".join(f"{column} {value}" for column, value in values.items())

        raise UserError(f"--resume: image {kept.index} counted again with seed {config.procedure.seed} gives "
                        f"{said(recounted)}, its row in {config.output.out} says {said(kept.values)}: the kept rows "
                        f"were made with another seed than {record_path(config)} names (an edited run record); "
                        "restore the record, or start again with --overwrite")


def images_to_do(opened: OpenedRun, mode: Mode, parts: bool) -> tuple[list[int], list[KeptRow]]:
    """The images this run still has to certify, and the kept rows to count again (:func:`rows_to_recount`). Appending:
    the parts of an interrupted multi-process run are merged into ``--out`` and the kept rows checked. Overwriting:
    a torchrun restart of this job (with ``parts``) keeps the rows its killed attempt left in the parts; otherwise
    stale parts and partial files go."""
    config = opened.config
    target = rows_file(config, mode)
    if mode == "overwrite" and not (parts and restart_count() > 0):
        clear_parts(config.output.out)
        with contextlib.suppress(FileNotFoundError):
            os.remove(target)
    if mode == "new" or not (has_parts(config.output.out) or os.path.exists(target)):
        return opened.indices, []
    if has_parts(config.output.out):
        merge_parts(config.output.out, opened.kind, into=target, extra=opened.procedure.columns)
    kept = read_kept_rows(target)
    if kept is None or len(kept) == 0:
        return opened.indices, []
    check_kept_rows(kept, opened.indices, dataset_labels(opened.dataset, opened.indices), opened.procedure.rules())
    if config.output.keep_votes is not None:
        kept_votes(votes_path(config.output.out), config.output.keep_votes, set(kept.idx.tolist()))
    done = set(kept.idx.tolist())
    # a torchrun restart of an --overwrite run continues its own parts: their seed is the parts' own
    recount = rows_to_recount(kept) if mode == "append" else []
    return [i for i in opened.indices if i not in done], recount
