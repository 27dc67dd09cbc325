"""End-to-end runs of ``dmae-train`` on a few demo digits: loss goes down, ``--resume``
continues exactly, a 2-process torchrun equals one process on the combined batch, and
bad input is a one-line error."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import one_line_error, run_command

from dmae_fast.model.checkpoints import load_classifier, read_checkpoint
from dmae_fast.train.command import main
from dmae_fast.train.pretrain import load_own_pretrain

# 32 digits, batch 16, no crop: 2 optimizer steps per epoch, about 0.1 s each.
TINY = ["--set", "data.limit=32", "--set", "optim.batch_size=16", "--set", "data.crop_scale=none",
        "--set", "optim.warmup_epochs=1", "--quiet"]


def losses(run: Path) -> list[float]:
    return [json.loads(line)["train_loss"] for line in (run / "log.jsonl").read_text().splitlines()]


def train(*args: str) -> None:
    assert main(list(args)) == 0


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A demo DMAE pre-trained for 6 epochs (12 steps)."""
    out = tmp_path_factory.mktemp("pretrain") / "run"
    train("pretrain", "--preset", "demo-pretrain", "--set", "optim.epochs=6", *TINY, "--out", str(out))
    return out


def state_of(path: Path) -> dict[str, torch.Tensor]:
    return read_checkpoint(path).state


# --------------------------------------------------------------------------- each subcommand learns


def test_pretrain_reduces_the_loss_and_writes_a_loadable_checkpoint(pretrained):
    curve = losses(pretrained)
    assert len(curve) == 6 and curve[-1] < 0.7 * curve[0]
    assert json.loads((pretrained / "config.json").read_text())["subcommand"] == "pretrain"
    model = load_own_pretrain(pretrained / "pretrain.pth")
    assert model.encoder_config.patch_size == 2 and not model.norm_pix_loss


def test_finetune_with_consistency_reduces_the_loss(pretrained, tmp_path):
    out = tmp_path / "ft"
    train("finetune", "--preset", "demo-finetune", "--init", str(pretrained / "pretrain.pth"),
          "--set", "optim.epochs=6", "--set", "optim.blr=2e-2", "--set", "data.holdout=0.2", *TINY,
          "--out", str(out))
    curve = losses(out)
    assert curve[-1] < curve[0] - 0.05
    model = load_classifier(out / "classifier.safetensors")
    assert model.spec.sigma == 0.25 and model.spec.input_size == 8 and model.spec.encoder.patch_size == 2
    selected = model.spec.provenance["selected"]
    assert selected["metric"] == "noisy_vote_acc" and 0 <= selected["epoch"] < 6
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert {"holdout_clean_acc", "holdout_noisy_vote_acc", "train_kl", "train_entropy"} <= set(log[-1])
    # The encoder started from the pre-trained weights and was trained (the selected epoch may be
    # the first, whose warm-up learning rate is 0: compare the last one).
    last = state_of(out / "classifier-last.safetensors")["blocks.0.mlp.fc1.weight"]
    start = state_of(pretrained / "pretrain.pth")["blocks.0.mlp.fc1.weight"]
    assert 0 < float((last - start).abs().max()) < 0.05


def test_finetune_with_mixup_and_a_sigma_range_runs(pretrained, tmp_path):
    out = tmp_path / "mix"
    train("finetune", "--preset", "demo-finetune", "--init", str(pretrained / "pretrain.pth"),
          "--set", "optim.epochs=1", "--set", "mixup=0.8", "--set", "cutmix=1.0",
          "--set", "sigma_range=0,0.75", "--set", "data.randaug=rand-m9-mstd0.5-inc1", *TINY, "--out", str(out))
    assert load_classifier(out / "classifier.safetensors").spec.sigma is None  # a range: no single sigma


def test_linprobe_trains_only_the_head_and_reduces_the_loss(pretrained, tmp_path):
    out = tmp_path / "lp"
    train("linprobe", "--preset", "demo-linprobe", "--init", str(pretrained / "pretrain.pth"),
          "--set", "optim.epochs=8", "--set", "optim.blr=0.2", "--set", "data.holdout=0", *TINY,
          "--out", str(out))
    curve = losses(out)
    assert curve[-1] < curve[0] - 0.05
    model = load_classifier(out / "classifier.safetensors")
    assert model.spec.head == "bn_linear"
    encoder = state_of(pretrained / "pretrain.pth")
    for key in ("blocks.3.mlp.fc2.weight", "patch_embed.proj.weight", "cls_token"):
        assert torch.equal(model.state_dict()[key], encoder[key])


