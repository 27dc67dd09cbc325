"""What crashes, signals, second writers and edited files do to dmae-certify's outputs.

Subprocess tests run the real console entry (signals need a real process); the rest go
through ``main(argv)`` in-process. A run to be signalled needs no long run: it stops after each
row (or checkpoint) until the test lets it go (tests/finished_hooks.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from finished_hooks import CHECKPOINT_SAVED, ROW_WRITTEN, holding, let_go
from helpers import rows_without

from dmae_fast.base.errors import UserError
from dmae_fast.base.locking import OutputLock
from dmae_fast.cli.certify import main

# 4 demo digits; the torch-ops noise: a fresh process need not compile the noise kernel (seconds), and nothing
# here depends on how the noise is computed.
SMALL = ["--data", "demo", "--seed", "0", "--n0", "20", "--n", "200", "--batch", "64", "--max", "4", "--device", "cpu",
         "--sigma", "0.25", "--precision", "fp32", "--noise", "reference", "--quiet"]


def one_error(capsys, rc: int, *mentions: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("dmae-certify: error:")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """The uninterrupted run that interrupted and resumed runs must reproduce."""
    out = tmp_path_factory.mktemp("small") / "small.tsv"
    assert main([*SMALL, "--out", str(out)]) == 0
    return out


# --------------------------------------------------------------------------- a second writer


@pytest.mark.parametrize("mode", [[], ["--resume"], ["--overwrite"]], ids=["new", "resume", "overwrite"])
def test_a_second_writer_is_refused_and_the_first_file_is_intact(tmp_path, capsys, small, mode):
    out = tmp_path / "shared.tsv"
    if mode:
        out.write_bytes(small.read_bytes())
        Path(str(out) + ".json").write_bytes(Path(str(small) + ".json").read_bytes())
    before = out.read_bytes() if out.exists() else None
    with OutputLock(out, "results file"):  # another process holds the output
        message = one_error(capsys, main([*SMALL, *mode, "--out", str(out)]), "being written by another process",
                            f"pid {os.getpid()}")
    assert str(out) in message
    assert (out.read_bytes() if out.exists() else None) == before
    assert not Path(str(out) + ".partial").exists()


def _holding(folder: Path, after: str = ROW_WRITTEN) -> dict[str, str]:
    """The environment of a one-thread process that holds after each call of ``after`` until ``let_go(folder)``."""
    return {**holding(folder, after), "OMP_NUM_THREADS": "1"}


def _command(out: Path, *extra: str) -> list[str]:
    """dmae-certify (the console script) on SMALL."""
    script = Path(sys.executable).with_name("dmae-certify")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "dmae_fast.cli.certify"]
    return [*command, *SMALL, *extra, "--out", str(out)]


def _start(out: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    return subprocess.Popen(_command(out, *extra), stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(done, process: subprocess.Popen) -> None:
    """Wait until ``done()`` (a hang guard of 900 s); a process that ended first fails the test."""
    deadline = time.monotonic() + 900
    while not done():
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "the process never got there"
        time.sleep(0.02)


def _rows_in(path: Path) -> int:
    return path.read_text().count("\n") - 1 if path.exists() else 0


def _signal_when(done, process: subprocess.Popen, signum: int, folder: Path) -> str:
    """Send ``signum`` to a ``_holding(folder)`` process once ``done()`` (it holds there), then let it go (a run
    that ignored the signal ends normally instead of hanging); its stderr."""
    _wait_for(done, process)
    process.send_signal(signum)
    let_go(folder)
    return process.communicate(timeout=900)[1]


def test_a_second_real_process_is_refused_while_the_first_runs(tmp_path, small):
    out = tmp_path / "busy.tsv"
    env = _holding(tmp_path)
    first = _start(out, env)
    try:
        _wait_for(lambda: _rows_in(out) >= 1, first)  # it holds the lock, and holds after its first row
        second = subprocess.run(_command(out, "--resume"), capture_output=True, text=True, env=env, timeout=900)
    finally:
        let_go(tmp_path)
    _, err = first.communicate(timeout=900)
    assert second.returncode == 2, second.stderr
    assert second.stderr.strip().splitlines()[-1].startswith("dmae-certify: error: results file")
    assert f"pid {first.pid}" in second.stderr
    assert first.returncode == 0, err
    assert rows_without(out) == rows_without(small)
    assert not Path(str(out) + ".lock").exists()


# --------------------------------------------------------------------------- signals


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_the_run_keeps_the_rows_and_resume_completes_them(tmp_path, small, signum):
    out = tmp_path / "signalled.tsv"
    process = _start(out, _holding(tmp_path))
    err = _signal_when(lambda: _rows_in(out) >= 1, process, signum, tmp_path)
    assert process.returncode == 128 + signum, err
    assert 1 <= _rows_in(out) < _rows_in(small)
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert lines[-1].startswith(f"dmae-certify: interrupted by {signal.Signals(signum).name}")
    assert "--resume" in lines[-1] and f"1 new row is in {out}" in lines[-1]
    assert json.loads(Path(str(out) + ".json").read_text())["status"] == "interrupted"
    assert main([*SMALL, "--resume", "--out", str(out)]) == 0
    assert rows_without(out) == rows_without(small)


def test_a_signal_whose_exception_a_library_swallows_still_stops_the_run(tmp_path, capsys, monkeypatch):
    """torch.compile's guards run Python lambdas and take any exception in them for a failed guard:
    a SIGINT landing there vanished (1 run in ~40 of the subprocess test above ended normally).
    Here the second noise call receives SIGINT inside code that swallows every exception; the run
    must still stop after that batch, mark its record interrupted and say how to resume."""
    from dmae_fast.noise.compiled import NoiseSource

    original, calls = NoiseSource.__call__, []

    def swallowing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            try:
                signal.raise_signal(signal.SIGINT)
                for _ in range(1000):  # the handler runs at the next bytecode boundary
                    pass
            except BaseException:  # noqa: BLE001 (what the library does)
                pass
        return original(self, *args, **kwargs)

    monkeypatch.setattr(NoiseSource, "__call__", swallowing)
    out = tmp_path / "swallowed.tsv"
    assert main([*SMALL, "--out", str(out)]) == 130
    assert len(calls) == 2, "the run went on after the signal"
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dmae-certify: interrupted by SIGINT") and "--resume" in err[-1]
    assert f"0 new rows are in {out}" in err[-1]  # 2 batches of 64 samples: no image has its 220
    assert json.loads(Path(str(out) + ".json").read_text())["status"] == "interrupted"
    assert main([*SMALL, "--out", str(tmp_path / "after.tsv")]) == 0  # the next command starts afresh


def test_a_signal_during_overwrite_leaves_the_old_file(tmp_path, small):
    out = tmp_path / "precious.tsv"
    out.write_bytes(small.read_bytes())
    process = _start(out, _holding(tmp_path), "--overwrite")
    err = _signal_when(lambda: _rows_in(Path(str(out) + ".partial")) >= 1, process, signal.SIGTERM, tmp_path)
    assert process.returncode == 143, err
    assert out.read_bytes() == small.read_bytes()
    assert "is unchanged" in err.strip().splitlines()[-1] and ".partial" in err


# --------------------------------------------------------------------------- resume trusts nothing


def _edit(path: Path, row: int, column: str, value: str) -> None:
    lines = path.read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\n").split("\t")
    cells = lines[row].rstrip("\n").split("\t")
    cells[header.index(column)] = value
    lines[row] = "\t".join(cells) + "\n"
    path.write_text("".join(lines))


def _partial_copy(small: Path, directory: Path, rows: int = 2) -> Path:
    out = directory / "kept.tsv"
    out.write_text("".join(small.read_text().splitlines(keepends=True)[: 1 + rows]))
    Path(str(out) + ".json").write_bytes(Path(str(small) + ".json").read_bytes())
    return out


@pytest.mark.parametrize(("edit", "mentions"), [
    (lambda p: _edit(p, 1, "radius", "0.999999"), ["has radius 0.999999"]),
    (lambda p: _edit(p, 2, "pA_lower", "0.9990000000"), ["pA_lower"]),
    (lambda p: _edit(p, 1, "nA", "150"), ["pA_lower"]),
    (lambda p: _edit(p, 1, "label", "7"), ["label 7"]),
    (lambda p: _edit(p, 1, "predict", "-1"), ["contradicts"]),
    (lambda p: _edit(p, 1, "idx", "3000"), ["not one of this run's images"]),
    (lambda p: _edit(p, 2, "idx", "0"), ["more than one row"]),
    (lambda p: _edit(p, 1, "sigma", "0.5"), ["sigma 0.5"]),
    (lambda p: _edit(p, 1, "n", "100"), ["n = 100"]),
    (lambda p: _edit(p, 1, "procedure", "sequential-cp-bonferroni-K6"), ["procedure"]),
])
def test_resume_refuses_rows_it_did_not_write(tmp_path, capsys, small, edit, mentions):
    out = _partial_copy(small, tmp_path)
    edit(out)
    before = out.read_bytes()
    one_error(capsys, main([*SMALL, "--resume", "--out", str(out)]), "--resume", *mentions)
    assert out.read_bytes() == before


def test_resume_drops_a_torn_last_line_and_completes(tmp_path, small):
    out = _partial_copy(small, tmp_path)
    with open(out, "a") as f:
        f.write("2\t1\t1\t0.5")  # a crash in the middle of a row
    assert main([*SMALL, "--resume", "--out", str(out)]) == 0
    assert rows_without(out) == rows_without(small)


# A value other than the base run's for every setting a resumed run must match (a new setting that changes the
# results must be added here, or test_resume_checks_exactly_the_settings_that_change_the_results fails).
CHANGED = {"engine": "other.safetensors", "data": "/data/val", "split": "train", "labels": "labels.txt",
           "image_size": 9, "input_size": 9, "normalize": "cifar10", "sigma": 0.5, "n0": 21, "n": 201, "alpha": 0.01,
           "seed": 1, "predict": True, "skip": 2, "max_images": 3, "precision": "fp16", "sequential": True,
           "looks": (100, 201), "futility": "none", "grow": "off", "sequential_test": "bonferroni",
           "procedure_name": "certify", "sound": True, "quantize": True, "radii": (0.5, 1.0), "reference": "ref.tsv",
           "paired_samples": 50, "scratch_above": 0.5, "disagreement_rate": 0.01, "keep_votes": 50}
HOW = {"device": "cuda", "workers": 3, "batch": 7, "shard": "samples", "fast": True, "fused": True, "compile": True,
       "cuda_graphs": True, "noise": "reference", "cpu_runtime": "torch", "body_reason": "a test", "progress": False}
KINDS = {"certify": {}, "predict": {"predict": True}, "sequential": {"sequential": True},
         "sound": {"sound": True}}


def _config(tmp_path, settings: dict):
    from dmae_fast.run.config import CertifyConfig

    base = dict(engine="model.safetensors", data="demo", out=str(tmp_path / "r.tsv"), sigma=0.25, n0=20, n=200,
                seed=0, precision="fp32", resume=True)
    return CertifyConfig.from_settings({**base, **settings})


def _resumes(tmp_path, recorded: dict, resumed: dict) -> str | None:
    """None if a run of ``resumed`` may continue the rows of a run of ``recorded``, else the refusal."""
    from dmae_fast.run.output import output_mode

    first = _config(tmp_path, recorded)
    (tmp_path / "r.tsv").write_text("idx\tlabel\tpredict\tradius\tcorrect\ttime\n")
    (tmp_path / "r.tsv.json").write_text(json.dumps({"config": first.recorded()}, default=list))
    try:
        output_mode(_config(tmp_path, resumed))
    except UserError as error:
        return str(error)
    return None


@pytest.mark.parametrize("kind", KINDS)
def test_resume_checks_exactly_the_settings_that_change_the_results(tmp_path, kind):
    """Every setting that changes the noise, the classifier's input or a decision, in both directions, for
    certify, predict, sequential and sound files; none of the settings of how the run computes."""
    base = KINDS[kind]
    checked = set(_config(tmp_path, base).must_match())
    assert checked == set(CHANGED) - ({"radii"} if kind != "sequential" else set())
    for key in sorted(checked):
        value = "predict" if key == "procedure_name" and kind == "predict" else CHANGED[key]  # a registered name
        value = not base[key] if key in base else value  # this kind's own switch: off
        changed = {**base, key: value, **({"sound": True} if key == "quantize" else {})}
        if changed.get("predict") and changed.get("sequential"):  # a sequential PREDICT is no run: drop the other
            changed = {**changed, ("sequential" if key == "predict" else "predict"): False}
        plain = {**base, **({"sound": True} if key == "quantize" else {})}
        for recorded, resumed in ((plain, changed), (changed, plain)):
            refusal = _resumes(tmp_path, recorded, resumed)
            assert refusal is not None and key in refusal.split(" differ ")[0], (key, recorded, resumed, refusal)
    for key, value in HOW.items():
        assert _resumes(tmp_path, base, {**base, key: value}) is None, key


def test_resume_without_seed_takes_the_recorded_one_and_a_given_seed_must_match(tmp_path):
    assert _resumes(tmp_path, {"seed": 5}, {"seed": None}) is None
    assert "seed" in _resumes(tmp_path, {"seed": 5}, {"seed": 6})


@pytest.mark.parametrize("first, then", [([], ["--sound"]), (["--sound"], []),
                                         (["--predict"], ["--predict", "--sound"]),
                                         (["--predict", "--sound"], ["--predict"]),
                                         (["--sequential"], ["--sequential", "--sound"]),
                                         (["--sequential", "--sound"], ["--sequential"])])
def test_a_run_never_continues_rows_of_the_other_noise(tmp_path, capsys, first, then):
    """A default run's rows continued with --sound (and the reverse) would carry a claim only some rows earned."""
    out = tmp_path / "r.tsv"
    assert main([*SMALL, *first, "--out", str(out)]) == 0
    out.write_text("\n".join(out.read_text().splitlines()[:-1]) + "\n")  # the last image lost
    before = out.read_bytes()
    one_error(capsys, main([*SMALL, *then, "--resume", "--out", str(out)]), "--resume", "sound differ")
    assert out.read_bytes() == before
    assert main([*SMALL, *first, "--resume", "--out", str(out)]) == 0


