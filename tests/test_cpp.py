"""The C++ embedding (examples/cpp): built once per session, compared with the Python side.

* statistics vs SciPy (Clopper-Pearson bound, Phi^-1, binomial test p-values),
* the noise contract: uint32 stream bit for bit, Gaussians vs dmae_fast.noise.contract,
* results-file number formats vs dmae_fast.results.format,
* ``dmae-smooth certify|predict`` on demo images through the demo AOTInductor package
  (written by dmae-export's pipeline): the same rows (counts, classes, radii) as
  ``dmae-certify --engine`` with the same seed,
* bad input: one line on stderr, non-zero exit, the user's files untouched,
* ``--sound``: the noise integers bit for bit as dmae_fast.noise.sound's (tables written by
  ``dmae-sound-table``), the counts of the inputs (X + Z) / L, and one-line refusals of a bad
  table, a sigma that is not the table's and an image off the table's grid; the table file's
  SHA-256 digest vs hashlib, and altered tables refused by both readers (C++ and Python).

Skipped when cmake or a C++ compiler is missing. On 2 cores the build takes 25-40 s and
the demo export 15-20 s, concurrently; the whole file about a minute.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import io
import os
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import rows_without
from scipy.stats import beta, binomtest, norm

from dmae_fast.base.errors import UserError
from dmae_fast.cli.certify import main as certify_main
from dmae_fast.cli.sound_table import main as sound_table_main
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines.aoti_engine import aoti_torch_problem
from dmae_fast.engines.opening import open_engine
from dmae_fast.engines.sidecar import BatchRange
from dmae_fast.export import ExportConfig, export_engines
from dmae_fast.noise.contract import gaussian_noise, key_words, uint32_stream
from dmae_fast.noise.sound import rounded_gaussian_noise, sound_rows
from dmae_fast.results.format import read_results
from dmae_fast.results.writer import ceil_significant, floor_decimals
from dmae_fast.stats.plan import Phase
from dmae_fast.stats.rounded_gaussian import sound_table
from dmae_fast.stats.sound_table_file import OLD_TAG, TAG, digest_words, read_sound_table, table_array

SOURCE = Path(__file__).resolve().parents[1] / "examples" / "cpp"
SEED = 2**40 + 12345  # a seed whose high word matters
N0, N, ALPHA = 20, 200, 0.001
SIGMA = 0.5  # above the demo model's 0.25: counts spread (nA 137..194), so any noise mismatch shows
INDICES = [0, 3, 6, 9]  # --skip 3 --max 4: the noise must use the dataset index


# --------------------------------------------------------------------------- fixtures


def export_demo_pt2(directory: Path, device: str = "cpu") -> Path:
    """The demo classifier as an AOTInductor package + sidecar, written by dmae-export's pipeline."""
    if problem := aoti_torch_problem():  # a torch whose package loader is known to crash
        pytest.skip(problem)
    config = ExportConfig(ckpt=str(DEMO_CHECKPOINT), out=str(directory), formats=("torch",), device=device,
                          batch=BatchRange(1, 256, 4096), parity_samples=64, name="demo")
    (engine,) = export_engines(config, report=lambda message: None)
    return engine


@pytest.fixture(scope="module")
def build_started(tmp_path_factory):
    """Configure and start building examples/cpp in the background (Release, Ninja if any)."""
    if shutil.which("cmake") is None or not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        pytest.skip("cmake or a C++ compiler is missing")
    build = tmp_path_factory.mktemp("cpp-build")
    torch_root = Path(torch.__file__).parent
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = ["cmake", "-S", str(SOURCE), "-B", str(build), *generator,
                 "-DCMAKE_BUILD_TYPE=Release", f"-DTORCH_ROOT={torch_root}"]
    command = f"{shlex.join(configure)} && cmake --build {shlex.quote(str(build))} --parallel 2"
    with open(build / "build.log", "w") as log:  # the child writes through its own copy
        process = subprocess.Popen(["bash", "-c", command], stdout=log, stderr=subprocess.STDOUT)
    yield build, process
    process.wait()


@pytest.fixture(scope="module")
def build(build_started) -> Path:
    directory, process = build_started
    if process.wait() != 0:
        pytest.fail("building examples/cpp failed:\n" + (directory / "build.log").read_text()[-4000:])
    return directory


@pytest.fixture(scope="module")
def engine_file(build_started, tmp_path_factory) -> Path:
    return export_demo_pt2(tmp_path_factory.mktemp("engine"))


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory) -> tuple[Path, Path]:
    test = demo_digits("test")
    directory = tmp_path_factory.mktemp("demo-data")
    images, labels = directory / "images.npy", directory / "labels.npy"
    np.save(images, test.images[:10].numpy())
    np.save(labels, test.labels[:10].numpy())
    return images, labels


def ask(build: Path, queries: list[str]) -> list[str]:
    """Answers of dmae-smooth-check, one per query."""
    done = subprocess.run([str(build / "dmae-smooth-check")], input="\n".join(queries) + "\n",
                          capture_output=True, text=True, check=True)
    answers = done.stdout.splitlines()
    assert len(answers) == len(queries) and not any(a.startswith("error") for a in answers)
    return answers


def smooth(build: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(build / "dmae-smooth"), *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, check=False)


# --------------------------------------------------------------------------- the CLI vs Python
# First in the file, engine_file first: the demo export runs while the build proceeds.


