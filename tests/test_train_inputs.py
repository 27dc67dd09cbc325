"""Bad input to ``dmae-train``: every case one line ``dmae-train: error: ...`` and exit 2."""

from __future__ import annotations

import dataclasses
import json
import math
import pickle
import re
import shutil
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from dmae_fast.base.errors import UserError
from dmae_fast.train import config as cfg
from dmae_fast.train.command import main

TINY = ["--set", "data.limit=32", "--set", "optim.batch_size=16", "--set", "data.crop_scale=none",
        "--set", "optim.warmup_epochs=1", "--set", "optim.epochs=1", "--quiet"]


PRETRAIN = ["pretrain", "--preset", "demo-pretrain", *TINY]
FINETUNE = ["finetune", "--preset", "demo-finetune", *TINY]
NOTES = ("dmae-train: note:", "dmae-train: tensorboard is not installed")  # a run that had started


def refused(capsys, args: list[str], *mentions: str, after_an_epoch: bool = False) -> str:
    """Exit status 2 and one line ``dmae-train: error: ...`` naming ``mentions`` (an error
    that can only show while training may follow the notes of a run that has started)."""
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not (after_an_epoch and line.startswith(NOTES))]
    assert len(lines) == 1 and lines[0].startswith("dmae-train: error:") and "Traceback" not in err, err
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A demo pre-training of 3 epochs stopped after 2 (config.json, checkpoint.pt)."""
    out = tmp_path_factory.mktemp("cfg") / "run"
    assert main([*PRETRAIN, "--set", "optim.epochs=3", "--stop-after-epochs", "2", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A finished demo pre-training's pretrain.pth (1 epoch)."""
    out = tmp_path_factory.mktemp("pretrained") / "run"
    assert main([*PRETRAIN, "--out", str(out)]) == 0
    return out / "pretrain.pth"


@pytest.fixture(scope="module")
def saved_config(stopped_run) -> dict:
    return json.loads((stopped_run / "config.json").read_text())


@pytest.fixture
def copied_run(stopped_run, tmp_path) -> Path:
    """A copy of ``stopped_run`` to tamper with."""
    return Path(shutil.copytree(stopped_run, tmp_path / "copy"))


DELETE = object()


def _with(config: dict, path: str, value) -> dict:
    """A copy of ``config`` with the dotted field ``path`` set to ``value`` (or deleted)."""
    config = json.loads(json.dumps(config))
    *parents, last = path.split(".")
    holder = config
    for name in parents:
        holder = holder[name]
    if value is DELETE:
        del holder[last]
    else:
        holder[last] = value
    return config


