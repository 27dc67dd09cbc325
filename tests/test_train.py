"""Unit tests of the training suite: losses, presets, configuration, randomness, data."""

from __future__ import annotations

import math

import pytest
import torch

from dmae_fast.base.errors import UserError
from dmae_fast.model.config import ENCODER_PRESETS, DecoderConfig, EncoderConfig
from dmae_fast.model.dmae import DMAEPretrain
from dmae_fast.train import config as cfg
from dmae_fast.train.datasets import open_training_data
from dmae_fast.train.losses import consistency_loss
from dmae_fast.train.optim import LARS, learning_rate, param_groups
from dmae_fast.train.pretrain import PretrainTask
from dmae_fast.train.randomness import Stream, gaussians, sample_seed, uniforms

# --------------------------------------------------------------------------- pre-training loss


def test_pretrain_loss_is_over_all_patches_against_the_clean_image():
    torch.manual_seed(0)
    model = DMAEPretrain(EncoderConfig(32, 1, 2, patch_size=4, img_size=16), DecoderConfig(32, 1, 2),
                         mean=(0.5,) * 3, std=(0.25,) * 3)
    clean = torch.rand(4, 3, 16, 16)
    noise, scores = torch.randn_like(clean), torch.rand(4, 16)
    sigma = 0.5
    out = model(clean, sigma, 0.75, noise=noise, scores=scores)
    per_patch = ((out.pred - model.patchify(model.normalize(clean))) ** 2).mean(-1)  # [B, L], official target
    masked_only = (per_patch * out.mask).sum() / out.mask.sum()  # MAE's loss
    noisy_target = ((out.pred - model.patchify(model.normalize(clean + sigma * noise))) ** 2).mean()
    assert out.mask.sum().item() == 4 * 12  # 75% of the 16 patches hidden
    assert torch.allclose(out.loss, per_patch.mean(), rtol=1e-6)
    assert abs(out.loss - masked_only) > 1e-3 and abs(out.loss - noisy_target) > 1e-3
    # The visible patches' predictions get gradient too (they are in the loss).
    pred = out.pred.detach().requires_grad_()
    model.reconstruction_loss(clean, pred).backward()
    visible = out.mask == 0
    assert (pred.grad[visible].abs().sum(-1) > 0).all()


def test_pretrain_task_uses_per_sample_noise_and_masks():
    config = cfg.resolve("pretrain", "demo-pretrain", ["data.limit=8"])
    data = open_training_data(config.data, config.seed)
    task = PretrainTask(config, data)
    images = torch.stack([data.train[i][0] for i in range(4)])
    index = torch.arange(4)
    loss, _ = task.loss(task.model, images, None, index, epoch=3)
    noise = gaussians(config.seed, Stream.PRETRAIN_NOISE, index, 3, (3, 8, 8))
    scores = uniforms(config.seed, Stream.MASK, index, 3, 16)
    assert torch.equal(loss, task.model(images, 0.25, 0.75, noise=noise, scores=scores).loss)
    # A sample's draw does not depend on its batch: sample 2 alone gets the same noise.
    alone = gaussians(config.seed, Stream.PRETRAIN_NOISE, index[2:3], 3, (3, 8, 8))
    assert torch.equal(alone[0], noise[2])
    assert not torch.equal(noise, gaussians(config.seed, Stream.PRETRAIN_NOISE, index, 4, (3, 8, 8)))


# --------------------------------------------------------------------------- consistency loss


