"""Signals while dmae-certify starts, and the output check that needs no torch.

A signal is sent from inside the process at a point it surely reaches, never after a sleep: a
``sitecustomize`` on the command's ``PYTHONPATH`` puts a finder first on ``sys.meta_path`` that acts
when the process first looks for a given module, that is, in the middle of the imports before it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

DMAE_CERTIFY = str(Path(sys.executable).with_name("dmae-certify"))
RUN = ["--data", "demo", "--seed", "0",
       "--max-images", "2", "--n0", "10", "--num-samples", "100", "--device", "cpu", "--quiet"]
HANG_GUARD = 300  # seconds; a start takes a few, a 2-rank job under 30


def _with_site(tmp_path: Path, code: str) -> dict[str, str]:
    """The environment of a process that runs ``code`` (its ``sitecustomize``) before anything else."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(code)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


SIGNAL_AT = """
import signal, sys

class SignalAt:
    sent = False

    def find_spec(self, name, path=None, target=None):
        if name == {module!r} and not self.sent:
            self.sent = True
            signal.raise_signal(signal.{signame})
            print("went on after the signal", file=sys.stderr)
        return None

sys.meta_path.insert(0, SignalAt())
"""


@pytest.mark.parametrize("module, signame", [
    ("dmae_fast.cli.certify", "SIGTERM"),  # the entry point imports the command
    ("numpy._core._internal", "SIGTERM"),  # numpy's, after its C core: was a RecursionError where torch imports it
    ("torch._C", "SIGTERM"),  # torch's
    ("torch._C", "SIGINT"),
    ("scipy.special", "SIGTERM"),  # the certification modules'
])
def test_a_signal_while_starting_ends_the_command_at_once_in_one_line(tmp_path, module, signame):
    """Was, inside numpy: torch's C extension imports numpy and discards its errors, so the Interrupted
    raised there vanished, leaving numpy half-imported, and the next ``import numpy`` failed with a
    RecursionError in numpy's ``__getattr__`` (at other points: "cannot load module more than once per
    process", an AttributeError). Elsewhere it said "what was written so far is left as it is"."""
    out = tmp_path / "r.tsv"
    env = _with_site(tmp_path, SIGNAL_AT.format(module=module, signame=signame))
    result = subprocess.run([DMAE_CERTIFY, *RUN, "--out", str(out)], capture_output=True, text=True, env=env,
                            timeout=HANG_GUARD)
    assert result.returncode == 128 + signal.Signals[signame], result.stderr
    assert result.stderr.splitlines() == [f"dmae-certify: interrupted by {signame} while starting; nothing was written"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]  # no results, record or lock file


SIGNAL_AS_MAIN_RETURNS = """
import importlib.machinery, signal, sys

class SignalAsMainReturns:  # dmae_fast.cli.certify.main, then a SIGTERM before anything else runs
    def find_spec(self, name, path=None, target=None):
        if name != "dmae_fast.cli.certify":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            main = module.main

            def main_then_a_signal(*args):
                status = main(*args)
                signal.raise_signal(signal.SIGTERM)
                return status

            module.main = main_then_a_signal

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, SignalAsMainReturns())
"""


def test_a_signal_as_the_command_ends_adds_nothing(tmp_path):
    """The command has said how it ended; a signal now (a launcher stopping a rank that has just ended
    by itself on a lost peer) was a traceback: the Interrupted came after the command's own handling."""
    out = tmp_path / "r.tsv"
    out.write_text("precious\n")
    env = _with_site(tmp_path, SIGNAL_AS_MAIN_RETURNS)
    result = subprocess.run([DMAE_CERTIFY, *RUN, "--out", str(out)], capture_output=True, text=True, env=env,
                            timeout=HANG_GUARD)
    assert result.returncode == 143, result.stderr
    assert result.stderr.splitlines() == [f"dmae-certify: error: {out} exists; pass --overwrite to replace it or "
                                          "--resume to continue it"]


