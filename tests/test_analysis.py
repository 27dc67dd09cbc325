"""Results files, certified-accuracy analysis and the ``analyze`` command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import one_line_error, run_command

from dmae_fast.analysis import (
    DEFAULT_RADII,
    abstain_rate,
    average_certified_radius,
    certified_accuracy,
    clean_accuracy,
    format_table,
)
from dmae_fast.base.errors import UserError
from dmae_fast.cli.analyze import main as analyze_main
from dmae_fast.results.format import read_kept_rows, read_results
from dmae_fast.results.writer import CertifyRow, PredictRow, ResultsWriter

# Written by hand in the format of Cohen et al.'s certify.py. Correct rows: 0, 1, 4, 5, 7
# with radii 0.512, 1.23, 0.25, 2.51, 0.0412; rows 2 and 6 abstain; row 3 is wrong but
# has a positive radius, which must not count.
REFERENCE_CERTIFY = (
    "idx\tlabel\tpredict\tradius\tcorrect\ttime\n"
    "0\t3\t3\t0.512\t1\t0:00:01.234567\n"
    "10\t8\t8\t1.23e+00\t1\t0:00:02\n"
    "20\t8\t-1\t0.0\t0\t0:00:01.100000\n"
    "30\t0\t6\t0.734\t0\t0:00:01.300000\n"
    "40\t6\t6\t0.25\t1\t0:00:01.000001\n"
    "50\t1\t1\t2.51\t1\t0:00:01.500000\n"
    "60\t1\t-1\t0.0\t0\t0:00:00.900000\n"
    "70\t4\t4\t0.0412\t1\t1 day, 0:00:01.500000\n"
)
# Certified accuracy in percent at DEFAULT_RADII, counted by hand from the rows above.
EXPECTED_PERCENT = [62.5, 50.0, 37.5, 25.0, 25.0, 12.5, 12.5, 12.5, 12.5, 12.5, 12.5, 0.0, 0.0]
EXPECTED_ACR = 0.5679  # (0.512 + 1.23 + 0.25 + 2.51 + 0.0412) / 8

REFERENCE_PREDICT = (
    "idx\tlabel\tpredict\tcorrect\ttime\n"
    "0\t3\t3\t1\t0:00:00.500000\n"
    "1\t8\t-1\t0\t0:00:00.400000\n"
    "2\t8\t1\t0\t0:00:00.450000\n"
    "3\t0\t0\t1\t0:00:00.520000\n"
)


def kept_indices(path: Path) -> set[int]:
    """The indices of the rows a resume keeps."""
    table = read_kept_rows(path)
    return set() if table is None else set(table.idx.tolist())


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def reference_certify(tmp_path: Path) -> Path:
    return _write(tmp_path / "cohen_sigma025.tsv", REFERENCE_CERTIFY)


@pytest.fixture
def reference_predict(tmp_path: Path) -> Path:
    return _write(tmp_path / "cohen_predict.tsv", REFERENCE_PREDICT)


def _certify_row(idx: int, radius: float = 0.51234, predict: int = 3) -> CertifyRow:
    return CertifyRow(idx=idx, label=3, predict=predict, radius=radius,
                      correct=int(predict == 3), time=1.2345678, n0=100, n=100000,
                      nA=99123, pA_lower=0.9901234567, sigma=0.25, procedure="cohen")


# --- reading the reference format and the metrics -------------------------------------

def test_reference_certify_file_metrics(reference_certify: Path) -> None:
    table = read_results(reference_certify)
    assert table.kind == "certify"
    assert table.idx.tolist() == [0, 10, 20, 30, 40, 50, 60, 70]
    assert table.predict.tolist() == [3, 8, -1, 6, 6, 1, -1, 4]
    assert table.correct.tolist() == [1, 1, 0, 0, 1, 1, 0, 1]
    assert table.radius.tolist() == [0.512, 1.23, 0.0, 0.734, 0.25, 2.51, 0.0, 0.0412]
    assert table.time[0] == pytest.approx(1.234567)
    assert table.time[1] == pytest.approx(2.0)
    assert table.time[7] == pytest.approx(86401.5)
    assert table.extra == {}

    acc = certified_accuracy(table, [0.0, 0.25, 0.5, 0.6, 0.75, 1.23, 1.25, 2.51, 2.52, 3.0])
    np.testing.assert_allclose(
        acc, [0.625, 0.5, 0.375, 0.25, 0.25, 0.25, 0.125, 0.125, 0.0, 0.0])
    np.testing.assert_allclose(100 * certified_accuracy(table, DEFAULT_RADII),
                               EXPECTED_PERCENT)
    assert average_certified_radius(table) == pytest.approx(EXPECTED_ACR)
    assert clean_accuracy(table) == pytest.approx(0.625)
    assert abstain_rate(table) == pytest.approx(0.25)


def test_reference_predict_file(reference_predict: Path) -> None:
    table = read_results(reference_predict)
    assert table.kind == "predict"
    assert table.radius is None
    assert clean_accuracy(table) == pytest.approx(0.5)
    assert abstain_rate(table) == pytest.approx(0.25)
    with pytest.raises(UserError, match="prediction file"):
        certified_accuracy(table, [0.0])


def test_format_table_styles(reference_certify: Path, reference_predict: Path) -> None:
    tables = [read_results(reference_certify), read_results(reference_predict)]
    text = format_table(tables, [0.0, 0.5, 1.25])
    assert "cohen_sigma025" in text and "62.5" in text and "37.5" in text
    assert "12.5" in text and "0.568" in text
    markdown = format_table(tables, [0.0, 0.5, 1.25], style="markdown")
    assert "| cohen_sigma025 | 62.5 | 37.5 | 12.5 | 0.568 |" in markdown
    assert "| cohen_predict | 50.0 | 25.0 |" in markdown
    latex = format_table(tables[:1], [0.0, 0.5], style="latex")
    assert r"cohen\_sigma025 & 62.5 & 37.5 & 0.568 \\" in latex
    assert latex.startswith(r"\begin{tabular}{lrrr}")


# --- writing ---------------------------------------------------------------------------

def test_certify_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "out.tsv"
    with ResultsWriter(path, kind="certify") as writer:
        writer.write(_certify_row(0))
        writer.write(_certify_row(1, radius=0.0, predict=-1))
        # The row is on disk before the writer is closed.
        assert path.read_text().count("\n") == 3
    lines = path.read_text().splitlines()
    assert lines[0] == ("idx\tlabel\tpredict\tradius\tcorrect\ttime\tn0\tn\tnA\tpA_lower"
                        "\tsigma\tprocedure")
    assert lines[1] == ("0\t3\t3\t0.512340\t1\t0:00:01.234568\t100\t100000\t99123\t0.9901234567"
                        "\t0.25\tcohen")
    table = read_results(path)
    assert table.kind == "certify"
    assert table.idx.tolist() == [0, 1]
    assert table.predict.tolist() == [3, -1]
    assert table.correct.tolist() == [1, 0]
    assert table.radius.tolist() == [0.51234, 0.0] and not table.coarse_radii
    np.testing.assert_allclose(table.time, [1.234568, 1.234568])
    assert table.extra["nA"].tolist() == [99123, 99123]
    assert table.extra["pA_lower"][0] == pytest.approx(0.9901234567, abs=1e-12)
    assert table.extra["procedure"].tolist() == ["cohen", "cohen"]
    assert kept_indices(path) == {0, 1}


def test_predict_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "pred.tsv"
    row = PredictRow(idx=7, label=2, predict=2, correct=1, time=0.25, n=1000, count1=990,
                     count2=4, pvalue=1.23456789e-250, sigma=0.5)
    with ResultsWriter(path, kind="predict") as writer:
        writer.write(row)
    assert path.read_text().splitlines() == [
        "idx\tlabel\tpredict\tcorrect\ttime\tn\tcount1\tcount2\tpvalue\tsigma",
        "7\t2\t2\t1\t0:00:00.250000\t1000\t990\t4\t1.23457e-250\t0.5",  # rounded up
    ]
    table = read_results(path)
    assert table.kind == "predict" and table.radius is None
    assert table.idx.tolist() == [7] and table.time.tolist() == [0.25]
    assert table.extra["count1"].tolist() == [990]
    assert table.extra["pvalue"][0] == pytest.approx(1.23457e-250)


def test_new_mode_refuses_existing_file(reference_certify: Path) -> None:
    with pytest.raises(UserError, match="exists; pass --overwrite to replace it or --resume"):
        ResultsWriter(reference_certify, kind="certify", mode="new")
    assert reference_certify.read_text() == REFERENCE_CERTIFY


def test_append_continues_and_checks_header(tmp_path: Path, reference_certify: Path) -> None:
    path = tmp_path / "resume.tsv"
    with ResultsWriter(path, kind="certify") as writer:
        writer.write(_certify_row(0))
    with open(path, "a") as f:
        f.write("1\t3\t3\t0.5")  # a row cut off by a crash: dropped on resume
    assert kept_indices(path) == {0}
    with ResultsWriter(path, kind="certify", mode="append") as writer:
        writer.write(_certify_row(2))
    assert read_results(path).idx.tolist() == [0, 2]

    with pytest.raises(UserError, match="header"):
        ResultsWriter(reference_certify, kind="certify", mode="append")
    with pytest.raises(UserError, match="header"):
        ResultsWriter(path, kind="predict", mode="append")
    assert reference_certify.read_text() == REFERENCE_CERTIFY


def test_overwrite_is_atomic(reference_certify: Path) -> None:
    partial = Path(str(reference_certify) + ".partial")
    with pytest.raises(RuntimeError):
        with ResultsWriter(reference_certify, kind="certify", mode="overwrite") as writer:
            writer.write(_certify_row(0))
            raise RuntimeError("crash")
    assert reference_certify.read_text() == REFERENCE_CERTIFY
    assert partial.exists()

    with ResultsWriter(reference_certify, kind="certify", mode="overwrite") as writer:
        writer.write(_certify_row(5))
    assert read_results(reference_certify).idx.tolist() == [5]
    assert not partial.exists()


# --- bad files -------------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("idx\tlabel\tpredict\tradius\ttime\n0\t1\t1\t0.5\t0:00:01\n", "missing column(s) correct"),
    ("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\tabc\t1\t0:00:01\n",
     "line 2, column radius"),
    ("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.5\t1\tsoon\n",
     "line 2, column time"),
    ("idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.5\t1\n", "line 2 has 5 fields"),
])
def test_bad_files(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path / "bad.tsv", text)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_results(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such results file"):
        read_results(tmp_path / "nope.tsv")


# --- the analyze command ---------------------------------------------------------------

def test_cli_markdown_latex_and_plot(reference_certify: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "acc.png"
    assert analyze_main([str(reference_certify), "--radii", "0", "0.5", "1.25",
                         "--markdown", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "| cohen_sigma025 | 62.5 | 37.5 | 12.5 | 0.568 |" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.stat().st_size > 1000

    assert analyze_main([str(reference_certify), "--latex", "--labels", "Cohen 0.25"]) == 0
    out = capsys.readouterr().out
    assert "Cohen 0.25 & " + " & ".join(f"{p:.1f}" for p in EXPECTED_PERCENT) in out
    assert r"& 0.568 \\" in out

    assert analyze_main([str(reference_certify)]) == 0
    out = capsys.readouterr().out
    assert "r=0.25" in out and "62.5" in out and "ACR" in out


@pytest.mark.parametrize("make_args", [
    lambda d, good: [str(d / "missing.tsv")],
    lambda d, good: [str(_write(d / "nocol.tsv", "idx\tlabel\tpredict\tradius\ttime\n"))],
    lambda d, good: [str(_write(d / "badval.tsv", REFERENCE_CERTIFY.replace("0.734", "x")))],
    lambda d, good: [good, "--radii", "0", "-0.5"],
    lambda d, good: [good, "--radii", "nan"],
    lambda d, good: [good, "--labels", "a", "b"],
    lambda d, good: [good, "--markdown", "--latex"],
    lambda d, good: [good, "--plot", str(d / "no_such_dir" / "p.png")],
])
def test_cli_bad_inputs(make_args, tmp_path: Path, reference_certify: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    assert analyze_main(make_args(tmp_path, str(reference_certify))) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("dmae-certify analyze: error: ")


# --- numbers that carry a guarantee are never rounded in its favour ---------------------

NEAR_GRID = [0.79964, 0.2499, 0.49965, 0.7499999999, 0.25, 0.5, 0.0, 3.1986 * 0.25, 1e-300, 12.3456789]


def test_radius_and_lower_bound_are_written_rounded_down(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    radii = NEAR_GRID + [float(r) for r in rng.uniform(0, 4, 200)]
    bounds = [0.5, 0.9999999999999, 0.99930955, 1.0] + [float(p) for p in rng.uniform(0.5, 1, 200)]
    path = tmp_path / "down.tsv"
    with ResultsWriter(path) as writer:
        for i, (radius, bound) in enumerate(zip(radii, bounds * 2)):
            writer.write(CertifyRow(i, 1, 1, radius, 1, 0.1, 100, 10_000, 9_990, bound, 0.25, "cohen"))
    table = read_results(path)
    written, lower = table.radius, table.extra["pA_lower"]
    assert all(w <= r and r - w < 1.0000001e-6 for w, r in zip(written, radii))
    assert all(w <= p and p - w < 1.0000001e-10 for w, p in zip(lower, bounds * 2))
    # 3 significant digits (Cohen's format) would have written 0.8, 0.25 and 0.5
    assert written[:3].tolist() == [0.79964, 0.2499, 0.499649]


def test_predict_pvalue_is_written_rounded_up(tmp_path: Path) -> None:
    pvalues = [0.001, 0.00100004, 0.0009999999, 0.0, 1.0, 0.9999995, 5e-324] + \
        [float(p) for p in np.random.default_rng(1).uniform(0, 0.01, 200)]
    path = tmp_path / "up.tsv"
    with ResultsWriter(path, kind="predict") as writer:
        for i, p in enumerate(pvalues):
            writer.write(PredictRow(i, 1, 1, 1, 0.1, 1000, 990, 4, p, 0.25))
    written = read_results(path).extra["pvalue"]
    assert all(w >= p and w - p <= 1e-5 * max(p, 1e-300) for w, p in zip(written, pvalues))


def test_analyze_reports_nothing_above_a_radius_that_was_not_reached(tmp_path: Path, capsys) -> None:
    """Radii just under 0.8: exactly 0% certified at 0.8, where Cohen's format would claim 100%."""
    from scipy.special import ndtr

    ours = tmp_path / "ours.tsv"
    with ResultsWriter(ours) as writer:
        for i, radius in enumerate([0.79964, 0.79999, 0.7999999]):  # pA_lower = Phi(radius / sigma)
            writer.write(CertifyRow(i, 1, 1, radius, 1, 0.1, 100, 10_000, 9_999, ndtr(radius / 0.25), 0.25, "cohen"))
    assert analyze_main([str(ours), "--radii", "0.79", "0.8"]) == 0
    out, err = capsys.readouterr()
    assert "100.0" in out and out.split()[-2] == "0.0" and "without their run record" in err
    # a Cohen-format file: read as written, with a one-line caveat about its rounding
    cohen = _write(tmp_path / "cohen.tsv", "idx\tlabel\tpredict\tradius\tcorrect\ttime\n0\t1\t1\t0.8\t1\t0:00:01\n")
    assert analyze_main([str(cohen), "--radii", "0.8"]) == 0
    out, err = capsys.readouterr()
    assert "100.0" in out
    assert len(err.strip().splitlines()) == 1 and "rounded UP" in err