@pytest.mark.parametrize("command", ["certify", "predict"])
def test_cli_rows_equal_dmae_certify(engine_file, build, demo_files, tmp_path, command):
    """Same engine file, seed, n0, n, alpha, sigma and image indices: the same rows.

    The batch holds one image's samples in both runs, so even the classifier's rounding
    sees identical batches.
    """
    images, labels = demo_files
    batch = str(N if command == "predict" else N0 + N)
    common = ["--engine", str(engine_file), "--n0", str(N0), "--n", str(N), "--alpha", str(ALPHA),
              "--seed", str(SEED), "--sigma", str(SIGMA), "--batch", batch, "--skip", "3", "--max", "4", "--quiet"]
    cpp, python = tmp_path / f"{command}-cpp.tsv", tmp_path / f"{command}-python.tsv"
    done = smooth(build, command, "--images", str(images), "--labels", str(labels), "--out", str(cpp), *common)
    assert done.returncode == 0, done.stderr
    predict = ["--predict"] if command == "predict" else []
    with contextlib.redirect_stdout(io.StringIO()):
        assert certify_main(["--data", "demo", "--seed", "0",
                             "--device", "cpu", "--out", str(python), *predict, *common]) == 0
    assert rows_without(cpp) == rows_without(python)
    table = read_results(cpp)  # dmae-certify's reader takes the file
    assert table.idx.tolist() == INDICES
    if command == "certify":
        assert (table.predict >= 0).sum() >= 3 and table.radius.max() > 0.3  # real certificates
        assert table.extra["nA"].max() < N  # no image unanimous: every count is a real comparison


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_package_rows_equal_dmae_certify_on_the_gpu_and_the_cpu_counts(engine_file, build, demo_files,
                                                                             tmp_path):
    """The demo exported for CUDA: dmae-smooth and dmae-certify --engine write the same rows on the GPU,
    and the fp32 counts equal those of the CPU package (the same noise, fp32 on both)."""
    cuda_engine = export_demo_pt2(tmp_path / "cuda-engine", device="cuda")
    images, labels = demo_files
    common = ["--n0", str(N0), "--n", str(N), "--alpha", str(ALPHA), "--seed", str(SEED), "--sigma", str(SIGMA),
              "--batch", str(N0 + N), "--skip", "3", "--max", "4", "--quiet"]
    cpp, python, cpu = tmp_path / "cpp.tsv", tmp_path / "python.tsv", tmp_path / "cpu.tsv"
    done = smooth(build, "certify", "--engine", str(cuda_engine), "--images", str(images), "--labels", str(labels),
                  "--out", str(cpp), *common)
    assert done.returncode == 0, done.stderr
    with contextlib.redirect_stdout(io.StringIO()):
        assert certify_main(["--data", "demo", "--seed", "0",
                             "--engine", str(cuda_engine), "--device", "cuda", "--out", str(python),
                             *common]) == 0
        assert certify_main(["--data", "demo", "--seed", "0",
                             "--engine", str(engine_file), "--device", "cpu", "--out", str(cpu),
                             *common]) == 0
    assert rows_without(cpp) == rows_without(python)
    gpu_rows, cpu_rows = read_results(cpp), read_results(cpu)
    assert gpu_rows.predict.tolist() == cpu_rows.predict.tolist()
    assert gpu_rows.extra["nA"].tolist() == cpu_rows.extra["nA"].tolist()


def test_host_noise_sampler_certifies_the_same_classes(build, engine_file, demo_files, tmp_path):
    """std:: math noise (any engine) vs torch's: Gaussians within a few ulps, so the counts
    agree up to a sample that sits on a decision boundary (none in measured runs)."""
    images, labels = demo_files
    outs = [tmp_path / "torch-noise.tsv", tmp_path / "host-noise.tsv"]
    for out, flags in zip(outs, ([], ["--host-noise"])):
        done = smooth(build, "certify", "--engine", str(engine_file), "--images", str(images), "--labels",
                      str(labels), "--n0", str(N0), "--n", str(N), "--seed", str(SEED), "--sigma", str(SIGMA),
                      "--skip", "3", "--max", "3", "--batch", "64", "--out", str(out), "--quiet", *flags)
        assert done.returncode == 0, done.stderr
    a, b = read_results(outs[0]), read_results(outs[1])
    assert a.predict.tolist() == b.predict.tolist()
    assert np.abs(a.extra["nA"] - b.extra["nA"]).max() <= 1 and a.extra["nA"].max() < N


# --------------------------------------------------------------------------- statistics