CTRL_C_WHILE_THE_RANKS_START = """
import os, signal, time, sys

class CtrlCWhileStarting:
    waiting = False

    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "RANK" in os.environ and not self.waiting:  # a rank starts importing torch
            self.waiting = True
            if os.environ["RANK"] == "1":
                os.kill(int(os.environ["DMAE_CERTIFY_LAUNCHER"]), signal.SIGINT)
            time.sleep(600)  # in the import, until the launcher stops this rank
        return None

sys.meta_path.insert(0, CtrlCWhileStarting())
"""


@pytest.mark.slow
def test_ctrl_c_while_the_ranks_start_is_the_launcher_s_one_line(tmp_path):
    """Was up to three lines: the launcher's, and a starting rank's 'interrupted by SIGINT; what was
    written so far is left as it is' (the ranks printed it until their run began and left it to the launcher)."""
    out = tmp_path / "r.tsv"
    env = _with_site(tmp_path, CTRL_C_WHILE_THE_RANKS_START)
    result = subprocess.run([DMAE_CERTIFY, "--nproc-per-node", "2", *RUN, "--out", str(out)], capture_output=True,
                            text=True, env=env, timeout=HANG_GUARD)
    assert result.returncode == 130, result.stderr
    said = result.stderr.splitlines()
    assert len(said) == 1 and said[0].startswith("dmae-certify: interrupted by SIGINT; "), result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


def test_an_existing_out_is_refused_before_torch_is_imported(tmp_path):
    """Was refused after 8-10 s of imports (torch, the engines); also by the launcher, before its ranks."""
    existing = tmp_path / "r.tsv"
    existing.write_text("precious\n")
    cases = [(existing, "exists; pass --overwrite"), (tmp_path / "missing" / "r.tsv", "does not exist"),
             (tmp_path, "is a directory")]
    for out, message in cases:
        for extra in ([], ["--nproc-per-node", "2"]):
            script = ("import sys; from dmae_fast.cli.certify import main; "
                      f"rc = main({[*RUN, *extra, '--out', str(out)]!r}); "
                      "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)")
            result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD)
            assert result.returncode == 2 and message in result.stderr, (out, extra, result.stderr)
            assert len(result.stderr.splitlines()) == 1, result.stderr
    assert existing.read_text() == "precious\n"


MISSING_INPUTS = """
import contextlib, importlib, io, json, sys
said = []
for module, argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        said.append([importlib.import_module(module).main(argv), err.getvalue()])
assert "torch" not in sys.modules, "torch was imported"
print(json.dumps(said))
"""