def _run_dir(tmp_path: Path, config: dict) -> Path:
    """A run directory holding only ``config`` as its config.json."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config))
    return out


CORRUPT = [
    ("{not json", ["not valid JSON"]),  # was: JSONDecodeError traceback
    ("[1, 2]", ["not a dmae-train configuration"]),
    ('{"subcommand": "sing"}', ["not a dmae-train configuration"]),
    ("\udcff", ["not valid JSON"]),
    ('{"subcommand": []}', ["not a dmae-train configuration"]),  # was: TypeError (unhashable)
    ("[" * 100_000 + "]" * 100_000, ["not valid JSON"]),  # was: RecursionError
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
    ("optim.epochs", 10**30, ["optim.epochs", "64 bits"]),  # was: accepted
    ("optim.epochs", 3.0, ["optim.epochs"]),
    ("optim.clip_grad", 0, ["optim.clip_grad", "> 0"]),  # was: accepted
    ("optim.betas", [0.9, 1.0], ["optim.betas", "[0, 1)"]),  # was: accepted
    ("sigma", float("nan"), ["sigma", "finite"]),
    ("data.dataset", "", ["data.dataset", "empty"]),  # was: the current directory as an image folder
])
def test_resume_with_a_config_json_of_bad_fields(tmp_path, capsys, saved_config, path, value, mentions):
    out = _run_dir(tmp_path, _with(saved_config, path, value))
    refused(capsys, ["pretrain", "--resume", "--out", str(out)], str(out / "config.json"), *mentions)


@pytest.mark.parametrize(("preset", "path"), [
    ("demo-pretrain", "optim.epochs"), ("demo-pretrain", "data"), ("demo-finetune", "consistency")])
def test_resume_with_a_config_json_missing_a_field(tmp_path, capsys, preset, path):
    """Was: the default filled in silently (the run continued with another configuration)."""
    out = _run_dir(tmp_path, _with(cfg.to_json(cfg.PRESETS[preset]), path, DELETE))
    refused(capsys, [cfg.preset_kind(preset), "--resume", "--out", str(out)], "missing field(s)", path)


def test_resume_with_a_config_json_that_is_a_directory(tmp_path, capsys):
    (tmp_path / "run" / "config.json").mkdir(parents=True)
    refused(capsys, ["pretrain", "--resume", "--out", str(tmp_path / "run")], "is not a file")


def test_resume_of_another_subcommands_run(tmp_path, capsys, saved_config):
    out = _run_dir(tmp_path, saved_config)
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


# --------------------------------------------------------------------------- numbers and their ranges


OUT_OF_RANGE = [  # (preset, --set, words of the message); each was accepted, or crashed, before
    ("demo-pretrain", "optim.betas=0.9,1.5", "optim.betas must be in [0, 1)"),  # was: AdamW's ValueError
    ("demo-pretrain", "optim.betas=[0.9,true]", "optim.betas"),  # was: true read as 1.0
    ("demo-pretrain", "optim.clip_grad=0", "optim.clip_grad must be > 0"),
    ("demo-pretrain", "optim.clip_grad=-1", "optim.clip_grad must be > 0"),
    ("demo-pretrain", "optim.weight_decay=-0.1", "optim.weight_decay must be >= 0"),
    ("demo-pretrain", "optim.min_lr=-1e-6", "optim.min_lr must be >= 0"),
    ("demo-pretrain", "optim.min_lr=1", "must not exceed the peak learning rate"),
    ("demo-pretrain", "optim.lr=0", "optim.lr must be > 0"),
    ("demo-pretrain", "decoder_heads=0", "decoder_heads must be >= 1"),  # was: ZeroDivisionError
    ("demo-pretrain", "decoder_dim=0", "decoder_dim must be >= 1"),
    ("demo-pretrain", "decoder_depth=0", "decoder_depth must be >= 1"),
    ("demo-pretrain", "data.input_size=0", "data.input_size must be >= 1"),  # was: 0 taken as unset
    ("demo-pretrain", "data.num_workers=-1", "data.num_workers must be >= 0"),  # was: DataLoader's ValueError
    ("demo-pretrain", "seed=-1", "seed must be >= 0"),  # was: the noise generator's ValueError
    ("demo-pretrain", f"seed={2**64}", "seed = 18446744073709551616 does not fit in 64 bits"),
    ("demo-pretrain", f"optim.epochs={10**30}", "optim.epochs"),
    ("demo-pretrain", f"optim.batch_size={'9' * 5000}", "optim.batch_size"),  # beyond int()'s digit limit
    ("demo-pretrain", "mask_ratio=0.99", "hides all 16 patches"),  # was: an encoder that sees nothing
    ("demo-pretrain", "data.dataset=", "data.dataset must not be empty"),  # was: the current directory
    ("demo-pretrain", "sigma=101", "sigma must be in [0, 100]"),
    ("demo-finetune", "eval_noise_samples=0", "eval_noise_samples must be >= 1"),  # was: a vote of nothing
    ("demo-finetune", "mixup=-1", "mixup must be >= 0"),
    ("demo-finetune", "cutmix=-0.5", "cutmix must be >= 0"),
    ("demo-finetune", "consistency.lam=-1", "consistency.lam must be >= 0"),
    ("demo-finetune", "consistency.eta=-1", "consistency.eta must be >= 0"),
    ("demo-finetune", "head_init_std=-1", "head_init_std must be >= 0"),
    ("demo-finetune", "sigma=0", "the classifier's noise level"),  # was: ClassifierSpec's ValueError
    ("demo-finetune", "sigma_range=0,1000", "sigma_range must be in [0, 100]"),
    ("demo-linprobe", "eval_noise_samples=0", "eval_noise_samples must be >= 1"),
    ("demo-linprobe", "sigma=0", "the classifier's noise level"),
    ("demo-visualize", "num_heads=0", "num_heads must be >= 1"),
    ("demo-visualize", "input_size=0", "input_size must be >= 1"),
    ("demo-visualize", "seed=-1", "seed must be >= 0"),
    ("demo-visualize", "split=", "split must not be empty"),
]


@pytest.mark.parametrize(("preset", "setting", "words"), OUT_OF_RANGE)
def test_numbers_out_of_their_range_are_refused(capsys, preset, setting, words):
    refused(capsys, [cfg.preset_kind(preset), "--preset", preset, "--set", setting, "--show-config"], words)


#: The optional numbers, set, so that every numeric field of a configuration is present.
SET_OPTIONALS = {"optim.lr": 1e-3, "optim.clip_grad": 1.0, "data.limit": 100, "data.input_size": 224,
                 "sigma_range": [0.0, 0.5], "input_size": 8, "num_heads": 4}


def _numeric_fields(config: dict, prefix: str = "") -> list[tuple[str, object]]:
    found = []
    for name, value in config.items():
        if isinstance(value, dict):
            found += _numeric_fields(value, f"{prefix}{name}.")
        elif isinstance(value, (int, float, list)) and not isinstance(value, bool):
            found.append((prefix + name, value))
    return found


def _holds_ints(kind: str, path: str) -> bool:
    """Whether the dotted field ``path`` of a ``kind`` configuration is typed int."""
    cls = cfg.CONFIGS[kind]
    for name in path.split("."):
        hint = typing.get_type_hints(cls)[name]
        options = typing.get_args(hint) or (hint,)
        cls = next((t for t in options if dataclasses.is_dataclass(t)), None)
    return int in options


@pytest.mark.parametrize("kind", sorted(cfg.CONFIGS))
def test_every_number_of_a_config_json_is_checked(kind):
    """One rule over the whole tree: floats finite, ints 64-bit ints (not floats, not bools)."""
    config = cfg.to_json(cfg.CONFIGS[kind]())
    for path, value in SET_OPTIONALS.items():
        if path.split(".")[0] in config:
            config = _with(config, path, value)
    cfg.from_json(config)  # valid as it is
    fields = _numeric_fields(config)
    assert len(fields) >= 6
    for path, value in fields:
        bad = [2**63, float(value), True] if _holds_ints(kind, path) else [math.inf, -math.inf, math.nan, True, "0.5"]
        for item in bad:
            item = [item, *value[1:]] if isinstance(value, list) else item
            with pytest.raises(UserError, match=re.escape(path)) as error:
                cfg.from_json(_with(config, path, item), "config.json")
            assert str(error.value).startswith("config.json: ")


# --------------------------------------------------------------------------- paths on the command line


@pytest.mark.parametrize(("args", "mentions"), [
    ([*PRETRAIN, "--out", ""], ["--out", "empty path"]),  # was: a run in the current directory
    ([*FINETUNE, "--init", "", "--out", "run"], ["--init", "empty path"]),  # was: ignored (random weights)
    (["pretrain", "--resume", "--init", "", "--out", "run"], ["--resume"]),
    (["visualize", "--init", "x.pth", "--out", ""], ["--out", "empty path"]),
    ([*PRETRAIN, "--stop-after-epochs", "-3", "--out", "run"], ["--stop-after-epochs"]),
])
def test_empty_paths_and_negative_epochs(tmp_path, capsys, monkeypatch, args, mentions):
    monkeypatch.chdir(tmp_path)
    refused(capsys, args, *mentions)
    assert not list(tmp_path.iterdir())


def test_out_below_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("mine\n")
    refused(capsys, [*PRETRAIN, "--out", str(tmp_path / "file" / "run")],
            f"{tmp_path / 'file'} exists and is not a directory")
    assert (tmp_path / "file").read_text() == "mine\n"


def _pretrain_file(path: Path, width: int, depth: int) -> Path:
    """A DMAE pre-training file of the demo's image and patch size but another encoder."""
    from dmae_fast.model.config import DecoderConfig, EncoderConfig
    from dmae_fast.model.dmae import DMAEPretrain

    model = DMAEPretrain(EncoderConfig(width, depth, 4, patch_size=2, img_size=8), DecoderConfig(64, 2, 4))
    torch.save({"model": model.state_dict()}, path)
    return path


