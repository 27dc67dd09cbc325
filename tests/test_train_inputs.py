"""Bad input to ``dmae-train``: every case one line ``dmae-train: error: ...`` and exit 2."""

from __future__ import annotations

import json

import pytest

from dmae_fast.cli.train import main

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ["--set", "data.limit=32", "--set", "optim.batch_size=16", "--set", "data.crop_scale=none",
        "--set", "optim.warmup_epochs=1", "--set", "optim.epochs=1", "--quiet"]


def refused(capsys, args: list[str], *mentions: str) -> str:
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dmae-train: error:") and "Traceback" not in err, err
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def saved_config(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("cfg") / "run"
    assert main(["pretrain", "--preset", "demo-pretrain", *TINY, "--out", str(out)]) == 0
    return json.loads((out / "config.json").read_text())


def _with(config: dict, path: str, value) -> dict:
    config = json.loads(json.dumps(config))
    *parents, last = path.split(".")
    holder = config
    for name in parents:
        holder = holder[name]
    holder[last] = value
    return config


CORRUPT = [
    ("{not json", ["not valid JSON"]),  # was: JSONDecodeError traceback
    ("[1, 2]", ["not a dmae-train configuration"]),
    ('{"subcommand": "sing"}', ["not a dmae-train configuration"]),
    ("\udcff", ["not valid JSON"]),
]


@pytest.mark.parametrize(("text", "mentions"), CORRUPT)
def test_resume_with_a_corrupt_config_json(tmp_path, capsys, text, mentions):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    refused(capsys, ["pretrain", "--resume", "--out", str(out)], *mentions)


@pytest.mark.parametrize(("path", "value", "mentions"), [
    ("optim.epochs", "ten", ["optim.epochs", "'ten'"]),  # was: TypeError traceback
    ("optim.betas", [0.9], ["optim.betas"]),
    ("optim", 3, ["optim"]),
    ("no_such_field", 1, ["unknown field(s) no_such_field"]),
    ("optim.momentum", 0.9, ["unknown field(s) optim.momentum"]),
    ("sigma", "0.25", ["sigma"]),
    ("optim.epochs", True, ["optim.epochs"]),
    ("optim.blr", None, ["optim.blr"]),
    ("optim.epochs", 0, ["optim.epochs"]),  # validated like a new run
    ("mask_ratio", 1.5, ["mask_ratio"]),
    ("encoder", "giant", ["unknown encoder"]),
])
def test_resume_with_a_config_json_of_bad_fields(tmp_path, capsys, saved_config, path, value, mentions):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(_with(saved_config, path, value)))
    refused(capsys, ["pretrain", "--resume", "--out", str(out)], *mentions)


def test_resume_of_another_subcommands_run(tmp_path, capsys, saved_config):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(saved_config))
    refused(capsys, ["finetune", "--resume", "--out", str(out)], "'pretrain' run, not 'finetune'")


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
@pytest.mark.parametrize("field", ["sigma", "optim.blr", "optim.weight_decay", "optim.warmup_epochs",
                                   "optim.clip_grad", "mask_ratio"])
def test_non_finite_numbers_are_refused(capsys, field, value):
    """Was: inf passed `sigma >= 0` and similar range checks."""
    refused(capsys, ["pretrain", "--preset", "demo-pretrain", "--set", f"{field}={value}", "--show-config"], field)


@pytest.mark.parametrize(("args", "mentions"), [
    (["pretrain", "--resume"], ["--out"]),
    (["pretrain", "--set", "optim=3"], ["optim"]),
    (["pretrain", "--set", "data.crop_scale=0.5"], ["data.crop_scale"]),
    (["pretrain", "--set", "optim.betas=[0.9]"], ["optim.betas"]),
    (["pretrain", "--set", "nonsense=1"], ["nonsense"]),
    (["pretrain", "--set", "sigma"], ["field=value"]),
    (["pretrain", "--preset", "no-such-preset"], ["no-such-preset"]),
    (["pretrain", "--preset", "demo-finetune"], ["demo-finetune"]),
    (["pretrain", "--set", "optim.epochs=-1", "--out", "x"], ["optim.epochs"]),
])
def test_bad_command_lines(capsys, args, mentions):
    refused(capsys, args, *mentions)


def test_out_that_is_a_file_and_stop_after_zero(tmp_path, capsys):
    (tmp_path / "file").write_text("mine\n")
    refused(capsys, ["pretrain", "--preset", "demo-pretrain", *TINY, "--out", str(tmp_path / "file")],
            "not a directory")
    assert (tmp_path / "file").read_text() == "mine\n"
    refused(capsys, ["pretrain", "--preset", "demo-pretrain", *TINY, "--stop-after-epochs", "0",
                     "--out", str(tmp_path / "run")], "--stop-after-epochs")


@pytest.mark.parametrize("kind", ["missing", "directory", "text", "classifier"])
def test_bad_init_checkpoints(tmp_path, capsys, kind):
    from dmae_fast.demo import DEMO_CHECKPOINT

    init = {"missing": tmp_path / "none.pth", "directory": tmp_path, "text": tmp_path / "notes.pth",
            "classifier": DEMO_CHECKPOINT}[kind]
    if kind == "text":
        init.write_text("notes\n")
    refused(capsys, ["pretrain", "--preset", "demo-pretrain", *TINY, "--init", str(init),
                     "--out", str(tmp_path / "run")])


def test_missing_dataset(tmp_path, capsys):
    refused(capsys, ["pretrain", "--preset", "demo-pretrain", *TINY, "--set", f"data.dataset={tmp_path / 'none'}",
                     "--out", str(tmp_path / "run")], "none")