def test_consistency_loss_matches_hand_computation():
    # Two noisy copies of one image, two classes: p1 = (1/2, 1/2), p2 = (3/4, 1/4).
    logits = torch.tensor([[[0.0, 0.0]], [[math.log(3.0), 0.0]]])
    parts = consistency_loss(logits, torch.tensor([0]), lam=2.0, eta=0.5)
    ce = (-math.log(0.5) - math.log(0.75)) / 2
    mean = (0.625, 0.375)
    kl1 = 0.625 * math.log(0.625 / 0.5) + 0.375 * math.log(0.375 / 0.5)
    kl2 = 0.625 * math.log(0.625 / 0.75) + 0.375 * math.log(0.375 / 0.25)
    entropy = -sum(p * math.log(p) for p in mean)
    assert parts.cross_entropy.item() == pytest.approx(ce, rel=1e-6)
    assert parts.kl.item() == pytest.approx((kl1 + kl2) / 2, rel=1e-5)
    assert parts.entropy.item() == pytest.approx(entropy, rel=1e-6)
    assert parts.total.item() == pytest.approx(ce + 2.0 * (kl1 + kl2) / 2 + 0.5 * entropy, rel=1e-6)
    assert parts.total.item() == pytest.approx(0.890878, abs=1e-5)


def test_consistency_loss_with_soft_targets_and_identical_copies():
    logits = torch.randn(1, 5, 4).expand(3, 5, 4)
    soft = torch.softmax(torch.randn(5, 4), -1)
    parts = consistency_loss(logits, soft, lam=2.0, eta=0.0)
    expected = -(soft * torch.log_softmax(logits[0], -1)).sum(-1).mean()
    assert parts.kl.item() == pytest.approx(0.0, abs=1e-6)
    assert parts.total.item() == pytest.approx(expected.item(), rel=1e-6)


# --------------------------------------------------------------------------- presets


def test_presets_resolve_to_the_papers_numbers():
    p = cfg.PRESETS
    for name, epochs, encoder in (("dmae-vitb-pretrain", 1100, "base"), ("dmae-vitl-pretrain", 1600, "large")):
        c = p[name]
        assert (c.encoder, c.sigma, c.mask_ratio, c.norm_pix_loss) == (encoder, 0.25, 0.75, True)
        o = c.optim
        assert (o.epochs, o.warmup_epochs, o.batch_size, o.blr, o.betas, o.weight_decay) == (
            epochs, 40, 4096, 1.5e-4, (0.9, 0.95), 0.05)
        assert o.peak_lr == pytest.approx(1.5e-4 * 4096 / 256)
        assert c.data.crop_scale == (0.2, 1.0) and c.data.hflip
    assert ENCODER_PRESETS["base"].depth == 12 and ENCODER_PRESETS["large"].depth == 24
    for sigma, eta in ((0.25, 0.5), (0.5, 0.5), (1.0, 0.1)):
        b, large = p[f"dmae-vitb-finetune-cr-sigma{sigma}"], p[f"dmae-vitl-finetune-cr-sigma{sigma}"]
        assert (b.consistency.copies, b.consistency.lam, b.consistency.eta) == (2, 2.0, eta)
        assert (b.optim.blr, b.layer_decay, b.drop_path, b.optim.epochs) == (5e-4, 0.65, 0.1, 100)
        assert (large.optim.blr, large.layer_decay, large.drop_path, large.optim.epochs) == (1e-3, 0.75, 0.2, 50)
        for c in (b, large):
            assert c.sigma == sigma and c.optim.batch_size == 1024 and c.optim.warmup_epochs == 5
            assert c.optim.betas == (0.9, 0.999) and c.optim.weight_decay == 0.05
            assert (c.label_smoothing, c.mixup, c.cutmix) == (0.1, 0.8, 1.0)
            assert c.data.randaug == "rand-m9-mstd0.5-inc1"
        assert p[f"dmae-vitb-finetune-rs-sigma{sigma}"].consistency is None
    cont = p["cifar10-continue"]
    assert (cont.optim.epochs, cont.optim.blr, cont.optim.batch_size) == (50, 5e-5, 512)
    assert cont.data.input_size == 224 and cont.data.normalization == "cifar10"
    cifar = p["cifar10-finetune-cr-sigma0.25"]
    assert (cifar.optim.batch_size, cifar.optim.epochs, cifar.data.input_size) == (256, 50, 32)
    assert cifar.data.randaug is None and cifar.mixup == cifar.cutmix == 0 and cifar.data.hflip
    assert cifar.data.normalization == "cifar10"
    assert p["cifar10-finetune-cr-sigma0-0.75"].sigma_range == (0.0, 0.75)
    probe = p["dmae-vitb-linprobe"]
    assert (probe.optim.epochs, probe.optim.blr, probe.optim.weight_decay, probe.optim.batch_size) == (
        90, 0.1, 0.0, 16384)
    assert probe.optim.optimizer == "lars" and probe.data.randaug is None