@pytest.mark.parametrize(("kind", "width", "depth", "words"), [
    ("pretrain", 32, 4, "does not fit"),
    ("finetune", 32, 4, "wrong or unknown: cls_token"),
    ("finetune", 64, 2, "missing: blocks.2."),  # was: blocks 2 and 3 left random, silently
    ("linprobe", 64, 2, "missing: blocks.2."),
])
def test_init_of_another_encoder(tmp_path, capsys, kind, width, depth, words):
    init = _pretrain_file(tmp_path / "other.pth", width, depth)
    refused(capsys, [kind, "--preset", f"demo-{kind}", *TINY, "--init", str(init), "--out", str(tmp_path / "run")],
            str(init), words)
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- --resume


@pytest.mark.parametrize(("kind", "words"), [
    ("foreign", "is not a dmae-train training state (no model, optimizer"),  # was: KeyError
    ("tensor", "is not a dmae-train training state"),  # was: IndexError
    ("weights", "does not fit the model of this run"),  # was: load_state_dict's RuntimeError
    ("configuration", "another configuration than"),  # was: resumed with the other run's state
    ("epoch", "holds epoch 99"),  # was: accepted
    ("truncated", "cannot read"),
    ("directory", "is not a file"),  # was: trained an epoch, then failed to save
])
def test_resume_with_a_bad_checkpoint(copied_run, capsys, kind, words):
    path = copied_run / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    if kind == "directory":
        path.unlink()
        path.mkdir()
    elif kind == "truncated":
        path.write_bytes(path.read_bytes()[:5000])
    else:
        torch.save({
            "foreign": {"weights": torch.zeros(1)},
            "tensor": torch.zeros(3),
            "weights": {**state, "model": {"x": torch.zeros(1)}},
            "configuration": {**state, "config": _with(state["config"], "sigma", 0.5)},
            "epoch": {**state, "epoch": 99},
        }[kind], path)
    status = (copied_run / "status.json").read_text()
    refused(capsys, ["pretrain", "--resume", "--out", str(copied_run), "--quiet"], str(path), words)
    assert (copied_run / "status.json").read_text() == status  # nothing was written