def test_a_missing_classifier_dataset_or_labels_file_is_refused_before_torch_is_imported(tmp_path):
    """Was refused after 4-7 s of imports (or, with --nproc-per-node, by every rank after its own); dmae-serve's and
    dmae-export's classifier file likewise (after 9 and 4 s), and dmae-serve replay's and dmae-train's files."""
    folder, out, answer = tmp_path / "images", str(tmp_path / "out"), tmp_path / "answer.json"
    folder.mkdir()
    answer.write_text("{}")  # read before torch; what it holds is checked after
    none = {name: str(tmp_path / name) for name in ("none.safetensors", "none.onnx", "none", "none.txt", "none.pth")}
    classifier = {"checkpoint": ["--ckpt", none["none.safetensors"]], "engine": ["--engine", none["none.onnx"]]}
    missing = {"checkpoint": f"checkpoint {none['none.safetensors']} does not exist",
               "engine": f"engine {none['none.onnx']} does not exist"}
    certify = [*((args, missing[what]) for what, args in classifier.items()),
               (["--ckpt", "demo", "--data", none["none"]], f"path does not exist: {none['none']}"),
               (["--ckpt", "demo", "--data", str(folder), "--labels", none["none.txt"]],
                f"path does not exist: {none['none.txt']}")]
    runs = [("dmae-certify", "dmae_fast.cli.certify", [*RUN, *args, *extra, "--out", out], said)
            for args, said in certify for extra in ([], ["--nproc-per-node", "2"])]
    runs += [("dmae-serve", "dmae_fast.cli.serve", [*args, "--port", "0"], said) for args, said in certify[:2]]
    runs += [("dmae-export", "dmae_fast.export.command", [*classifier["checkpoint"], "--out", out],
              missing["checkpoint"])]
    replay = "dmae_fast.cli.serve_replay"
    runs += [("dmae-serve replay", replay, [str(answer), none["none"], *args], said) for args, said in certify[:2]]
    runs += [("dmae-serve replay", replay, [none["none.txt"], str(answer), "--ckpt", "demo"],
              f"{none['none.txt']}: no such dmae-serve answer"),
             ("dmae-serve replay", replay, [str(answer), none["none"], "--ckpt", "demo"],
              f"{none['none']}: no such image file")]
    no_start = f"checkpoint {none['none.pth']} does not exist"
    runs += [("dmae-train", "dmae_fast.train.command", [command, "--preset", f"demo-{command}", "--init",
                                                         none["none.pth"], "--out", out], no_start)
             for command in ("pretrain", "finetune", "linprobe", "visualize")]
    runs += [("dmae-train", "dmae_fast.train.command", ["finetune", "--preset", "demo-finetune", "--set",
                                                        f"data.dataset={none['none']}", "--out", out],
              f"training data {none['none']} is not 'demo' or an existing directory"),
             ("dmae-train", "dmae_fast.train.command", ["visualize", "--init", "demo", "--set",
                                                        f"dataset={none['none']}", "--out", out],
              f"path does not exist: {none['none']}")]
    done = subprocess.run([sys.executable, "-c", MISSING_INPUTS, json.dumps([run[1:3] for run in runs])],
                          capture_output=True, text=True, timeout=HANG_GUARD)
    assert done.returncode == 0, done.stderr
    for (prog, _, argv, said), (status, err) in zip(runs, json.loads(done.stdout)):
        assert status == 2 and err.splitlines() == [f"{prog}: error: {said}"], (prog, argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["answer.json", "images"]


@pytest.mark.parametrize("command, argv", [
    ("dmae-serve", ["--ckpt", "demo", "--port", "0", "--device", "cpu"]),
    ("dmae-export", ["--ckpt", "demo", "--format", "onnx", "--out", "{tmp}/engines"]),
    ("dmae-train", ["pretrain", "--preset", "demo-pretrain", "--out", "{tmp}/run"]),
])
def test_the_other_commands_import_torch_where_a_signal_ends_them_in_one_line(tmp_path, command, argv):
    """The same numpy-inside-torch import in the commands that load torch after checking their options."""
    env = _with_site(tmp_path, SIGNAL_AT.format(module="numpy._core._internal", signame="SIGTERM"))
    result = subprocess.run([str(Path(sys.executable).with_name(command)), *[a.format(tmp=tmp_path) for a in argv]],
                            capture_output=True, text=True, env=env, timeout=HANG_GUARD)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert result.stderr.splitlines() == [f"{command}: interrupted by SIGTERM while starting; nothing was written"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]


SIGNAL_AFTER_LISTENING = """
import signal, sys

class SignalAfterListening:  # stderr that raises SIGTERM in the process once dmae-serve's listening line is out
    def __init__(self, stream):
        self.stream, self.sent = stream, False

    def write(self, text):
        written = self.stream.write(text)
        if "listening on" in text and not self.sent:
            self.sent = True
            self.stream.flush()
            signal.raise_signal(signal.SIGTERM)
        return written

    def __getattr__(self, name):
        return getattr(self.stream, name)

sys.stderr = SignalAfterListening(sys.stderr)
"""


def test_a_sigterm_right_after_the_listening_line_is_a_clean_stop(tmp_path):
    """The signal arrives before uvicorn's loop runs: was "interrupted by SIGTERM; what was written so far
    is left as it is" and 143, where a server that says it listens stops cleanly on a signal."""
    env = _with_site(tmp_path, SIGNAL_AFTER_LISTENING)
    result = subprocess.run([str(Path(sys.executable).with_name("dmae-serve")), "--ckpt", "demo", "--port", "0",
                             "--device", "cpu", "--batch", "64"], capture_output=True, text=True, env=env,
                            timeout=HANG_GUARD)
    assert result.returncode == 0, result.stderr
    listening, stopped = result.stderr.splitlines()
    assert "listening on http://127.0.0.1:" in listening
    assert stopped == "dmae-serve: stopped by SIGTERM after answering 0 requests"