def test_every_preset_validates_and_round_trips_through_json():
    for name, config in cfg.PRESETS.items():
        kind = cfg.preset_kind(name)
        assert cfg.resolve(kind, name, []) == config
        assert cfg.from_json(cfg.to_json(config)) == config


def test_overrides_are_typed_and_checked():
    c = cfg.resolve("finetune", "demo-finetune", [
        "optim.blr=1e-2", "consistency.lam=3", "sigma_range=0,0.5", "data.crop_scale=none",
        "data.hflip=true", "optim.precision=bf16", "optim.clip_grad=1.5"])
    assert c.optim.blr == 1e-2 and c.consistency.lam == 3.0 and c.sigma_range == (0.0, 0.5)
    assert c.data.crop_scale is None and c.data.hflip and c.optim.precision == "bf16" and c.optim.clip_grad == 1.5
    assert cfg.resolve("finetune", None, ["consistency=none"]).consistency is None
    for bad, words in ((["optim.blr=fast"], "optim.blr"), (["nonsense=1"], "unknown field"),
                       (["optim.precision=fp8"], "fp32"), (["mask_ratio=1"], "mask_ratio"),
                       (["data.holdout=1.5"], "holdout"), (["sigma"], "field=value")):
        with pytest.raises(UserError, match=words):
            cfg.resolve("pretrain" if "mask" in bad[0] else "finetune", None, bad)
    with pytest.raises(UserError, match="finetune"):
        cfg.resolve("pretrain", "demo-finetune", [])
    with pytest.raises(UserError, match="unknown preset"):
        cfg.resolve("pretrain", "no-such", [])


# --------------------------------------------------------------------------- optimizer, schedule


def test_schedule_warms_up_linearly_then_follows_a_cosine():
    o = cfg.OptimConfig(epochs=10, warmup_epochs=2, batch_size=512, blr=1e-3, min_lr=1e-5)
    assert o.peak_lr == pytest.approx(2e-3)
    assert learning_rate(1.0, o) == pytest.approx(1e-3)
    assert learning_rate(2.0, o) == pytest.approx(2e-3)
    assert learning_rate(6.0, o) == pytest.approx(1e-5 + (2e-3 - 1e-5) * 0.5)
    assert learning_rate(10.0, o) == pytest.approx(1e-5)


def test_no_weight_decay_on_norms_biases_and_tokens_and_layer_decay():
    model = DMAEPretrain(EncoderConfig(32, 2, 2, patch_size=4, img_size=16), DecoderConfig(32, 1, 2))
    names = {id(p): n for n, p in model.named_parameters()}
    for group in param_groups(model, 0.05):
        for p in group["params"]:
            name = names[id(p)]
            exempt = p.ndim == 1 or name.endswith(".bias") or name in ("cls_token", "mask_token")
            assert group["weight_decay"] == (0.0 if exempt else 0.05), name
    from dmae_fast.model.classifier import SmoothingClassifier
    from dmae_fast.model.config import ClassifierSpec

    vit = SmoothingClassifier(ClassifierSpec(EncoderConfig(32, 3, 2, patch_size=4, img_size=16), 5, 16))
    names = {id(p): n for n, p in vit.named_parameters()}
    scales = {names[id(p)]: g["lr_scale"] for g in param_groups(vit, 0.05, 0.5) for p in g["params"]}
    assert scales["head.weight"] == 1.0 and scales["blocks.2.attn.qkv.weight"] == 0.5
    assert scales["blocks.0.attn.qkv.weight"] == 0.125 and scales["patch_embed.proj.weight"] == 0.0625