def test_visualize_writes_the_figure_and_never_overwrites(pretrained, tmp_path, capsys):
    figure = tmp_path / "figure.png"
    train("visualize", "--preset", "demo-visualize", "--init", str(pretrained / "pretrain.pth"),
          "--out", str(figure))
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["visualize", "--init", str(pretrained / "pretrain.pth"), "--out", str(figure)]) == 2
    assert "exists" in capsys.readouterr().err


# --------------------------------------------------------------------------- resume


@pytest.mark.parametrize("kind", ["pretrain", "finetune"])
def test_resume_reproduces_the_uninterrupted_run_exactly(pretrained, tmp_path, kind):
    extra = ["--set", "optim.epochs=3"]
    if kind == "finetune":  # drop path, mixup and label smoothing use the global RNGs
        extra += ["--init", str(pretrained / "pretrain.pth"), "--set", "mixup=0.8", "--set", "data.holdout=0.2"]
    args = [kind, "--preset", f"demo-{kind}", *extra, *TINY]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(*args, "--out", str(whole))
    train(*args, "--out", str(parts), "--stop-after-epochs", "1")
    result = "pretrain.pth" if kind == "pretrain" else "classifier-last.safetensors"
    assert not (parts / result).exists()
    train(kind, "--resume", "--out", str(parts), "--quiet")
    a, b = state_of(whole / result), state_of(parts / result)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert losses(whole) == losses(parts)
    if kind == "finetune":
        best_a = load_classifier(whole / "classifier.safetensors").spec.provenance["selected"]
        assert best_a == load_classifier(parts / "classifier.safetensors").spec.provenance["selected"]