def test_resume_refuses_another_classifier_file(tmp_path, capsys):
    from dmae_fast.demo import DEMO_CHECKPOINT

    model, out = tmp_path / "model.safetensors", tmp_path / "r.tsv"
    model.write_bytes(DEMO_CHECKPOINT.read_bytes())
    assert main([*SMALL, "--ckpt", str(model), "--out", str(out)]) == 0
    out.write_text("\n".join(out.read_text().splitlines()[:-1]) + "\n")
    record = json.loads(Path(f"{out}.json").read_text())
    record["model_sha256"] = "0" * 64  # as if the rows came from another file at that path
    Path(f"{out}.json").write_text(json.dumps(record))
    one_error(capsys, main([*SMALL, "--ckpt", str(model), "--resume", "--out", str(out)]), "not the classifier file")


# --------------------------------------------------------------------------- how much a crash can take


def test_rows_survive_sigkill_and_fsync_is_bounded(tmp_path, monkeypatch):
    """Every row reaches the OS at once (SIGKILL loses none); fsync runs at most every SYNC_SECONDS."""
    out = tmp_path / "killed.tsv"
    child = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from dmae_fast.results.writer import CertifyRow, ResultsWriter
writer = ResultsWriter({str(out)!r})
for i in range(50):
    writer.write(CertifyRow(i, 1, 1, 0.5, 1, 0.01, 100, 1000, 990, 0.98, 0.25, "cohen-fixed-n"))