def test_resume_stopping_before_the_epochs_already_done(copied_run, capsys):
    """Was: accepted, and status.json said 1 epoch done where 2 were."""
    refused(capsys, ["pretrain", "--resume", "--stop-after-epochs", "1", "--out", str(copied_run)],
            "--stop-after-epochs 1", "already done 2 epochs")
    assert json.loads((copied_run / "status.json").read_text()) == {"status": "stopped", "epochs_done": 2}


# --------------------------------------------------------------------------- training data


def _cifar(root: Path, pixels: np.ndarray) -> Path:
    """A CIFAR-10 python-batches directory whose 5 training batches each hold ``pixels``."""
    root.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": pixels, "labels": [i % 10 for i in range(len(pixels))]}
        (root / name).write_bytes(pickle.dumps(batch))
    return root


def _image_folder(root: Path, corrupt: bool) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(root / label / f"{i}.png")
    if corrupt:
        (root / "a" / "9.png").write_text("not a picture\n")
    return root


@pytest.mark.parametrize("case", ["limit", "holdout", "batch", "missing", "no images", "randaug", "constant"])
def test_bad_training_data_is_refused_before_the_run_directory_is_made(tmp_path, capsys, case):
    setting, words = {
        "limit": ("data.limit=5000", "data.limit=5000: demo has only 1297 training images"),  # was: accepted
        "holdout": ("data.holdout=0.99", "no training images left"),
        "batch": ("optim.batch_size=64", "fewer than one batch"),  # was: config.json written, run stuck
        "missing": (f"data.dataset={tmp_path / 'none'}", "not 'demo' or an existing directory"),
        "no images": (f"data.dataset={tmp_path / 'empty'}", "not a CIFAR-10 directory nor an image folder"),
        "randaug": ("data.randaug=rand-x9", "data.randaug 'rand-x9' is not a timm RandAugment spec"),
        "constant": (f"data.dataset={tmp_path / 'cifar'}", "do not vary"),  # was: ClassifierSpec's ValueError
    }[case]
    (tmp_path / "empty" / "class").mkdir(parents=True)
    _cifar(tmp_path / "cifar", np.full((8, 3072), 7, dtype=np.uint8))
    refused(capsys, [*FINETUNE, "--set", setting, "--out", str(tmp_path / "run")], words)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("workers", [0, 2])