def test_lars_scales_updates_by_the_trust_ratio():
    weight = torch.nn.Parameter(torch.full((2, 2), 3.0))
    optimizer = LARS([weight], lr=1.0, momentum=0.0, trust=0.001)
    weight.grad = torch.full((2, 2), 0.5)
    optimizer.step()
    # ||w|| = 6, ||g|| = 1: the step is lr * trust * 6 / 1 * g = 0.003 per element.
    assert torch.allclose(weight, torch.full((2, 2), 3.0 - 0.003))


# --------------------------------------------------------------------------- data


def test_augmentation_is_a_function_of_sample_and_epoch():
    config = cfg.resolve("pretrain", "demo-pretrain", ["data.limit=20"])
    data = open_training_data(config.data, seed=0)
    first = data.train[5][0]
    torch.rand(100)  # the global RNG does not matter
    assert torch.equal(first, data.train[5][0])
    data.train.set_epoch(1)
    assert not torch.equal(first, data.train[5][0])
    assert sample_seed(0, 5, 1) != sample_seed(0, 5, 0) != sample_seed(1, 5, 0)
    assert first.min() >= 0 and first.max() <= 1 and first.shape == (3, 8, 8)


def test_holdout_is_taken_from_the_training_digits():
    config = cfg.resolve("finetune", "demo-finetune", [])
    data = open_training_data(config.data, seed=0)
    assert len(data.train) + len(data.holdout) == 1297
    assert len(data.holdout) == round(0.15 * 1297)
    assert not set(data.train.indices) & set(data.holdout.indices)
    assert data.input_size == 8 and data.num_classes == 10


def test_bad_dataset_paths_are_one_line_errors(tmp_path):
    with pytest.raises(UserError, match="not 'demo' or an existing directory"):
        open_training_data(cfg.DataConfig(dataset=str(tmp_path / "missing")), 0)
    with pytest.raises(UserError, match=str(tmp_path)):
        open_training_data(cfg.DataConfig(dataset=str(tmp_path)), 0)


def test_cifar10_batches_and_image_folders_train(tmp_path):
    import pickle

    import numpy as np
    from PIL import Image

    cifar = tmp_path / "cifar"
    cifar.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8), "labels": [0, 1, 2, 3]}
        (cifar / name).write_bytes(pickle.dumps(batch))
    data = open_training_data(cfg.DataConfig(dataset=str(cifar), crop_scale=(0.5, 1.0)), 0)
    assert len(data.train) == 20 and data.input_size == 32 and data.train[3][0].shape == (3, 32, 32)
    folder = tmp_path / "folder"
    for label in ("cat", "dog"):
        (folder / label).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)).save(folder / label / f"{i}.png")
    data = open_training_data(cfg.DataConfig(dataset=str(folder), input_size=16, randaug="rand-m9-mstd0.5-inc1"), 0)
    image, label, index = data.train[2]
    assert image.shape == (3, 16, 16) and label == 1 and index == 2 and data.class_names == ("cat", "dog")


def test_the_shipped_demo_model_is_a_cr_finetuned_dmae():
    from dmae_fast.data import demo_digits
    from dmae_fast.demo import DEMO_CHECKPOINT
    from dmae_fast.model.checkpoints import load_classifier

    assert DEMO_CHECKPOINT.stat().st_size < 2_000_000
    model = load_classifier(DEMO_CHECKPOINT)
    spec, config = model.spec, model.spec.provenance["config"]
    assert (spec.sigma, spec.input_size, spec.encoder) == (0.25, 8, ENCODER_PRESETS["demo"])
    assert config["subcommand"] == "finetune" and config["consistency"] == {"copies": 2, "lam": 2.0, "eta": 0.5}
    assert config["init"].endswith("pretrain.pth") and config["data"]["holdout"] > 0
    test = demo_digits("test")
    with torch.no_grad():
        accuracy = (model(test.images).argmax(1) == test.labels).float().mean().item()
    assert accuracy >= 0.95