print("written", flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "written"
    child.kill()
    child.wait(timeout=300)
    from dmae_fast.results.format import read_results

    assert read_results(out).idx.tolist() == list(range(50))

    import dmae_fast.results.writer as results

    calls = []
    real = os.fsync
    monkeypatch.setattr(results.os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    with results.ResultsWriter(tmp_path / "many.tsv") as writer:
        for i in range(2000):
            writer.write(results.CertifyRow(i, 1, 1, 0.5, 1, 0.01, 100, 1000, 990, 0.98, 0.25, "cohen-fixed-n"))
    assert len(calls) <= 2 + 2  # the header, the close, and at most a couple of timed syncs


# --------------------------------------------------------------------------- training run directories

TRAIN = ["pretrain", "--preset", "demo-pretrain", "--set", "data.limit=32", "--set", "optim.batch_size=16",
         "--set", "data.crop_scale=none", "--set", "optim.warmup_epochs=1", "--set", "optim.epochs=3", "--quiet"]


def _train(*args: str) -> int:
    from dmae_fast.train.command import main as train_main

    return train_main(list(args))


def _weights(run: Path) -> dict:
    from dmae_fast.model.checkpoints import read_checkpoint

    return read_checkpoint(run / "pretrain.pth").state


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """An uninterrupted 3-epoch run, the reference for interrupted ones."""
    out = tmp_path_factory.mktemp("train") / "reference"
    assert _train(*TRAIN, "--out", str(out)) == 0
    return out


def test_training_killed_before_its_first_checkpoint_resumes_from_the_start(tmp_path, capsys, trained):
    """Was a dead end: --resume said 'nothing to resume', a new run said 'already holds a run'."""
    out = tmp_path / "early"
    assert _train(*TRAIN, "--show-config") == 0
    out.mkdir()
    config = json.loads(capsys.readouterr().out)
    (out / "config.json").write_text(json.dumps(config))  # what a run killed at once leaves
    assert _train("pretrain", "--resume", "--quiet", "--out", str(out)) == 0
    assert "starting the run from its first epoch" in capsys.readouterr().err
    reference, resumed = _weights(trained), _weights(out)
    assert all(bool((reference[k] == resumed[k]).all()) for k in reference)
    assert json.loads((out / "status.json").read_text())["status"] == "complete"


def test_a_second_training_run_on_one_directory_is_refused(tmp_path, capsys, trained):
    out = tmp_path / "shared"
    out.mkdir()
    with OutputLock(out, "run directory"):
        assert _train(*TRAIN, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert "run directory" in err and "being written by another process" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in out.iterdir()) == []  # nothing written


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_training_resumes_to_the_same_weights(tmp_path, trained, signum):
    """Signalled after its first checkpoint (of 3)."""
    out = tmp_path / "signalled"
    process = subprocess.Popen([sys.executable, "-m", "dmae_fast.train.command", *TRAIN, "--out", str(out)],
                               stderr=subprocess.PIPE, text=True, env=_holding(tmp_path, CHECKPOINT_SAVED))
    err = _signal_when((out / "checkpoint.pt").exists, process, signum, tmp_path)
    assert process.returncode == 128 + signum, err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith(f"dmae-train: interrupted by {signal.Signals(signum).name}")
    assert "--resume" in last
    assert json.loads((out / "status.json").read_text())["status"] == "interrupted"
    assert _train("pretrain", "--resume", "--quiet", "--out", str(out)) == 0
    reference, resumed = _weights(trained), _weights(out)
    assert all(bool((reference[k] == resumed[k]).all()) for k in reference)