def test_an_unreadable_training_image(tmp_path, capsys, workers):
    """Was: PIL's error, with a DataLoader worker's whole traceback inside it."""
    folder = _image_folder(tmp_path / "images", corrupt=True)
    refused(capsys, ["finetune", "--preset", "demo-finetune", "--set", f"data.dataset={folder}",
                     "--set", "data.input_size=8", "--set", "data.normalization=imagenet", "--set", "data.holdout=0",
                     "--set", "optim.batch_size=9", "--set", "optim.epochs=1", "--set", "optim.warmup_epochs=0",
                     "--set", f"data.num_workers={workers}", "--quiet", "--out", str(tmp_path / "run")],
            f"training image {folder / 'a' / '9.png'} cannot be read", after_an_epoch=True)


def test_input_size_other_than_the_images_without_crop(tmp_path):
    """Was: demo digits (8x8) stayed 8x8 for a 16x16 classifier without data.crop_scale."""
    from dmae_fast.model.checkpoints import load_classifier

    assert main([*FINETUNE, "--set", "data.input_size=16", "--out", str(tmp_path / "run")]) == 0
    assert load_classifier(tmp_path / "run" / "classifier.safetensors").spec.input_size == 16


# --------------------------------------------------------------------------- visualize


@pytest.mark.parametrize(("out", "words"), [
    ("missing/figure.png", "is not an existing directory"),  # was: matplotlib's FileNotFoundError
    ("figure.xyz", "unknown figure format '.xyz'"),  # was: matplotlib's ValueError
    ("taken.png", "exists; choose another --out"),
])
def test_visualize_out(tmp_path, capsys, pretrained, out, words):
    (tmp_path / "taken.png").write_bytes(b"mine")
    refused(capsys, ["visualize", "--init", str(pretrained), "--out", str(tmp_path / out)], words)
    assert (tmp_path / "taken.png").read_bytes() == b"mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.png"]


@pytest.mark.parametrize(("change", "words"), [
    ({"mean": DELETE}, "mean and std must be lists of 3 finite numbers"),  # was: KeyError
    ({"std": [0.0, 0.1, 0.1]}, "mean and std"),
    ({"sigma": "x"}, "sigma"),
    ({"seed": DELETE}, "missing field(s) seed"),  # was: the default filled in silently
])
def test_visualize_of_a_pretrain_file_with_a_bad_configuration(tmp_path, capsys, pretrained, change, words):
    saved = torch.load(pretrained, weights_only=True)
    args = saved["args"]
    for name, value in change.items():
        args = _with(args, name, value)
    torch.save({**saved, "args": args}, tmp_path / "bad.pth")
    refused(capsys, ["visualize", "--init", str(tmp_path / "bad.pth"), "--out", str(tmp_path / "f.png")],
            f"the configuration inside {tmp_path / 'bad.pth'}", words)


def test_visualize_with_every_patch_hidden(tmp_path, capsys, pretrained):
    refused(capsys, ["visualize", "--init", str(pretrained), "--set", "mask_ratio=0.95", "--out",
                     str(tmp_path / "f.png")], "hides all 16 patches")


def test_init_demo_names_the_shipped_classifier_as_dmae_certify_does(tmp_path):
    from dmae_fast.demo import DEMO_CHECKPOINT
    from dmae_fast.train.command import _resolve, build_parser

    args = build_parser().parse_args(["finetune", "--preset", "demo-finetune", "--init", "demo",
                                      "--out", str(tmp_path / "run")])
    assert _resolve(args).init == str(DEMO_CHECKPOINT)  # was: "checkpoint demo does not exist"
