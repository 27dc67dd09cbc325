"""Multi-process certification on CPU with gloo (``torch.distributed.run --standalone``).

Every run here is compared with one process certifying the same images in this test process:
the rows must be identical in every column but ``time``, whatever the number of processes,
the sharding, a SIGKILLed rank or a killed and resumed job.

A launch costs seconds of imports in every process, so each is made for several checks: a killed
job's resume is itself a run under test (another number of processes, or the sharding). A job to
be stopped mid-run needs no long run: its ranks each stop after a row until the test lets them go.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from finished_hooks import holding, let_go, with_site
from helpers import rows_without
from PIL import Image

from dmae_fast.base.errors import UserError
from dmae_fast.batching.job import RowSplit
from dmae_fast.data import open_dataset
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.results.parts import merge_parts, part_path, parts_dir, start_parts
from dmae_fast.run.driver import CertifyConfig, certify_dataset

pytestmark = pytest.mark.slow
DMAE_CERTIFY = str(Path(sys.executable).with_name("dmae-certify"))

# sigma 0.5 (the demo was trained at 0.25) so that counts vary and some images abstain.
SMALL = dict(max_images=8, sigma=0.5, n0=20, n=300, batch=128)


def _cli_args(settings: dict, extra: tuple[str, ...] = (), seed: int | None = 0) -> list[str]:
    """dmae-certify's arguments for ``settings``; ``seed`` None: none given (rank 0 draws one)."""
    names = {"max_images": "--max-images", "n": "--num-samples", "n0": "--n0", "sigma": "--sigma", "batch": "--batch"}
    args = ["--data", "demo", "--quiet", "--noise", "reference", *(["--seed", str(seed)] if seed is not None else [])]
    for key, value in settings.items():
        args += [names[key], str(value)]
    return args + list(extra)


def _torchrun_command(nproc: int, args: list[str], restarts: int = 0) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "--max-restarts", str(restarts), "-m", "dmae_fast.cli.certify", *args]


def _torchrun(nproc: int, out: Path, settings: dict, *extra: str, restarts: int = 0, seed: int | None = 0,
              **popen) -> subprocess.Popen:
    command = _torchrun_command(nproc, [*_cli_args(settings, extra, seed), "--out", str(out)], restarts)
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _finish(process: subprocess.Popen, timeout: float = 900) -> tuple[int, str]:
    _, err = process.communicate(timeout=timeout)
    return process.returncode, err


def _one_process(out: Path, settings: dict, **more) -> None:
    config = dict(seed=0, engine=str(DEMO_CHECKPOINT), data="demo", out=str(out), device="cpu", progress=False,
                  noise="reference", **settings)
    certify_dataset(CertifyConfig.from_settings({**config, **more}))


def _rows(path: Path) -> list[list[str]]:
    """The rows without the time column, sorted by idx; no idx twice."""
    return rows_without(path, sort=True)[1:]