def test_analyze_refuses_an_image_counted_twice(tmp_path: Path, capsys) -> None:
    doubled = _write(tmp_path / "dup.tsv", REFERENCE_CERTIFY + "40\t6\t6\t0.25\t1\t0:00:01\n")
    one_line_error(run_command(analyze_main, capsys, doubled), "dmae-certify analyze", "idx 40", "more than one row")


@pytest.mark.parametrize("row", ["40\t6\t5\t0.25\t1\t0:00:01\n", "40\t6\t-1\t0.25\t0\t0:00:01\n",
                                 "40\t6\t6\t0.25\t0\t0:00:01\n"],
                         ids=["wrong-correct", "abstain-radius", "lost-correct"])
def test_analyze_refuses_a_row_that_contradicts_itself(tmp_path: Path, capsys, row: str) -> None:
    text = REFERENCE_CERTIFY.replace("40\t6\t6\t0.25\t1\t0:00:01.000001\n", row)
    odd = _write(tmp_path / "odd.tsv", text)
    one_line_error(run_command(analyze_main, capsys, odd), "dmae-certify analyze", "idx 40", "contradicts")


def test_summaries_list_only_the_radii_the_run_could_reach(tmp_path: Path, capsys) -> None:
    """A run with n = 100 at sigma 0.25 cannot certify beyond 0.25 * Phi^-1(0.001^(1/100)) = 0.375:
    the r = 0.5 ... 3 columns would be 0% by construction, so they are named as out of reach."""
    from dmae_fast.cli.certify import main as certify_main
    from dmae_fast.stats.bounds import max_radius

    out = tmp_path / "run.tsv"
    assert certify_main(["--data", "demo", "--seed", "0",
                         "--max", "2", "--n0", "10", "--n", "100", "--quiet", "--device", "cpu",
                         "--out", str(out)]) == 0
    capsys.readouterr()
    assert analyze_main([str(out)]) == 0
    shown = capsys.readouterr().out
    cap = max_radius(100, 0.001, 0.25)
    assert "r=0.25" in shown and "r=0.5" not in shown
    assert f"radii above {cap:.3f}" in shown and "not listed: 0.5, 0.75, 1, 1.25" in shown
    (tmp_path / "run.tsv.json").unlink()  # no run record (e.g. Cohen's files): every radius asked for
    assert analyze_main([str(out)]) == 0
    assert "r=3" in capsys.readouterr().out