def test_clopper_pearson_bound_matches_scipy(build):
    cases = [(n_a, n, alpha)
             for n in (1, 2, 10, 200, 1000, 10_000, 100_000)
             for n_a in sorted({0, 1, 2, n // 2, (9 * n) // 10, n - 1, n} & set(range(n + 1)))
             for alpha in (0.001, 0.05, 1e-6)]
    answers = [float(a) for a in ask(build, [f"bound {n_a} {n} {alpha!r}" for n_a, n, alpha in cases])]
    for (n_a, n, alpha), got in zip(cases, answers):
        want = 0.0 if n_a == 0 else beta.ppf(alpha, n_a, n - n_a + 1)
        assert got == pytest.approx(want, rel=1e-10, abs=1e-300), (n_a, n, alpha)


def test_normal_ppf_matches_scipy(build):
    ps = [1e-300, 1e-20, 1e-10, 1e-6, 0.001, 0.02, 0.02425, 0.1, 0.3, 0.4999, 0.5, 0.6, 0.9,
          0.97575, 0.999, 0.9999999, 1 - 1e-10, 1 - 2**-52]
    answers = [float(a) for a in ask(build, [f"ppf {p!r}" for p in ps])]
    for p, got in zip(ps, answers):
        assert got == pytest.approx(norm.ppf(p), rel=1e-12, abs=1e-15), p
    assert ask(build, ["ppf 0", "ppf 1"]) == ["-inf", "inf"]


def test_binomial_pvalue_matches_scipy(build):
    cases = [(k, n) for n in (1, 2, 7, 100, 201, 1000, 10_000)
             for k in sorted({0, 1, n // 3, n // 2, n // 2 + 1, n - 1, n} & set(range(n + 1)))]
    answers = [float(a) for a in ask(build, [f"binom {k} {n}" for k, n in cases])]
    for (k, n), got in zip(cases, answers):
        assert got == pytest.approx(binomtest(k, n, 0.5).pvalue, rel=1e-10, abs=1e-300), (k, n)


# --------------------------------------------------------------------------- noise contract

NOISE_CASES = [(0, 0, 0, 0, 8), (SEED, 7, 1, 199, 192), (2**64 - 1, 2**32 - 1, 2, 2**32 - 1, 6),
               (123, 500, 0, 12345, 3 * 32 * 32 + 2)]


def test_uint32_stream_is_bit_identical(build):
    answers = ask(build, [f"words {s} {i} {p} {k} {numel}" for s, i, p, k, numel in NOISE_CASES])
    for (seed, image, phase, sample, numel), got in zip(NOISE_CASES, answers):
        want = uint32_stream(seed, torch.tensor([image]), phase, torch.tensor([sample]), numel)[0]
        assert [int(w) for w in got.split()] == want.tolist()


def _gaussians(answer: str) -> np.ndarray:
    return np.array([int(b) for b in answer.split()], dtype=np.uint32).view(np.float32)


def test_gaussians_with_aten_are_bit_identical_and_std_math_within_four_ulps(build):
    """The libtorch sampler reproduces torch exactly; std::log/cos/sin differ from torch's
    vectorized (SLEEF) ones at times (measured: 5% of elements, at most 3 ulps)."""
    torch_answers = ask(build, [f"gauss-torch {s} {i} {p} {k} {n}" for s, i, p, k, n in NOISE_CASES])
    std_answers = ask(build, [f"gauss {s} {i} {p} {k} {n}" for s, i, p, k, n in NOISE_CASES])
    for (seed, image, phase, sample, numel), aten, std in zip(NOISE_CASES, torch_answers, std_answers):
        want = gaussian_noise(seed, torch.tensor([image]), phase, torch.tensor([sample]), (numel,))[0].numpy()
        assert np.array_equal(_gaussians(aten).view(np.uint32), want.view(np.uint32))
        ulps = np.abs(_gaussians(std) - want) / np.spacing(np.maximum(np.abs(want), np.abs(_gaussians(std))))
        assert ulps.max() <= 4, (seed, ulps.max())


# --------------------------------------------------------------------------- results formats


def test_number_formats_match_the_python_writer(build):
    """Radius / pA_lower rounded down, p-values rounded up: the C++ strings equal Python's."""
    values = [0.0, 1.0, 0.5, 0.25, 1.23456, 12.3, 100.0, 123.4, 0.0001234, 0.00009999, 1e-5, 99.95, 0.9995,
              0.99999, 0.9999999, 3.1986e-7, 2.0, 1e16, 1e22, 0.79863, 0.79964, 0.2499, 0.49965, 0.7996499999999999,
              3.1986 * 0.25, 1e-300, 12.3456789, 0.001, 0.00100004, 0.0009999999, 0.999999999, 0.9999995, 9.9999995,
              1.5e-300, 2.0**-30, 1 / 3] + [float(v) for v in np.random.default_rng(5).uniform(0, 4, 40)]
    durations = (0.0, 1.5, 0.1234567, 3600.25, 172805.5, 2.5e-6, 86399.9999996)
    queries = ([f"floor {v!r} 6" for v in values] + [f"floor {v!r} 10" for v in values]
               + [f"ceil {v!r} 6" for v in values]
               + [f"repr {v!r}" for v in values + [12345678.9]]
               + [f"duration {s!r}" for s in durations])
    want = ([floor_decimals(v, 6) for v in values] + [floor_decimals(v, 10) for v in values]
            + [ceil_significant(v, 6) for v in values]
            + [repr(v) for v in values + [12345678.9]]
            + [str(datetime.timedelta(seconds=s)) for s in durations])
    assert ask(build, queries) == want


# --------------------------------------------------------------------------- bad input


def _one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> None:
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dmae-smooth: error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_bad_input_gives_one_line_and_keeps_files(build, engine_file, demo_files, tmp_path):
    images, labels = demo_files
    def run(*args: str) -> subprocess.CompletedProcess:  # in tmp_path, where a default --out would land
        return smooth(build, *args, cwd=tmp_path)

    base = ["--engine", str(engine_file), "--images", str(images), "--labels", str(labels), "--quiet"]
    existing = tmp_path / "keep.tsv"
    existing.write_text("precious\n")
    _one_line_error(run("certify", *base, "--out", str(existing)), "exists")
    assert existing.read_text() == "precious\n"
    _one_line_error(run("certify", *base, "--n0", "0"), "--n0")
    _one_line_error(run("certify", *base, "--sigma", "nan"), "--sigma")
    _one_line_error(run("certify", *base, "--frobnicate", "1"), "--frobnicate")
    _one_line_error(run("explode"), "explode")
    _one_line_error(run("certify", *base, "--batch", "5000"), "maximum batch")
    _one_line_error(run("certify", *base[:2], "--labels", str(labels)), "--images")
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((2, 1, 8, 8), dtype=np.float32))
    _one_line_error(run("certify", *base, "--images", str(wrong)), "[N, 3, 8, 8]")
    np.save(wrong, np.zeros(10, dtype=np.int32))
    _one_line_error(run("certify", *base, "--labels", str(wrong)), "dtype <i4")
    no_sidecar = tmp_path / "copy.pt2"
    shutil.copy(engine_file, no_sidecar)
    _one_line_error(run("certify", *base, "--engine", str(no_sidecar)), "sidecar")
    Path(f"{no_sidecar}.json").write_text("{\"format\": \"dmae-fast-engine/1\", ")
    _one_line_error(run("certify", *base, "--engine", str(no_sidecar)), "not valid JSON")
    garbage = tmp_path / "garbage.pt2"
    garbage.write_bytes(b"not a zip")
    shutil.copy(f"{engine_file}.json", f"{garbage}.json")
    _one_line_error(run("certify", *base, "--engine", str(garbage)), "garbage.pt2")
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".tsv") == ["keep.tsv"]


def test_overwrite_replaces_the_file_only_when_the_run_completes(build, engine_file, demo_files, tmp_path):
    images, labels = demo_files
    out = tmp_path / "results.tsv"
    out.write_text("old\n")
    args = ["certify", "--engine", str(engine_file), "--images", str(images), "--n0", "5", "--n", "20",
            "--max", "2", "--out", str(out), "--overwrite", "--quiet"]
    bad_labels = tmp_path / "bad.npy"
    np.save(bad_labels, np.full(10, 99, dtype=np.int64))
    _one_line_error(smooth(build, *args, "--labels", str(bad_labels)), "label 99")
    assert out.read_text() == "old\n"
    assert smooth(build, *args, "--labels", str(labels)).returncode == 0
    assert read_results(out).idx.tolist() == [0, 1] and not Path(f"{out}.partial").exists()


def test_a_run_without_seed_draws_and_prints_a_fresh_one_that_reproduces_it(build, engine_file, demo_files,
                                                                            tmp_path):
    images, labels = demo_files
    args = ["certify", "--engine", str(engine_file), "--images", str(images), "--labels", str(labels), "--n0", "5",
            "--n", "20", "--max", "2", "--quiet"]
    seeds = []
    for name in ("a", "b"):
        done = smooth(build, *args, "--out", str(tmp_path / f"{name}.tsv"))
        assert done.returncode == 0, done.stderr
        seeds.append(int(re.search(r", seed (\d+), batch ", done.stderr).group(1)))
    assert seeds[0] != seeds[1] and 0 not in seeds
    again = smooth(build, *args, "--seed", str(seeds[0]), "--out", str(tmp_path / "again.tsv"))
    assert again.returncode == 0 and f", seed {seeds[0]}, " in again.stderr
    assert rows_without(tmp_path / "again.tsv") == rows_without(tmp_path / "a.tsv")


# --------------------------------------------------------------------------- sound noise (--sound)

SOUND_TABLES = [(0.25, 255), (0.25, 16), (0.5, 16)]  # (0.5, 16): the demo digits' grid, counts spread
SOUND_CASES = [(SEED, 0, 0, 0, 7), (SEED, 9, 1, 199, 192), (0, 3, 2, 5, 3 * 32 * 32 + 1),
               (2**64 - 1, 2**32 - 1, 1, 2**32 - 1, 6), (123, 500, 0, 12345, 64)]


def write_table(sigma: float, grid: int, out: Path, *flags: str) -> tuple[int, str, str]:
    """dmae-sound-table in-process: exit status, stdout, stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = sound_table_main(["--sigma", str(sigma), "--grid", str(grid), "--out", str(out), *flags])
    return status, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def sound_tables(tmp_path_factory) -> dict[tuple[float, int], Path]:
    directory = tmp_path_factory.mktemp("sound-tables")
    paths = {(sigma, grid): directory / f"sound-{sigma}-{grid}.npy" for sigma, grid in SOUND_TABLES}
    for (sigma, grid), path in paths.items():
        assert write_table(sigma, grid, path)[0] == 0
    return paths


def test_sound_table_command_writes_the_documented_layout_and_keeps_files(tmp_path):
    out = tmp_path / "table.npy"
    status, printed, _ = write_table(0.25, 16, out)
    table = sound_table(0.25, 16)
    assert status == 0 and f"K = {table.K}" in printed and repr(table.tv_per_element) in printed
    words = np.load(out)
    assert words.dtype == np.dtype("<i8") and words.shape == (9 + 2 * table.K,)
    assert words[:3].tolist() == [TAG, 16, table.K] and TAG.to_bytes(8, "little") == b"dmaesnd2"
    assert words[3:5].view(np.float64).tolist() == [0.25, table.tv_per_element]
    covered = np.concatenate([words[:5], words[9:]]).tobytes()
    assert words[5:9].tobytes() == hashlib.sha256(covered).digest()
    assert np.array_equal(words[9:], table.thresholds)
    assert read_sound_table(str(out)) is table
    before = out.read_bytes()
    status, _, error = write_table(0.5, 16, out)
    assert status == 2 and error == f"dmae-sound-table: error: {out} exists; pass --overwrite to replace it\n"
    assert out.read_bytes() == before
    assert write_table(0.5, 16, out, "--overwrite")[0] == 0
    assert np.load(out)[3:4].view(np.float64)[0] == 0.5 and [p.name for p in tmp_path.iterdir()] == ["table.npy"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()  # as open() makes files, not 0600
    status, _, error = write_table(0.0, 16, tmp_path / "zero.npy")
    assert status == 2 and error.count("\n") == 1 and "sigma" in error and not (tmp_path / "zero.npy").exists()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_sound_table_keeps_a_users_partial_file(tmp_path):
    """--overwrite writes beside the file under a hidden random name: a user's own t.npy.partial is kept."""
    out, partial = tmp_path / "t.npy", tmp_path / "t.npy.partial"
    assert write_table(0.25, 16, out)[0] == 0
    partial.write_bytes(b"mine")
    assert write_table(0.5, 16, out, "--overwrite")[0] == 0
    assert partial.read_bytes() == b"mine" and sorted(p.name for p in tmp_path.iterdir()) == ["t.npy", "t.npy.partial"]
    assert read_sound_table(str(out)).sigma == 0.5


def _refused(status_out_err: tuple[int, str, str], *fragments: str) -> None:
    status, _, error = status_out_err
    assert status == 2 and error.count("\n") == 1 and error.startswith("dmae-sound-table: error: "), error
    for fragment in fragments:
        assert fragment in error, error


def test_sound_table_replaces_only_a_regular_file(tmp_path):
    """A device (/dev/full, for real: these tests may run as root), a directory, a FIFO and a link to any of
    them are refused in one line and left as they were; a link to a regular file has its target replaced."""
    if os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode):
        for flags in ((), ("--overwrite",)):
            _refused(write_table(0.25, 16, Path("/dev/full"), *flags), "/dev/full is not a regular file")
            assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)
        (tmp_path / "full").symlink_to("/dev/full")
        _refused(write_table(0.25, 16, tmp_path / "full", "--overwrite"), "not a regular file")
    directory, fifo = tmp_path / "dir", tmp_path / "fifo"
    directory.mkdir()
    os.mkfifo(fifo)
    _refused(write_table(0.25, 16, directory, "--overwrite"), "is a directory")
    _refused(write_table(0.25, 16, fifo, "--overwrite"), "not a regular file")
    assert directory.is_dir() and not any(directory.iterdir()) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    _refused(write_table(0.25, 16, tmp_path / "dangling"), "does not exist")
    target, link = tmp_path / "target.npy", tmp_path / "link.npy"
    target.write_bytes(b"old")
    link.symlink_to(target)
    _refused(write_table(0.25, 16, link), "exists; pass --overwrite")
    assert write_table(0.25, 16, link, "--overwrite")[0] == 0
    assert link.is_symlink() and read_sound_table(str(target)).sigma == 0.25
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("failing", ["write", "fsync"])
def test_a_failed_write_is_one_line_and_leaves_the_old_file(tmp_path, monkeypatch, failing):
    """A full disk: the error in one line, exit 2, the old file as it was and no hidden file left."""
    import dmae_fast.base.files

    out = tmp_path / "t.npy"
    out.write_bytes(b"old")

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    class FullDisk(io.FileIO):
        write = full

    if failing == "fsync":
        monkeypatch.setattr(dmae_fast.base.files.os, "fsync", full)
    else:
        monkeypatch.setattr(dmae_fast.base.files, "open", lambda path, mode: FullDisk(path, "w"), raising=False)
    _refused(write_table(0.25, 16, out, "--overwrite"), f"cannot write {out}", os.strerror(errno.ENOSPC))
    assert out.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["t.npy"]


def seal(words: np.ndarray) -> np.ndarray:
    """``words`` (a table's, altered) with their digest recomputed: what stands behind the digest refuses them."""
    words[5:9] = digest_words(words)
    return words


def _bits(value: float) -> int:
    return int(np.array([value]).view(np.int64)[0])


def moved(words: np.ndarray, moves: dict[int, int]) -> np.ndarray:
    """A table's ``words`` with each T_k moved by moves[k] units and the digest recomputed; the moves must keep the
    thresholds ascending and symmetric (S_k + S_-k-1 in {0, -1}), so only the check against Phi can refuse them."""
    K, altered = int(words[2]), words.copy()
    for k, units in moves.items():
        altered[9 + K + k] += units
    s = altered[9:]
    assert np.all(np.diff(s) >= 0) and set((s[:K] + s[::-1][:K]).tolist()) <= {0, -1}
    return seal(altered)


def alternating(words: np.ndarray, units: int) -> dict[int, int]:
    """T_k moved by +units, -units, ... for k = 0, 1, ... and T_-k-1 by the opposite, wherever the gap below T_-k-1
    leaves room (2 * units)."""
    K = int(words[2])
    lower = [0, *(int(t) + 2**63 for t in words[9:9 + K])]  # T_-K-1 = 0, T_-K .. T_-1
    moves = {}
    for k in (k for k in range(K) if lower[K - k] - lower[K - k - 1] >= 2 * units):
        moves[k], moves[-k - 1] = (units, -units) if k % 2 == 0 else (-units, units)
    return moves


NOT_PHI = "is not floor(2^64 Phi((k + 1/2) / (L * sigma)))"


def altered_tables(sound_tables: dict[tuple[float, int], Path], directory: Path) -> dict[str, tuple[Path, str, str]]:
    """Each alteration of the table of sigma 0.25 on the 1/16 grid, written to ``directory``: the file and what the
    C++ and the Python reader's one line say of it."""
    words = np.load(sound_tables[0.25, 16])
    K, tv = int(words[2]), float(words[4:5].view(np.float64)[0])
    foreign = table_array(sound_table(0.125, 16))
    not_those = "not those of sigma"
    cases = {
        "sigma": ({3: _bits(0.5)}, "K = 38 is not the truncation of sigma 0.5 on the 1/16 grid", not_those),
        "sigma-slightly": ({3: _bits(0.2501)}, "threshold T_", not_those),
        "grid": ({1: 32}, "is not the truncation of sigma 0.25 on the 1/32 grid", not_those),
        "tv-zero": ({4: _bits(0.0)}, "total variation is not a valid number", not_those),
        "tv-tenfold": ({4: _bits(10 * tv)}, "total variation", not_those),
        "widened": ({9 + K - 1: words[9 + K - 1] - 2**40, 9 + K: words[9 + K] + 2**40}, "threshold T_-1", not_those),
    }
    paths = {}
    for name, (edits, cpp, python) in cases.items():
        altered = words.copy()
        for index, value in edits.items():
            altered[index] = value
        paths[name] = (seal(altered), cpp, python)
    other = np.concatenate([words[:9], foreign[9:]])  # sigma 0.125's thresholds under the 0.25 header
    other[2] = foreign[2]
    # within 1e-12 of Phi, which the reader accepted until it checked each threshold exactly (issue 56)
    paths["alternating-2^24"] = (moved(words, alternating(words, 2**24)), NOT_PHI, not_those)
    s = words[9:]
    k = next(k for k in range(K) if s[K + k] + s[K - 1 - k] == -1)  # T_-k-1 + 1 keeps the pair symmetric
    paths["one-unit"] = (moved(words, {-k - 1: 1}), f"threshold T_{-k - 1} {NOT_PHI}", not_those)
    paths["foreign"] = (seal(other), "is not the truncation of sigma 0.25 on the 1/16 grid", not_those)
    paths["foreign-length"] = (seal(np.concatenate([words[:9], foreign[9:]])), "(a truncated or altered file)",
                               not_those)
    unsealed = words.copy()
    unsealed[3] = _bits(0.5)
    paths["unsealed"] = (unsealed, "SHA-256 digest does not match", "SHA-256 digest does not match")
    old = np.concatenate([[OLD_TAG], words[1:5], words[9:]])
    paths["first-format"] = (old, "first format (dmaesnd1", "first format (dmaesnd1")
    written = {}
    for name, (altered, cpp, python) in paths.items():
        np.save(directory / f"{name}.npy", altered)
        written[name] = (directory / f"{name}.npy", cpp, python)
    return written


def test_the_python_reader_refuses_altered_tables(sound_tables, tmp_path):
    for name, (path, _, python) in altered_tables(sound_tables, tmp_path).items():
        with pytest.raises(UserError) as refused:
            read_sound_table(str(path))
        message = str(refused.value)
        assert "\n" not in message and message.startswith(f"{path}: ") and python in message, (name, message)


def test_altered_tables_are_refused_by_dmae_smooth(build, engine_file, demo_files, sound_tables, tmp_path):
    """The header's sigma, grid or total variation edited, another sigma's thresholds under its header, the middle
    pair widened by 2^40, thresholds moved by +-2^24 or one by a unit (each with its digest recomputed), an edit
    without, the first format: one line, exit != 0."""
    images, labels = demo_files
    for name, (path, cpp, _) in altered_tables(sound_tables, tmp_path).items():
        done = smooth(build, "certify", "--engine", str(engine_file), "--images", str(images), "--labels", str(labels),
                      "--n0", "5", "--n", "20", "--max", "1", "--quiet", "--sound", str(path), cwd=tmp_path)
        _one_line_error(done, f"{path}: ", cpp)
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tsv"]


def test_sha256_matches_hashlib(build):
    rng = np.random.default_rng(11)
    messages = [rng.bytes(n) for n in [*range(0, 130), 1000, 4096, 9 + 2 * 39_297]]
    answers = ask(build, [f"sha256 {m.hex() or '-'}" for m in messages])
    assert answers == [hashlib.sha256(m).hexdigest() for m in messages]


EXACT_TABLES = [(1 / 1024, 16), (0.12, 16), (1.0, 255), (1.0, 4096)]  # K = 1 .. 39,297 (the bound on grid * sigma)


def test_exact_tables_pass_the_cpp_checks(build, tmp_path):
    """Each T_k against floor(2^64 Phi((k + 1/2) / s)) in 113-bit arithmetic, the truncation and the total variation
    recomputed from the thresholds: every table dmae-sound-table writes passes them, up to the largest it writes,
    and the total variation the reader keeps is a bound at least the table's, within 1e-6 of it."""
    paths = [tmp_path / f"{sigma}-{grid}.npy" for sigma, grid in EXACT_TABLES]
    for (sigma, grid), path in zip(EXACT_TABLES, paths):
        assert write_table(sigma, grid, path)[0] == 0
    for (sigma, grid), answer in zip(EXACT_TABLES, ask(build, [f"table {path}" for path in paths])):
        table = sound_table(sigma, grid)
        fields = answer.split()
        assert fields[:2] == [str(grid), str(table.K)]
        assert table.tv_per_element <= float(fields[3]) <= table.tv_per_element * (1 + 1e-6), (answer, table)


def test_thresholds_off_by_2_to_the_24_on_the_255_grid_are_refused(build, tmp_path):
    """Issue 56's table: sigma 0.25 on the 1/255 grid with its thresholds moved by +-2^24 / 2^64 (9.1e-13, once
    within the reader's tolerance) along the table, resealed: 7.6e-10 per element from the exact rounded Gaussian,
    about 7e7 times its stated total variation. Both readers refuse it."""
    words, path = table_array(sound_table(0.25, 255)), tmp_path / "table.npy"  # the words dmae-sound-table writes
    np.save(path, moved(words, alternating(words, 2**24)))
    done = subprocess.run([str(build / "dmae-smooth-check")], input=f"table {path}\n", capture_output=True, text=True,
                          check=True)
    assert done.stdout.startswith(f"error: {path}: its threshold T_") and NOT_PHI in done.stdout, done.stdout
    with pytest.raises(UserError, match="not those of sigma 0.25 on the 1/255 grid"):
        read_sound_table(str(path))


def test_sound_noise_is_bit_identical(build, sound_tables):
    """The C++ integers Z equal dmae_fast.noise.sound's: each table, seeds whose high word matters, the three
    phases, the largest indices, an odd numel (the last element alone in its counter)."""
    for (sigma, grid), path in sound_tables.items():
        table = sound_table(sigma, grid)
        fields = ask(build, [f"table {path}"])[0].split()
        assert [int(fields[0]), int(fields[1]), float(fields[2])] == [grid, table.K, sigma]
        assert table.tv_per_element <= float(fields[3]) <= table.tv_per_element * (1 + 1e-6)  # recomputed, rounded up
        answers = ask(build, [f"sound {path} {s} {i} {p} {k} {n}" for s, i, p, k, n in SOUND_CASES])
        for (seed, image, phase, sample, numel), got in zip(SOUND_CASES, answers):
            want = rounded_gaussian_noise(seed, table, torch.tensor([image]), phase, torch.tensor([sample]), (numel,))
            assert [int(z) for z in got.split()] == want[0].tolist(), (sigma, grid, seed, image, phase, sample)


def test_sound_inputs_are_bit_identical(build, sound_tables):
    """float32(X + Z) / L in C++ equals dmae_fast.noise.sound.sound_rows bit for bit (a division, not a
    multiplication by 1/L: they differ on the 1/255 grid), on an image of every level X_e = e mod (L + 1)."""
    for (sigma, grid), path in sound_tables.items():
        table = sound_table(sigma, grid)
        answers = ask(build, [f"sound-input {path} {s} {i} {p} {k} {n}" for s, i, p, k, n in SOUND_CASES])
        for (seed, image, phase, sample, numel), got in zip(SOUND_CASES, answers):
            clean = (torch.arange(numel) % (grid + 1)).to(torch.float32) / grid
            want = sound_rows(clean[None], torch.tensor([0]), grid, torch.tensor(table.thresholds), table.K,
                              torch.tensor(key_words(seed)), torch.tensor([image]), torch.tensor([phase]),
                              torch.tensor([sample]))[0]
            assert np.array_equal(_gaussians(got).view(np.uint32), want.numpy().view(np.uint32)), (sigma, grid, seed)


def _sound_counts(engine_file: Path, image: torch.Tensor, index: int, table_key: tuple[float, int],
                  phases: list[Phase], sizes: list[int]) -> list[np.ndarray]:
    """Class counts per phase of the inputs dmae_fast.noise.sound makes, in one batch (as dmae-smooth's)."""
    table = sound_table(*table_key)
    engine = open_engine(engine_file)
    phase = torch.cat([torch.full((size,), int(p)) for p, size in zip(phases, sizes)])
    sample = torch.cat([torch.arange(size) for size in sizes])
    inputs = sound_rows(image[None], torch.zeros_like(sample), table.grid, torch.tensor(table.thresholds), table.K,
                        torch.tensor(key_words(SEED)), torch.full_like(sample, index), phase, sample)
    classes = engine.classify(inputs).numpy()
    k = engine.spec.num_classes
    return [np.bincount(classes[phase.numpy() == int(p)], minlength=k) for p in phases]


@pytest.mark.parametrize("command", ["certify", "predict"])
def test_sound_rows_count_the_exact_grid_inputs(build, engine_file, demo_files, sound_tables, tmp_path, command):
    """dmae-smooth --sound classifies float32(X + Z) / 16 of the demo digits: the counts of every image equal
    those of dmae_fast.noise.sound's inputs through the same package and batches; sigma is the table's and
    certify rows say the procedure with " sound"."""
    images, labels = demo_files
    batch = N if command == "predict" else N0 + N
    out = tmp_path / f"{command}.tsv"
    done = smooth(build, command, "--engine", str(engine_file), "--images", str(images), "--labels", str(labels),
                  "--sound", str(sound_tables[0.5, 16]), "--n0", str(N0), "--n", str(N), "--seed", str(SEED),
                  "--batch", str(batch), "--skip", "3", "--max", "4", "--out", str(out), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "sound noise on the 1/16 grid" in done.stderr
    table = read_results(out)
    assert table.idx.tolist() == INDICES and set(table.extra["sigma"].tolist()) == {0.5}
    pixels = torch.from_numpy(np.load(images))
    for row, i in enumerate(INDICES):
        if command == "predict":
            (counts,) = _sound_counts(engine_file, pixels[i], i, (0.5, 16), [Phase.PREDICTION], [N])
            top2 = sorted(counts.tolist())[-2:]
            assert [table.extra["count1"][row], table.extra["count2"][row]] == top2[::-1]
        else:
            selection, estimation = _sound_counts(engine_file, pixels[i], i, (0.5, 16),
                                                  [Phase.SELECTION, Phase.ESTIMATION], [N0, N])
            assert table.extra["nA"][row] == estimation[int(np.argmax(selection))]
            assert table.extra["procedure"][row] == "cohen-fixed-n sound"
    if command == "certify":
        assert table.extra["nA"].max() < N and (table.predict >= 0).sum() >= 2  # real comparisons, real certificates


def test_sound_refusals_are_one_line(build, engine_file, demo_files, sound_tables, tmp_path):
    """A truncated, altered or foreign table, a --sigma that is not the table's, images off its grid: one
    line naming the problem, and no results file."""
    images, labels = demo_files

    def run(*args: str) -> subprocess.CompletedProcess:
        return smooth(build, "certify", "--engine", str(engine_file), "--images", str(images), "--labels",
                      str(labels), "--n0", "5", "--n", "20", "--max", "2", "--quiet", *args, cwd=tmp_path)

    good = sound_tables[0.25, 16]
    words, bad = np.load(good), tmp_path / "bad.npy"
    K = int(words[2])
    np.save(bad, seal(words[:-1].copy()))
    _one_line_error(run("--sound", str(bad)), "bad.npy", "truncated")
    bad.write_bytes(good.read_bytes()[:-8])
    _one_line_error(run("--sound", str(bad)), "bad.npy", "data bytes")
    np.save(bad, np.load(labels))
    _one_line_error(run("--sound", str(bad)), "bad.npy", "not a sound-noise table")
    np.save(bad, words.astype(np.float64))
    _one_line_error(run("--sound", str(bad)), "bad.npy", "dtype")
    altered = words.copy()
    altered[9 + K] += 2**20  # S_0 moved, still ascending
    np.save(bad, seal(altered))
    _one_line_error(run("--sound", str(bad)), "bad.npy", "not symmetric")
    altered = words.copy()
    altered[[9 + K - 1, 9 + K]] = altered[[9 + K, 9 + K - 1]]
    np.save(bad, seal(altered))
    _one_line_error(run("--sound", str(bad)), "bad.npy", "ascending")
    _one_line_error(run("--sound", str(good), "--sigma", "0.5"), "--sigma 0.5", "0.25")
    _one_line_error(run("--sound", str(sound_tables[0.25, 255])), "image 0", "1/255 grid")
    for steps in (9e-4, 5e-4):  # a fraction of a step off the 1/16 grid: no longer taken as the rounded image
        shifted = tmp_path / "shifted.npy"
        np.save(shifted, (np.load(images).astype(np.float64) + steps / 16).astype(np.float32))
        _one_line_error(run("--sound", str(good), "--images", str(shifted)), "image 0", "1/16 grid")
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tsv"]


# --------------------------------------------------------------------------- --sound through the commands


@pytest.mark.parametrize("command", ["certify", "predict"])
def test_sound_rows_equal_dmae_certify_sound(engine_file, build, demo_files, sound_tables, tmp_path, command):
    """dmae-smooth --sound (the table of sigma 0.5 on the demo's 1/16 grid) and dmae-certify --engine --sound
    --sigma 0.5 on the same digits, seed, settings and batches: the same rows."""
    images, labels = demo_files
    batch = str(N if command == "predict" else N0 + N)
    common = ["--engine", str(engine_file), "--n0", str(N0), "--n", str(N), "--alpha", str(ALPHA),
              "--seed", str(SEED), "--batch", batch, "--skip", "3", "--max", "4", "--quiet"]
    cpp, python = tmp_path / f"{command}-cpp.tsv", tmp_path / f"{command}-python.tsv"
    done = smooth(build, command, "--images", str(images), "--labels", str(labels), "--out", str(cpp),
                  "--sound", str(sound_tables[0.5, 16]), *common)
    assert done.returncode == 0, done.stderr
    predict = ["--predict"] if command == "predict" else []
    with contextlib.redirect_stdout(io.StringIO()):
        assert certify_main(["--data", "demo", "--seed", "0",
                             "--device", "cpu", "--out", str(python), "--sound", "--sigma", "0.5",
                             *predict, *common]) == 0
    assert rows_without(cpp) == rows_without(python)
    if command == "certify":
        assert set(read_results(python).extra["procedure"].tolist()) == {"cohen-fixed-n sound"}
