"""``dmae-certify analyze`` believes no row: each is checked against its counts and, through the run
record beside the file, against the procedure that made it (the checks ``--resume`` makes); Cohen et
al.'s rows are range-checked; only regular files of bounded size are read."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import one_line_error, run_command

from dmae_fast.analysis import DEFAULT_RADII, RADIUS_CEILING, format_table, reachable_radii, recorded_cap
from dmae_fast.batching.stream import ImageCounts
from dmae_fast.cli.analyze import main as analyze_main
from dmae_fast.results import format as results_format
from dmae_fast.results.format import read_results
from dmae_fast.results.writer import ResultsWriter
from dmae_fast.run.config import CertifyConfig
from dmae_fast.run.record import result_row
from dmae_fast.stats.procedure import Procedure

CLASSES = 10
# (idx, label, class selected, its votes, samples used; the other votes go to the next class).
# Fixed n: certified at nA 1990/2000, abstaining, unanimous, certified but wrong. Sequential rows stop
# at a look: 600/600 reaches radius 0.5 exactly (599 would not), 1000/2000 abstains, 1500/2000
# certifies radius 0. PREDICT: decided, and abstaining at 1020 against 980.
ROWS = {"fixed": [(0, 3, 3, 1990, 2000), (1, 5, 5, 900, 2000), (2, 7, 7, 2000, 2000), (3, 1, 4, 1995, 2000)],
        "sequential": [(0, 3, 3, 600, 600), (1, 5, 5, 1000, 2000), (2, 7, 7, 1500, 2000)],
        "predict": [(0, 3, 3, 1990, 2000), (1, 5, 5, 1020, 2000)]}


def _run_file(directory: Path, kind: str) -> Path:
    """A results file and its run record as dmae-certify writes them, from chosen counts."""
    path = directory / f"{kind}.tsv"
    config = CertifyConfig.from_settings(dict(seed=0,
                                              engine="demo", data="demo", out=str(path), sigma=0.25, n0=20, n=2000,
                                              alpha=0.001, sequential=kind == "sequential", predict=kind == "predict"))
    procedure = Procedure(config.procedure_spec())
    predict = kind == "predict"
    with ResultsWriter(path, kind=procedure.kind) as writer:
        for idx, label, top, n_a, n in ROWS[kind]:
            counts = np.zeros((len(procedure.plan.phases), CLASSES), dtype=np.int64)
            counts[:, top] = (n_a,) if predict else (20, n_a)
            counts[-1, (top + 1) % CLASSES] = n - n_a
            writer.write(result_row(procedure, ImageCounts(idx, label, counts), 0.5))
    record = {"config": config.recorded(), "procedure": procedure.name, "max_radius": procedure.max_radius()}
    Path(f"{path}.json").write_text(json.dumps(record, indent=2))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("runs")
    return {kind: _run_file(directory, kind) for kind in ROWS}


def _copy(source: Path, directory: Path, record: bool = True) -> Path:
    out = directory / source.name
    out.write_bytes(source.read_bytes())
    if record:
        Path(f"{out}.json").write_bytes(Path(f"{source}.json").read_bytes())
    return out


def _edit(path: Path, idx: int, column: str, change) -> None:
    lines = [line.split("\t") for line in path.read_text().splitlines()]
    at = lines[0].index(column)
    row = next(cells for cells in lines[1:] if cells[0] == str(idx))
    row[at] = change(row[at])
    path.write_text("".join("\t".join(cells) + "\n" for cells in lines))


def _refused(capsys: pytest.CaptureFixture[str], args: list[str], *mentions: str) -> str:
    return one_line_error(run_command(analyze_main, capsys, *args), "dmae-certify analyze", *mentions)


EDITS = {  # the edits of issue 39 item 3 that analyze believed: (column, change, what the refusal names)
    "radius 1e308": ("radius", lambda v: "1e308", "has radius 1e+308"),
    "radius raised to 0.75": ("radius", lambda v: "0.750000", "has radius 0.75,"),  # sequential: from 0.5
    "radius lowered": ("radius", lambda v: "0.250000", "has radius 0.25,"),
    "radius + 1e-6": ("radius", lambda v: f"{float(v) + 1e-6:.6f}", "has radius"),
    "nA - 1": ("nA", lambda v: str(int(v) - 1), "its counts give"),
}


@pytest.mark.parametrize("kind", ["fixed", "sequential"])
@pytest.mark.parametrize("edit", EDITS)
def test_analyze_refuses_a_row_its_run_cannot_have_written(tmp_path, capsys, files, kind, edit):
    """One edited row refuses the file, checked against the procedure its run record rebuilds."""
    out = _copy(files[kind], tmp_path)
    column, change, named = EDITS[edit]
    _edit(out, 0, column, change)
    rows = len(read_results(out))
    _refused(capsys, [str(out)], str(out), f"1 of {rows} rows", "idx 0 ", "run record", named)


@pytest.mark.parametrize("kind", ["fixed", "sequential"])
def test_a_genuine_file_gives_the_same_table_as_before(capsys, files, kind):
    path = files[kind]
    assert analyze_main([str(path)]) == 0
    out, err = capsys.readouterr()
    table = read_results(path)
    radii, note = reachable_radii(list(DEFAULT_RADII), recorded_cap(table))
    assert out == format_table([table], radii) + "\n" + (f"{note}\n" if note else "")
    assert err == ""
    acr = float(out.splitlines()[2].split()[-1])
    certified = [r for r, c in zip(table.radius, table.correct) if c]  # by hand: correct rows' radii / rows
    assert acr == pytest.approx(sum(certified) / len(table), abs=5e-4) and 0 < acr < 1


@pytest.mark.parametrize("record", ["missing", "not JSON", "another procedure"])
def test_without_a_usable_record_rows_are_checked_by_their_counts_alone(tmp_path, capsys, files, record):
    """What rows alone prove at any alpha: a radius above sigma * Phi^-1(pA_lower) is refused; a
    genuine file passes, with one warning line saying its run record was not used."""
    for kind, edited in (("fixed", "1e308"), ("sequential", "0.750000")):  # sequential: from 0.5
        out = _copy(files[kind], tmp_path, record=record != "missing")
        sidecar = Path(f"{out}.json")
        if record == "not JSON":
            sidecar.write_text("{")
        elif record == "another procedure":
            sidecar.write_text(sidecar.read_text().replace('"sequential": true', '"sequential": false')
                               if kind == "sequential" else
                               sidecar.read_text().replace('"sequential": false', '"sequential": true'))
        assert analyze_main([str(out)]) == 0
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and "without their run record" in lines[0] and str(out) in lines[0]
        _edit(out, 0, "radius", lambda v: edited)  # noqa: B023 (called at once)
        _refused(capsys, [str(out)], "idx 0 ", "at any alpha", "the most its pA_lower proves")


@pytest.mark.parametrize("kind", ["fixed", "sequential"])
@pytest.mark.parametrize("written", [0, -1, 0.5 + 1e-6, True, "3"])
def test_an_edited_max_radius_is_refused_not_obeyed(tmp_path, capsys, files, kind, written):
    """The record's max_radius decides which summary columns are left out: edited (0 or -1 hid every column), it is
    named in one line; the cap analyze uses is the one the record's procedure gives (issue 56, item 4)."""
    out = _copy(files[kind], tmp_path)
    sidecar = Path(f"{out}.json")
    record = json.loads(sidecar.read_text())
    assert recorded_cap(read_results(out)) == record["max_radius"]
    record["max_radius"] = written
    sidecar.write_text(json.dumps(record))
    _refused(capsys, [str(out)], f"{out}.json", f"max_radius {written!r}", "edited run record")