def _step_gradients(accum_steps: int, batch: int = 16) -> dict[str, torch.Tensor]:
    """The summed .grad of one optimizer step of the demo pre-training, through the loop's own code."""
    from dmae_fast.train import config as cfg
    from dmae_fast.train.datasets import open_training_data
    from dmae_fast.train.distributed import Context
    from dmae_fast.train.loop import accumulate_gradients
    from dmae_fast.train.pretrain import PretrainTask
    from dmae_fast.train.randomness import seed_global_rngs

    config = cfg.resolve("pretrain", "demo-pretrain", ["data.limit=32", "data.crop_scale=none",
                                                       f"optim.batch_size={batch}", f"optim.accum_steps={accum_steps}"])
    data = open_training_data(config.data, config.seed)
    seed_global_rngs(config.seed)
    task = PretrainTask(config, data)
    micro = batch // accum_steps
    batches = iter(torch.utils.data.DataLoader(data.train, batch_size=micro))
    context = Context(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    losses = [loss for loss, _ in accumulate_gradients(task, task.model, batches, config.optim, context, scaler, 0)]
    assert len(losses) == accum_steps
    return {name: p.grad.clone() for name, p in task.model.named_parameters() if p.grad is not None}


def test_gradient_accumulation_gives_the_large_batch_gradient():
    """Exact property: one step's gradient. (Whole runs are not compared: AdamW's first steps
    move every weight by about lr * sign(gradient), so rounding-level differences in near-zero
    gradients become lr-sized weight differences that depend on the torch version and CPU.)"""
    large, accumulated, quarter = _step_gradients(1), _step_gradients(2), _step_gradients(4)
    assert set(large) == set(accumulated) == set(quarter) and len(large) > 10
    for name, g in large.items():
        scale = float(g.abs().max()) + 1e-12
        for other in (accumulated, quarter):
            assert float((other[name] - g).abs().max()) <= 1e-4 * scale, name
    # the comparison can fail: half a step's gradient is far from the large batch's
    half = _step_gradients(1, batch=8)
    assert any(float((half[n] - g).abs().max()) > 1e-2 * float(g.abs().max()) for n, g in large.items())


def test_dataloader_workers_do_not_change_the_run(tmp_path):
    args = ["pretrain", "--preset", "demo-pretrain", "--set", "optim.epochs=1", *TINY,
            "--set", "data.crop_scale=0.5,1"]
    train(*args, "--out", str(tmp_path / "inline"))
    train(*args, "--set", "data.num_workers=2", "--out", str(tmp_path / "workers"))
    a, b = state_of(tmp_path / "inline" / "pretrain.pth"), state_of(tmp_path / "workers" / "pretrain.pth")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_runs(tmp_path, precision):
    out = tmp_path / precision
    train("pretrain", "--preset", "demo-pretrain", "--set", "optim.epochs=2", "--set", f"optim.precision={precision}",
          "--set", "optim.clip_grad=1.0", *TINY, "--out", str(out))
    curve = losses(out)
    assert all(math.isfinite(v) for v in curve) and curve[-1] < curve[0]


# --------------------------------------------------------------------------- distributed


@pytest.mark.slow
def test_two_process_torchrun_equals_one_process_on_the_combined_batch(tmp_path):
    args = ["pretrain", "--preset", "demo-pretrain", "--set", "optim.epochs=1", *TINY]
    train(*args, "--out", str(tmp_path / "single"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "dmae_fast.train.command", *args, "--out", str(tmp_path / "ddp")],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    assert launched.returncode == 0, launched.stderr[-2000:]
    single, ddp = state_of(tmp_path / "single" / "pretrain.pth"), state_of(tmp_path / "ddp" / "pretrain.pth")
    assert single.keys() == ddp.keys()
    # The key slice of each qkv bias has a zero gradient in exact arithmetic (softmax ignores a shift
    # shared by all keys): its gradient is rounding noise, which Adam scales up to steps of ~lr. It may
    # differ by up to two such steps per optimizer step (lr = blr 1.5e-3 x 16 / 256, 2 steps);
    # everything else is equal up to float rounding (all-reduce sums in another order).
    step_bound = 2 * (1.5e-3 * 16 / 256) * 2
    for key in single:
        a, b = single[key], ddp[key]
        if key.endswith("attn.qkv.bias"):
            keys = (a - b).abs().reshape(3, -1)[1]
            assert float(keys.max()) <= step_bound, key
            a, b = a.reshape(3, -1)[[0, 2]], b.reshape(3, -1)[[0, 2]]
        assert torch.allclose(a, b, rtol=0, atol=2e-6), key
    assert losses(tmp_path / "single") == pytest.approx(losses(tmp_path / "ddp"), abs=1e-6)


# --------------------------------------------------------------------------- errors


def test_bad_input_is_a_one_line_error(tmp_path, capsys):
    def refused(args: list[str], *words: str) -> None:
        one_line_error(run_command(main, capsys, *args), "dmae-train", *words)

    refused(["pretrain", "--set", f"data.dataset={tmp_path / 'nope'}", "--out", str(tmp_path / "r")],
            str(tmp_path / "nope"))
    refused(["pretrain", "--preset", "demo-pretrain"], "--out")
    refused(["finetune", "--preset", "demo-finetune", "--init", str(tmp_path / "missing.pth"),
             "--out", str(tmp_path / "f")], "missing.pth")
    refused(["pretrain", "--resume", "--out", str(tmp_path / "empty")], "nothing to resume")
    refused(["pretrain", "--preset", "demo-pretrain", "--set", "optim.batch_size=4096", "--out",
             str(tmp_path / "big")], "fewer than one batch")
    run = tmp_path / "run"
    train("pretrain", "--preset", "demo-pretrain", "--set", "optim.epochs=1", *TINY, "--out", str(run))
    capsys.readouterr()
    refused(["pretrain", "--preset", "demo-pretrain", "--out", str(run)], "already holds a run")
    refused(["pretrain", "--resume", "--set", "sigma=0", "--out", str(run)], "--resume")
    refused(["finetune", "--resume", "--out", str(run)], "'pretrain' run")
    refused(["pretrain", "--preset", "dmae-vitb-finetune-cr-sigma0.25", "--out", str(tmp_path / "x")],
            "finetune")


def test_presets_command_and_show_config(capsys):
    assert main(["presets"]) == 0
    listed = capsys.readouterr().out
    assert "pretrain   dmae-vitb-pretrain" in listed and "finetune   dmae-vitl-finetune-cr-sigma1.0" in listed
    assert main(["finetune", "--preset", "dmae-vitb-finetune-cr-sigma1.0", "--set", "optim.epochs=7",
                 "--show-config"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["optim"]["epochs"] == 7 and shown["consistency"]["eta"] == 0.1