def _record(out: Path) -> dict:
    return json.loads(Path(f"{out}.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Path]:
    """One process, this test process: the results files whose rows every multi-process run must reproduce."""
    folder = tmp_path_factory.mktemp("one-process")
    files = {"small": folder / "small.tsv", "sequential": folder / "sequential.tsv"}
    _one_process(files["small"], SMALL)
    _one_process(files["sequential"], SMALL, sequential=True)
    radius = rows_without(files["small"])[0].index("radius")
    assert len({row[radius] for row in _rows(files["small"])}) > 2, "the comparison needs varied radii"
    return files


def _rows_on_disk(out: Path) -> int:
    files = list(parts_dir(out).glob("rank*.tsv")) if parts_dir(out).is_dir() else []
    return sum(max(0, len(f.read_text().splitlines()) - 1) for f in files)


def _wait_for_rows(process: subprocess.Popen, out: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while _rows_on_disk(out) < 1:
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "no row was written"
        time.sleep(0.05)


def _worker_pids(launcher: int) -> dict[int, int]:
    """rank -> pid of the launcher's worker processes (read from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0") if parent == launcher else []
        except (OSError, ValueError, IndexError):
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                found[int(item[5:])] = int(entry.name)
    return found


def _recorded_seed(out: Path, err: str) -> int:
    """The seed rank 0 drew (none was given): in the run record and the announcement."""
    seed = _record(out)["config"]["seed"]
    assert isinstance(seed, int) and seed != 0 and err.count(f"seed {seed},") >= 1, err
    return seed


def _check_sample_shares(out: Path, nproc: int, images: int = SMALL["max_images"]) -> None:
    """The record of a complete --shard samples run that certified ``images``: every rank counted a share of
    every image's samples, together all of them."""
    record = _record(out)
    assert record["status"] == "complete" and record["shard"] == "samples" and record["world_size"] == nproc
    assert record["images"] == images and [r["rank"] for r in record["ranks"]] == list(range(nproc))
    assert sum(r["samples"] for r in record["ranks"]) == record["samples"]
    assert all(r["samples"] > 0 for r in record["ranks"])


# ---------------------------------------------------------------- complete runs
def test_sequential_sample_shards_share_one_fresh_seed(tmp_path):
    """Without --seed rank 0 draws the seed and hands it to every rank: the rows are those of one process at
    the recorded seed."""
    out = tmp_path / "r.tsv"
    status, err = _finish(_torchrun(2, out, SMALL, "--shard", "samples", "--sequential", seed=None))
    assert status == 0, err
    alone = tmp_path / "alone.tsv"
    _one_process(alone, SMALL, seed=_recorded_seed(out, err), sequential=True)
    assert _rows(out) == _rows(alone)
    _check_sample_shares(out, 2)


def test_a_restarted_rank_keeps_the_fresh_seed_and_the_file_is_complete(tmp_path):
    """Rank 1 SIGKILLed mid-run is restarted (--max-restarts 1) and continues with the seed rank 0 drew (an
    --overwrite run's parts marker holds it): the file is complete, the rows those of one process at that seed."""
    out = tmp_path / "r.tsv"
    out.write_text("a user's old file\n")
    process = _torchrun(2, out, SMALL, "--shard", "images", "--overwrite", restarts=1, seed=None,
                        env=holding(tmp_path))
    _wait_for_rows(process, out)
    os.kill(_worker_pids(process.pid)[1], signal.SIGKILL)
    let_go(tmp_path)
    status, err = _finish(process)
    assert status == 0, err
    assert _record(out)["status"] == "complete"
    alone = tmp_path / "alone.tsv"
    _one_process(alone, SMALL, seed=_recorded_seed(out, err))
    assert _rows(out) == _rows(alone)


def _digit_folder(tmp_path: Path, broken: int) -> tuple[Path, Path]:
    """8 demo digits as PNG files with a labels file; image ``broken`` is not an image."""
    folder, labels = tmp_path / "digits", tmp_path / "labels.txt"
    folder.mkdir()
    dataset = open_dataset("demo", split="test")
    lines = []
    for i in range(8):
        image, label = dataset[i]
        pixels = (image.numpy() * 255).round().astype(np.uint8).transpose(1, 2, 0)
        Image.fromarray(pixels).save(folder / f"{i}.png")
        lines.append(f"{i}.png {label}")
    (folder / f"{broken}.png").write_bytes(b"not a png")
    labels.write_text("\n".join(lines) + "\n")
    return folder, labels


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("dmae-certify: error:")]


def _said(err: str, out: Path) -> list[str]:
    """The lines of stderr other than the run's announcement (``dmae-certify: N images, ... -> OUT``)."""
    return [line for line in err.splitlines() if not line.endswith(f" -> {out}")]


def test_bad_image_in_one_rank_stops_the_job_with_one_line(tmp_path):
    """With the compiled noise (the default): the launcher's SIGTERM to the other rank's process group,
    which kills its DataLoader worker too, once added 'compiled noise unavailable (... DataLoader worker
    ... killed by signal: Terminated)' or a traceback after the real line."""
    folder, labels = _digit_folder(tmp_path, broken=5)
    out = tmp_path / "r.tsv"
    command = [DMAE_CERTIFY, "--nproc-per-node", "2", "--ckpt", "demo", "--data", str(folder), "--labels",
               str(labels), "--n", "300", "--quiet", "--out", str(out)]
    # a hang guard (the job ends in ~15 s; a rank left waiting in a collective would hold it for the group's timeout)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 2
    said = _said(result.stderr, out)
    assert len(said) == 1 and said[0].startswith("dmae-certify: error: rank ") and "5.png" in said[0], result.stderr
    record = json.loads((tmp_path / "r.tsv.json").read_text())
    assert record["status"] == "failed" and "5.png" in record["error"]


def test_bad_image_under_torchrun_ends_the_job(tmp_path):
    folder, labels = _digit_folder(tmp_path, broken=2)
    command = _torchrun_command(2, ["--ckpt", "demo", "--data", str(folder), "--labels", str(labels), "--num-samples",
                                    "300", "--quiet", "--noise", "reference", "--out", str(tmp_path / "r.tsv")])
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode != 0
    assert len(_error_lines(result.stderr)) == 1 and "2.png" in result.stderr, result.stderr
    assert "[rank" not in result.stderr  # no rank's traceback (torchrun's own failure report remains)


def test_start_up_error_is_reported_once(tmp_path):
    command = _torchrun_command(2, ["--data", str(tmp_path / "missing"), "--ckpt", "demo", "--quiet",
                                    "--out", str(tmp_path / "r.tsv")])
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode != 0
    assert len(_error_lines(result.stderr)) == 1 and "missing" in result.stderr, result.stderr


# ---------------------------------------------------------------- when a rank or the launcher dies
def _launch(out: Path, settings: dict, *extra: str, env: dict | None = None) -> subprocess.Popen:
    """``dmae-certify --nproc-per-node 2``, in a session of its own (a shell job: its own process group)."""
    command = [DMAE_CERTIFY, "--nproc-per-node", "2", *_cli_args(settings, extra), "--out", str(out)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)


def _state(pid: int) -> str | None:
    """The process's state in /proc (Z: dead, not yet reaped by its parent); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z")


def _wait_for_ranks(process: subprocess.Popen, timeout: float = 600) -> list[int]:
    deadline = time.monotonic() + timeout
    while len(ranks := _worker_pids(process.pid)) < 2:
        assert process.poll() is None and time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.05)
    return list(ranks.values())


def _survivors(ranks: list[int]) -> list[int]:
    """The ranks still alive 300 s after their launcher was killed (a hang guard); each is killed now."""
    deadline = time.monotonic() + 300
    while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in ranks if _alive(pid)]
    for pid in survivors:  # leave no orphan behind a failed test
        os.kill(pid, signal.SIGKILL)
    return survivors


class KilledAndResumed(NamedTuple):
    """A dmae-certify job with 2 ranks whose launcher was SIGKILLed, then the job that resumed it."""

    out: Path
    survivors: list[int]  # the killed job's ranks that outlived their launcher
    said: list[str]  # what the killed job printed besides its announcement
    kept: int  # the rows it left on disk
    status: int  # the resuming job's exit status
    err: str  # ... and its stderr


def _kill_launcher_and_resume(folder: Path, when: str, extra: tuple[str, ...], resume) -> KilledAndResumed:
    """``when`` "start-up": the job's process group SIGKILLed as its ranks start; "mid-run": the launcher alone,
    once a row is on disk. ``resume(out)`` then starts the job that continues it."""
    out = folder / "r.tsv"
    process = _launch(out, SMALL, *extra, env=holding(folder))
    ranks = _wait_for_ranks(process)
    if when == "start-up":
        os.killpg(process.pid, signal.SIGKILL)
    else:
        _wait_for_rows(process, out)
        os.kill(process.pid, signal.SIGKILL)
    survivors = _survivors(ranks)
    _, err = process.communicate(timeout=300)  # nothing holds the pipes any more
    kept = _rows_on_disk(out)
    return KilledAndResumed(out, survivors, _said(err, out), kept, *_finish(resume(out)))


@pytest.fixture(scope="module")
def killed_at_start_up(tmp_path_factory) -> KilledAndResumed:
    """A --sequential job killed at start-up, resumed by torchrun with 3 ranks claiming images."""
    return _kill_launcher_and_resume(tmp_path_factory.mktemp("start-up"), "start-up", ("--sequential",),
                                     lambda out: _torchrun(3, out, SMALL, "--sequential", "--resume"))


@pytest.fixture(scope="module")
def killed_mid_run(tmp_path_factory) -> KilledAndResumed:
    """A job whose launcher was killed mid-run, resumed by torchrun with 3 ranks sharing samples."""
    return _kill_launcher_and_resume(tmp_path_factory.mktemp("mid-run"), "mid-run", (),
                                     lambda out: _torchrun(3, out, SMALL, "--shard", "samples", "--resume"))


@pytest.mark.parametrize("when, rows", [("start-up", "sequential"), ("mid-run", "small")])
def test_ranks_end_with_their_killed_launcher_and_resume_completes(request, reference, when, rows):
    """Ranks run in sessions of their own: kill -9 of the job's process group (at start-up) left both
    alive for minutes, holding the caller's pipes; kill -9 of the launcher alone (mid-run) made them
    print ~150 lines of 'DistNetworkError: Broken pipe' tracebacks."""
    run = request.getfixturevalue("killed_at_start_up" if when == "start-up" else "killed_mid_run")
    assert not run.survivors, "a rank outlived its launcher"
    assert run.said == []
    assert run.status == 0, run.err
    assert _rows(run.out) == _rows(reference[rows])


def test_image_shards_equal_one_process(killed_at_start_up, reference):
    """Three ranks claiming images (--sequential: each image stops at its own look) write one process's rows;
    the run record names each rank and what it did."""
    run = killed_at_start_up
    assert run.status == 0, run.err
    assert _rows(run.out) == _rows(reference["sequential"])
    record = _record(run.out)
    assert record["status"] == "complete" and record["world_size"] == 3 and record["shard"] == "images"
    assert [r["rank"] for r in record["ranks"]] == [0, 1, 2]
    assert sum(r["images"] for r in record["ranks"]) == record["images"] == SMALL["max_images"] - run.kept
    assert not parts_dir(run.out).exists()


def test_killed_job_resumes_with_another_number_of_processes_and_sharding(killed_mid_run, reference):
    """The rows 2 ranks claiming images kept are continued by 3 ranks sharing samples (as 3 ranks sharing
    samples from the start: every image's noise is the same wherever it is counted)."""
    run = killed_mid_run
    assert 1 <= run.kept < SMALL["max_images"]
    assert run.status == 0, run.err
    assert _rows(run.out) == _rows(reference["small"])
    _check_sample_shares(run.out, 3, images=SMALL["max_images"] - run.kept)
    assert not parts_dir(run.out).exists()


@pytest.mark.parametrize("rank", [0, 1])
def test_a_killed_rank_is_named_in_one_line(tmp_path, rank):
    """Was: rank 1 killed -> 'interrupted by SIGTERM' (the launcher's signal to rank 0); rank 0 killed -> no line,
    and the run record said 'running' beside a stale lock file (rank 0 ends the run's record and lock; the
    launcher, which survives it, now does what a killed rank 0 could not)."""
    out = tmp_path / "r.tsv"
    process = _launch(out, SMALL, env=holding(tmp_path))
    _wait_for_rows(process, out)
    os.kill(_worker_pids(process.pid)[rank], signal.SIGKILL)
    status, err = _finish(process)
    assert status == 137
    said = _said(err, out)
    assert len(said) == 1, err
    assert said[0].startswith(f"dmae-certify: error: rank {rank} died (killed by signal 9, SIGKILL); "), err
    assert "--resume" in said[0]
    record = _record(out)
    if rank == 0:
        assert record["status"] == "failed" and record["error"] == "rank 0 died (killed by signal 9, SIGKILL)"
    else:  # rank 0 ended the run itself
        assert record["status"] == "interrupted"
    assert not Path(f"{out}.lock").exists()


RANK_1_DIES_RANK_0_ENDS_FIRST = """
import atexit, os, signal, sys, time

if os.environ.get("RANK") == "0":  # the launcher's SIGTERM waits until rank 0 has ended and Python exits
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    @atexit.register  # the first registered: it runs last
    def take_the_launcher_s_signal():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        time.sleep(60)

elif os.environ.get("RANK") == "1":  # killed at its third sum of counts
    sums = []

    def die_at_the_third_sum(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "summed":
            sums.append(1)
            if len(sums) == 3:
                os.kill(os.getpid(), signal.SIGKILL)

    class ProfileSums:
        def find_spec(self, name, path=None, target=None):
            if name == "dmae_fast.distributed.ranks":
                sys.setprofile(die_at_the_third_sum)
            return None

    sys.meta_path.insert(0, ProfileSums())
"""


def test_a_rank_killed_while_sharing_samples_is_one_line(tmp_path):
    """Rank 0 meets the death in its next sum of counts and ends at once, by itself (no line: the
    launcher says it); the launcher's SIGTERM then found it in Python's exit handlers, where the
    Interrupted it raised was printed as 'Exception ignored in atexit callback' with a traceback."""
    out = tmp_path / "r.tsv"
    env = with_site(tmp_path, RANK_1_DIES_RANK_0_ENDS_FIRST)
    status, err = _finish(_launch(out, SMALL, "--shard", "samples", env=env))
    assert status == 137
    said = _said(err, out)
    assert len(said) == 1, err
    assert said[0].startswith("dmae-certify: error: rank 1 died (killed by signal 9, SIGKILL); "), err
    assert _record(out)["status"] == "failed"


def test_ctrl_c_is_the_run_s_own_line_and_one_process_resumes_the_job(tmp_path, reference):
    """Was followed by torch's 'Received 2 death signal, shutting down workers' warning. The rows kept by
    2 ranks are continued by one process (this one)."""
    out = tmp_path / "r.tsv"
    process = _launch(out, SMALL, env=holding(tmp_path))
    _wait_for_rows(process, out)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground process group
    status, err = _finish(process)
    assert status == 130
    assert _said(err, out) == ["dmae-certify: interrupted by SIGINT; "
                               f"the rows certified so far are in {out.name}.parts/; "
                               "continue with the same command and --resume (any number of processes)"], err
    _one_process(out, SMALL, resume=True)
    assert _rows(out) == _rows(reference["small"])
    assert not parts_dir(out).exists()


def test_a_full_disk_is_one_line_naming_the_file(tmp_path):
    """Was one line per rank, each ending in ': None' (write and fsync errors carry no file name)."""
    env = with_site(tmp_path,  # every process of the job: each fsync meets a full disk
                     "import os\n\ndef fsync(fd):\n    raise OSError(28, 'No space left on device')\n\n"
                     "os.fsync = fsync\n")
    out = tmp_path / "r.tsv"
    status, err = _finish(_launch(out, SMALL, env=env))
    assert status == 2
    said = _said(err, out)
    assert len(said) == 1 and said[0].startswith("dmae-certify: error: rank "), err
    assert said[0].endswith(".tsv") and f"No space left on device: {out}.parts/rank" in said[0], err
    record = _record(out)
    assert record["status"] == "failed" and record["error"] in said[0]


def test_a_signal_that_also_kills_a_dataloader_worker_is_only_an_interruption():
    """The launcher stops a rank with SIGTERM to the rank's process group, its DataLoader workers included.
    torch's SIGCHLD handler then raised 'DataLoader worker ... is killed by signal: Terminated' wherever the
    rank was next: inside torch.compile (caught there: a spurious 'compiled noise unavailable' notice) or
    in its cleanup (a traceback). Here the SIGTERM and the worker's SIGCHLD arrive together, as from killpg.

    In a fresh interpreter, as a rank is: in a pytest worker that ran tests/test_cpu_fast.py before, CPython's
    own SIGTERM handler segfaulted (at 9717f8e too), which took the test runner down with it."""
    done = subprocess.run([sys.executable, "-c", _SIGNAL_AND_DEAD_WORKER], capture_output=True, text=True,
                          timeout=600, check=False)
    assert (done.returncode, done.stdout) == (0, "caught []\n"), done.stderr


_SIGNAL_AND_DEAD_WORKER = """
import signal, subprocess, threading, time
from pathlib import Path
from torch.utils.data import DataLoader
from dmae_fast.base.errors import Interrupted, forget_signal, interrupt_on_signals

def state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None

loader = iter(DataLoader(range(10), batch_size=None, num_workers=1))
next(loader)
worker = loader._workers[0].pid
torch_handler = signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # until both signals are sent
subprocess.run(["kill", "-s", "TERM", str(worker)], check=True)  # not from its parent (the worker exits 0)
deadline = time.monotonic() + 300
while state(worker) != "Z":  # dead, left unreaped for torch's handler to find
    assert time.monotonic() < deadline, "the worker did not die"
    time.sleep(0.01)
signal.signal(signal.SIGCHLD, torch_handler)
caught, interrupted = [], False
interrupt_on_signals()
main = threading.main_thread().ident
try:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGCHLD})
    signal.pthread_kill(main, signal.SIGTERM)
    signal.pthread_kill(main, signal.SIGCHLD)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGCHLD})
    except Interrupted:
        interrupted = True
    for _ in range(50):  # the SIGCHLD is handled in here, where a library catches what it raises
        try:
            time.sleep(0.002)
        except Exception as error:  # what torch.compile's fallback does
            caught.append(error)
finally:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGCHLD})
    forget_signal()
assert interrupted, "SIGTERM did not raise Interrupted"
print("caught", caught)
"""


# ---------------------------------------------------------------- the pieces, in this process
def test_shares_cover_every_row_once():
    for rows, world in [(100, 3), (10_000, 8), (2, 4), (1, 2)]:
        pieces = [RowSplit(rank, world, summed=lambda counts: counts).share(rows) for rank in range(world)]
        assert pieces[0][0] == 0 and pieces[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
        assert max(hi - lo for lo, hi in pieces) - min(hi - lo for lo, hi in pieces) <= 1


HEADER = "idx\tlabel\tpredict\tcorrect\ttime\tn\tcount1\tcount2\tpvalue\tsigma\n"


def _row(idx: int, predict: int = 1) -> str:
    return f"{idx}\t1\t{predict}\t1\t0:00:01\t100\t90\t5\t1.000000e-05\t0.25\n"


def test_merge_sorts_rows_accepts_identical_repeats_and_drops_torn_lines(tmp_path):
    out = tmp_path / "r.tsv"
    out.write_text(HEADER + _row(4))
    start_parts(out, replacing=False, seed=0)
    part_path(out, 0).write_text(HEADER + _row(7) + _row(4))  # row 4 again: a merge cut short by a crash
    part_path(out, 1).write_text(HEADER + _row(2) + "9\t1\t1")  # torn last line
    assert merge_parts(out, "predict", into=out) == 3
    assert out.read_text() == HEADER + _row(2) + _row(4) + _row(7)
    assert not parts_dir(out).exists()


def test_merge_refuses_two_different_rows_for_one_image(tmp_path):
    out = tmp_path / "r.tsv"
    start_parts(out, replacing=False, seed=0)
    part_path(out, 0).write_text(HEADER + _row(3, predict=1))
    part_path(out, 1).write_text(HEADER + _row(3, predict=2))
    with pytest.raises(UserError, match="idx 3 has two different rows"):
        merge_parts(out, "predict", into=out)
    assert not out.exists() and parts_dir(out).exists()  # nothing lost


def test_parts_without_resume_are_refused_and_resume_takes_them(tmp_path, reference):
    """A killed multi-process run left parts: a plain rerun is refused, one process --resume finishes it."""
    out = tmp_path / "r.tsv"
    Path(f"{out}.json").write_bytes(Path(f"{reference['small']}.json").read_bytes())  # the killed run's record
    lines = reference["small"].read_text().splitlines(keepends=True)
    start_parts(out, replacing=False, seed=0)
    part_path(out, 0).write_text(lines[0] + "".join(lines[1:4]))
    part_path(out, 1).write_text(lines[0] + lines[6])
    with pytest.raises(UserError, match="unfinished multi-process run"):
        _one_process(out, SMALL)
    _one_process(out, SMALL, resume=True)
    assert _rows(out) == _rows(reference["small"])
    assert not parts_dir(out).exists()


@pytest.mark.parametrize("args, message", [
    (["--nproc-per-node", "0"], "--nproc-per-node must be >= 1"),
    (["--nproc-per-node", "2", "--max-restarts", "-1"], "--max-restarts >= 0"),
    (["--shard", "pixels"], "--shard: invalid choice"),
])
def test_bad_launch_options_give_one_line(tmp_path, capsys, args, message):
    from dmae_fast.cli.certify import main

    try:
        status = main(["--data", "demo", "--seed", "0", "--out", str(tmp_path / "r.tsv"), *args])
    except SystemExit as stop:  # argparse's own errors
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "r.tsv").exists()


def test_scaling_bench_runs_each_process_count_and_checks_rows(tmp_path):
    from dmae_fast.bench.scaling import ScalingConfig, run_scaling

    certify = ("--data", "demo", "--seed", "0", "--max", "3", "--n", "200", "--noise", "reference")
    record, paths = run_scaling(ScalingConfig(out=str(tmp_path), procs=(1, 2), rounds=1, certify=certify))
    assert record["identical_rows"] and record["samples_per_run"] == 3 * 300
    assert [row["procs"] for row in record["table"]] == [1, 2]
    assert record["table"][0]["efficiency"] == 1.0 and record["table"][1]["efficiency"] > 0
    assert all(path.exists() for path in paths) and "| 2 |" in paths[1].read_text()


def test_scaling_bench_refuses_an_out_for_dmae_certify(tmp_path):
    from dmae_fast.bench.scaling import ScalingConfig, run_scaling

    with pytest.raises(UserError, match="no --out"):
        run_scaling(ScalingConfig(out=str(tmp_path), certify=("--data", "demo", "--seed", "0", "--out", "x.tsv")))