def test_the_warning_names_the_mismatch_it_found(tmp_path, capsys, files):
    """A record whose settings give another procedure than its procedure field: the warning says exactly that."""
    out = _copy(files["sequential"], tmp_path)
    sidecar = Path(f"{out}.json")
    record = json.loads(sidecar.read_text())
    record["config"]["sequential"] = False
    sidecar.write_text(json.dumps(record))
    assert analyze_main([str(out)]) == 0
    (warning,) = capsys.readouterr().err.splitlines()
    assert f"the settings in {out}.json give procedure cohen-fixed-n, its procedure field says " \
           f"{record['procedure']}" in warning, warning


def test_a_predict_file_is_checked_against_its_record(tmp_path, capsys, files):
    out = _copy(files["predict"], tmp_path)
    assert analyze_main([str(out)]) == 0
    assert capsys.readouterr().err == ""
    _edit(out, 1, "predict", lambda v: "5")  # abstained at p-value > alpha; now claims the class
    _edit(out, 1, "correct", lambda v: "1")
    _refused(capsys, [str(out)], "idx 1 ", "p-value abstains")


COHEN = "idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t3\t3\t0.512\t1\t0:00:01\n1\t8\t-1\t0.0\t0\t0:00:01\n"


def test_cohen_files_are_range_checked(tmp_path, capsys):
    """No certificate states a radius above 100 * Phi^-1(the largest double below 1), rounded up: 821."""
    assert RADIUS_CEILING == 821
    good = tmp_path / "cohen.tsv"
    good.write_text(COHEN + f"2\t4\t4\t{RADIUS_CEILING:g}\t1\t0:00:01\n")
    assert analyze_main([str(good)]) == 0
    assert "run record" not in capsys.readouterr().err
    bad = tmp_path / "cohen_bad.tsv"
    bad.write_text(COHEN + "2\t4\t4\t1e308\t1\t0:00:01\n3\t4\t4\t900\t1\t0:00:01\n")
    _refused(capsys, [str(bad)], str(bad), "2 row(s)", "above 821", "idx 2, 3")


# --------------------------------------------------------------------------- only regular files, bounded


def test_a_device_or_a_directory_is_refused(tmp_path, capsys):
    _refused(capsys, ["/dev/zero"], "/dev/zero is not a regular file")
    _refused(capsys, [str(tmp_path)], "is a directory")


def _in_a_thread(args: list[str], fifo: Path) -> list[int]:
    """analyze's exit status, with a hang guard: a reader still blocked on ``fifo`` is let go."""
    status: list[int] = []
    reader = threading.Thread(target=lambda: status.append(analyze_main(args)), daemon=True)
    reader.start()
    reader.join(300)  # refusing takes milliseconds
    if reader.is_alive():  # a writer that opens and closes the FIFO ends the blocked read, then the test fails
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(300)
    return status


def test_a_fifo_is_refused_without_hanging(tmp_path, capsys):
    fifo = tmp_path / "rows.tsv"
    os.mkfifo(fifo)
    assert _in_a_thread([str(fifo)], fifo) == [2]
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "rows.tsv is not a regular file" in err


def test_a_fifo_as_the_run_record_is_not_read(tmp_path, capsys, files):
    out = _copy(files["fixed"], tmp_path, record=False)
    os.mkfifo(f"{out}.json")
    assert _in_a_thread([str(out)], Path(f"{out}.json")) == [0]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "without their run record" in err[0] and "json is not a regular file" in err[0]


def test_a_file_beyond_the_size_limit_is_refused_unread(tmp_path, capsys, monkeypatch, files):
    monkeypatch.setattr(results_format, "MAX_RESULTS_BYTES", 100)
    _refused(capsys, [str(files["fixed"])], "larger than", "MiB")
