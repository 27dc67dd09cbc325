"""Tests for dmae_fast.model.checkpoints against reference models built independently with timm.

Every layout users bring (official DMAE/MAE release files, training checkpoints, DDP
prefixes, plain timm models, linear probes, the project's own safetensors format) is
written here from a ``timm.models.vision_transformer.VisionTransformer`` and must give the
same logits as that reference model fed ``(x - mean) / std``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from dmae_fast.base.errors import UserError
from dmae_fast.model.checkpoints import (
    encoder_state,
    load_classifier,
    load_pretrain,
    save_classifier,
)
from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.model.config import ClassifierSpec, EncoderConfig

# Deliberately not ImageNet's (the default for foreign files), so that passing them matters.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2471, 0.2435, 0.2616)
WIDTH, DEPTH, HEADS, PATCH, IMG, CLASSES = 32, 2, 2, 4, 16, 5
ATOL = 1e-5


def _normalize(x: torch.Tensor, mean=MEAN, std=STD) -> torch.Tensor:
    return (x - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)


def _perturb(model: nn.Module) -> None:
    """Move every parameter away from its (often 0 or 1) initialization."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)


def _timm_vit(
    pool: str = "avg",
    *,
    linear_probe: bool = False,
    img_size: int = IMG,
    width: int = WIDTH,
    depth: int = DEPTH,
    heads: int = HEADS,
    patch: int = PATCH,
    classes: int = CLASSES,
) -> VisionTransformer:
    """A reference classifier straight from timm, with random weights, in eval mode."""
    model = VisionTransformer(
        img_size=img_size,
        patch_size=patch,
        num_classes=classes,
        global_pool=pool,
        embed_dim=width,
        depth=depth,
        num_heads=heads,
    )
    if linear_probe:
        model.head = nn.Sequential(
            nn.BatchNorm1d(width, affine=False, eps=1e-6), nn.Linear(width, classes)
        )
    _perturb(model)
    if linear_probe:
        bn = model.head[0]
        bn.running_mean.normal_(0.0, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.num_batches_tracked.fill_(17)
    return model.eval()


def _optimizer_state(model: nn.Module) -> dict:
    """A real optimizer state dict (AdamW after one step, so it holds moment tensors)."""
    copy = [nn.Parameter(p.detach().clone()) for p in model.parameters()]
    optimizer = torch.optim.AdamW(copy, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.05)
    sum((p * p).sum() for p in copy).backward()
    optimizer.step()
    return optimizer.state_dict()


def _training_checkpoint(network: nn.Module, state: dict, **args) -> dict:
    """The dict that MAE/DMAE's misc.save_model writes."""
    return {
        "model": state,
        "optimizer": _optimizer_state(network),
        "epoch": 99,
        "scaler": {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                   "growth_interval": 2000, "_growth_tracker": 3},
        "args": argparse.Namespace(
            batch_size=64, epochs=100, lr=None, blr=1e-3, input_size=IMG, output_dir="./out",
            device="cuda", seed=0, dist_url="env://", **args,
        ),
    }


def _one_line_user_error(call, *mentions: str) -> str:
    with pytest.raises(UserError) as info:
        call()
    message = str(info.value)
    assert message and "\n" not in message, f"not a one-line message: {message!r}"
    for word in mentions:
        assert word.lower() in message.lower(), f"{word!r} not in {message!r}"
    return message


# --------------------------------------------------------------------------- layouts


LAYOUTS = {
    # name: (pool, linear probe, how the state dict is wrapped)
    "bare-avg (official fine-tuned)": ("avg", False, "bare"),
    "training-checkpoint-avg": ("avg", False, "training"),
    "ddp-module-prefix-avg": ("avg", False, "ddp"),
    "ddp-in-training-checkpoint-avg": ("avg", False, "ddp-training"),
    "timm-token-pool": ("token", False, "bare"),
    "linear-probe-token (MAE default)": ("token", True, "training"),
    "linear-probe-avg": ("avg", True, "bare"),
    "linear-probe-ddp": ("avg", True, "ddp"),
    "state_dict-wrapped-avg": ("avg", False, "state_dict"),
    "safetensors-without-metadata (timm hub)": ("avg", False, "safetensors"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_foreign_layouts_match_timm(layout: str, tmp_path: Path) -> None:
    pool, linear_probe, wrap = LAYOUTS[layout]
    torch.manual_seed(0)
    reference = _timm_vit(pool, linear_probe=linear_probe)
    state = reference.state_dict()
    if pool == "avg":
        assert "fc_norm.weight" in state and "norm.weight" not in state
    else:
        assert "norm.weight" in state and "fc_norm.weight" not in state
    if wrap.startswith("ddp"):
        payload = {f"module.{k}": v for k, v in state.items()}
    else:
        payload = dict(state)
    if wrap.endswith("training"):
        payload = _training_checkpoint(reference, payload, model="vit_base_patch16",
                                       global_pool=pool == "avg", nb_classes=CLASSES)
    elif wrap == "state_dict":
        payload = {"state_dict": payload}
    path = tmp_path / "classifier.pth"
    if wrap == "safetensors":
        path = tmp_path / "model.safetensors"
        safetensors.torch.save_file({k: v.contiguous() for k, v in payload.items()}, str(path))
    else:
        torch.save(payload, path)

    model = load_classifier(path, num_heads=HEADS, mean=MEAN, std=STD)

    assert not model.training
    assert list(model.state_dict()) == list(state)
    for key, value in state.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert model.spec.pool == pool
    assert model.spec.head == ("bn_linear" if linear_probe else "linear")
    assert model.spec.num_classes == CLASSES
    assert model.spec.input_size == IMG == model.spec.encoder.img_size
    assert model.spec.encoder == EncoderConfig(WIDTH, DEPTH, HEADS, PATCH, IMG)
    assert model.spec.mean == MEAN and model.spec.std == STD

    x = torch.rand(3, 3, IMG, IMG)
    with torch.no_grad():
        ours = model(x)
        expected = reference(_normalize(x))
    assert ours.shape == (3, CLASSES)
    torch.testing.assert_close(ours, expected, atol=ATOL, rtol=0)


def test_foreign_default_normalization_is_imagenet(tmp_path: Path) -> None:
    torch.manual_seed(1)
    reference = _timm_vit("avg")
    torch.save(reference.state_dict(), tmp_path / "c.pth")
    model = load_classifier(tmp_path / "c.pth", num_heads=HEADS)
    x = torch.rand(2, 3, IMG, IMG)
    imagenet = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(_normalize(x, *imagenet)), atol=ATOL, rtol=0)
        # and the normalization matters: with CIFAR-10's statistics the logits differ
        assert not torch.allclose(model(x), reference(_normalize(x)), atol=1e-3)


# --------------------------------------------------------------------------- own format


OWN_SPECS = {
    "avg-linear-resize": dict(pool="avg", head="linear", input_size=12, sigma=0.5,
                              class_names=("a", "b", "c", "d", "e")),
    "token-bn_linear-resize-up": dict(pool="token", head="bn_linear", input_size=20, sigma=None,
                                      class_names=None),
    "avg-linear-same-size": dict(pool="avg", head="linear", input_size=IMG, sigma=1.0,
                                 class_names=None),
}


@pytest.mark.parametrize("name", list(OWN_SPECS))
def test_own_format_round_trip(name: str, tmp_path: Path) -> None:
    options = OWN_SPECS[name]
    spec = ClassifierSpec(
        encoder=EncoderConfig(WIDTH, DEPTH, HEADS, PATCH, IMG),
        num_classes=CLASSES,
        mean=MEAN,
        std=STD,
        provenance={"note": "test"},
        **options,
    )
    torch.manual_seed(2)
    model = SmoothingClassifier(spec)
    _perturb(model)
    if spec.head == "bn_linear":
        model.head[0].running_mean.normal_(0.0, 0.5)
        model.head[0].running_var.uniform_(0.5, 2.0)
    model.eval()
    path = save_classifier(model, tmp_path / "model.safetensors")

    loaded = load_classifier(path)  # no heads, no mean/std: all from the metadata

    assert loaded.spec == spec
    assert loaded.spec.input_size == options["input_size"]
    assert loaded.spec.sigma == options["sigma"]
    assert loaded.spec.class_names == options["class_names"]
    assert loaded.spec.mean == MEAN and loaded.spec.std == STD
    assert isinstance(loaded.spec.mean, tuple) and isinstance(loaded.spec.encoder, EncoderConfig)

    x = torch.rand(3, 3, spec.input_size, spec.input_size)
    with torch.no_grad():
        ours = loaded(x)
        assert torch.equal(ours, model(x))
        # the same weights in a plain timm model, fed normalized then resized (bicubic)
        reference = _timm_vit(spec.pool, linear_probe=spec.head == "bn_linear")
        reference.load_state_dict(loaded.state_dict(), strict=True)
        inputs = _normalize(x)
        if spec.input_size != IMG:
            inputs = F.interpolate(inputs, size=(IMG, IMG), mode="bicubic", align_corners=False)
        torch.testing.assert_close(ours, reference(inputs), atol=ATOL, rtol=0)
        if spec.input_size != IMG:  # the resize is not antialiased
            antialiased = F.interpolate(_normalize(x), size=(IMG, IMG), mode="bicubic",
                                        align_corners=False, antialias=True)
            if spec.input_size > IMG:
                assert not torch.allclose(ours, reference(antialiased), atol=1e-4)


def test_own_format_overrides(tmp_path: Path) -> None:
    spec = ClassifierSpec(EncoderConfig(WIDTH, DEPTH, HEADS, PATCH, IMG), CLASSES, IMG, MEAN, STD)
    torch.manual_seed(3)
    model = SmoothingClassifier(spec).eval()
    path = save_classifier(model, tmp_path / "m.safetensors")
    loaded = load_classifier(path, input_size=8, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    assert loaded.spec.input_size == 8
    assert loaded.spec.mean == (0.5, 0.5, 0.5) and loaded.spec.std == (0.25, 0.25, 0.25)
    assert loaded.spec.encoder == spec.encoder


# --------------------------------------------------------------------------- official pre-training


def _official_pretrain_tensors() -> dict[str, torch.Tensor]:
    """The official DMAE release's key layout: encoder depth 2 width 32, decoder depth 1 width 16."""
    shapes = {
        "cls_token": (1, 1, 32),
        "pos_embed": (1, 17, 32),
        "mask_token": (1, 1, 16),
        "decoder_pos_embed": (1, 17, 16),
        "patch_embed.proj.weight": (32, 3, 4, 4),
        "patch_embed.proj.bias": (32,),
        "blocks.0.norm1.weight": (32,),
        "blocks.0.norm1.bias": (32,),
        "blocks.0.attn.qkv.weight": (96, 32),
        "blocks.0.attn.qkv.bias": (96,),
        "blocks.0.attn.proj.weight": (32, 32),
        "blocks.0.attn.proj.bias": (32,),
        "blocks.0.norm2.weight": (32,),
        "blocks.0.norm2.bias": (32,),
        "blocks.0.mlp.fc1.weight": (128, 32),
        "blocks.0.mlp.fc1.bias": (128,),
        "blocks.0.mlp.fc2.weight": (32, 128),
        "blocks.0.mlp.fc2.bias": (32,),
        "blocks.1.norm1.weight": (32,),
        "blocks.1.norm1.bias": (32,),
        "blocks.1.attn.qkv.weight": (96, 32),
        "blocks.1.attn.qkv.bias": (96,),
        "blocks.1.attn.proj.weight": (32, 32),
        "blocks.1.attn.proj.bias": (32,),
        "blocks.1.norm2.weight": (32,),
        "blocks.1.norm2.bias": (32,),
        "blocks.1.mlp.fc1.weight": (128, 32),
        "blocks.1.mlp.fc1.bias": (128,),
        "blocks.1.mlp.fc2.weight": (32, 128),
        "blocks.1.mlp.fc2.bias": (32,),
        "norm.weight": (32,),
        "norm.bias": (32,),
        "decoder_embed.weight": (16, 32),
        "decoder_embed.bias": (16,),
        "decoder_blocks.0.norm1.weight": (16,),
        "decoder_blocks.0.norm1.bias": (16,),
        "decoder_blocks.0.attn.qkv.weight": (48, 16),
        "decoder_blocks.0.attn.qkv.bias": (48,),
        "decoder_blocks.0.attn.proj.weight": (16, 16),
        "decoder_blocks.0.attn.proj.bias": (16,),
        "decoder_blocks.0.norm2.weight": (16,),
        "decoder_blocks.0.norm2.bias": (16,),
        "decoder_blocks.0.mlp.fc1.weight": (64, 16),
        "decoder_blocks.0.mlp.fc1.bias": (64,),
        "decoder_blocks.0.mlp.fc2.weight": (16, 64),
        "decoder_blocks.0.mlp.fc2.bias": (16,),
        "decoder_norm.weight": (16,),
        "decoder_norm.bias": (16,),
        "decoder_pred.weight": (48, 16),
        "decoder_pred.bias": (48,),
    }
    generator = torch.Generator().manual_seed(4)
    return {k: torch.randn(s, generator=generator) * 0.2 for k, s in shapes.items()}


def _copy_by_hand(tensors: dict[str, torch.Tensor]) -> VisionTransformer:
    """A timm encoder whose modules receive the official tensors one attribute at a time."""
    model = VisionTransformer(img_size=16, patch_size=4, num_classes=CLASSES, global_pool="avg",
                              embed_dim=32, depth=2, num_heads=2).eval()
    with torch.no_grad():
        model.cls_token.copy_(tensors["cls_token"])
        model.pos_embed.copy_(tensors["pos_embed"])
        model.patch_embed.proj.weight.copy_(tensors["patch_embed.proj.weight"])
        model.patch_embed.proj.bias.copy_(tensors["patch_embed.proj.bias"])
        for i, block in enumerate(model.blocks):
            for module, name in (
                (block.norm1, "norm1"), (block.attn.qkv, "attn.qkv"), (block.attn.proj, "attn.proj"),
                (block.norm2, "norm2"), (block.mlp.fc1, "mlp.fc1"), (block.mlp.fc2, "mlp.fc2"),
            ):
                module.weight.copy_(tensors[f"blocks.{i}.{name}.weight"])
                module.bias.copy_(tensors[f"blocks.{i}.{name}.bias"])
    return model


@pytest.mark.parametrize("wrap", ["bare (official release)", "training checkpoint", "run without norm_pix_loss"])
def test_official_pretrain_layout(wrap: str, tmp_path: Path) -> None:
    tensors = _official_pretrain_tensors()
    payload: dict = tensors
    if wrap != "bare (official release)":
        holder = nn.ParameterList(nn.Parameter(t.clone()) for t in tensors.values())
        payload = _training_checkpoint(holder, tensors, model="mae_vit_base_patch16",
                                       norm_pix_loss=wrap == "training checkpoint", mask_ratio=0.75, sigma=0.25)
    path = tmp_path / "dmae-pretrain.pth"
    torch.save(payload, path)

    pretrain = load_pretrain(path, num_heads=2)
    assert set(pretrain.state_dict()) == set(tensors)
    for key, value in tensors.items():
        assert torch.equal(pretrain.state_dict()[key], value), key
    assert pretrain.decoder_embed.out_features == 16 and len(pretrain.decoder_blocks) == 1  # the decoder's width, depth
    assert pretrain.encoder_config == EncoderConfig(32, 2, 2, 4, 16)
    # the official recipes all use norm_pix_loss: a bare release file loads with it on
    assert pretrain.norm_pix_loss is (wrap != "run without norm_pix_loss")

    encoder = encoder_state(path)
    assert set(encoder) == {k for k in tensors if k.startswith(("cls_token", "pos_embed", "patch_embed.", "blocks."))}
    vit = VisionTransformer(img_size=16, patch_size=4, num_classes=CLASSES, global_pool="avg",
                            embed_dim=32, depth=2, num_heads=2).eval()
    result = vit.load_state_dict(encoder, strict=False)
    assert sorted(result.missing_keys) == ["fc_norm.bias", "fc_norm.weight", "head.bias", "head.weight"]
    assert result.unexpected_keys == []
    by_hand = _copy_by_hand(tensors)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(vit.forward_features(x), by_hand.forward_features(x), atol=0, rtol=0)

    # resampled for fine-tuning at another resolution
    resized = encoder_state(path, grid_size=6)
    torch.testing.assert_close(
        resized["pos_embed"],
        resample_abs_pos_embed(tensors["pos_embed"], new_size=[6, 6], num_prefix_tokens=1),
    )

    message = _one_line_user_error(lambda: load_classifier(path, num_heads=2), "pre-training", "head")
    assert str(path) in message


def test_pretrain_refuses_classifier(tmp_path: Path) -> None:
    torch.manual_seed(5)
    torch.save(_timm_vit().state_dict(), tmp_path / "c.pth")
    _one_line_user_error(lambda: load_pretrain(tmp_path / "c.pth", num_heads=HEADS),
                         "classifier", "not a pre-training")


# --------------------------------------------------------------------------- position embeddings


def test_pos_embed_interpolation(tmp_path: Path) -> None:
    torch.manual_seed(6)
    reference = _timm_vit("avg")
    state = reference.state_dict()
    torch.save(state, tmp_path / "c16.pth")

    model = load_classifier(tmp_path / "c16.pth", img_size=24, input_size=24, num_heads=HEADS,
                            mean=MEAN, std=STD)

    expected_pos = resample_abs_pos_embed(state["pos_embed"], new_size=[6, 6], num_prefix_tokens=1)
    assert model.pos_embed.shape == (1, 37, WIDTH)
    torch.testing.assert_close(model.pos_embed.detach(), expected_pos, atol=0, rtol=0)
    assert model.spec.encoder.img_size == 24 and model.spec.encoder.grid_size == 6

    at24 = VisionTransformer(img_size=24, patch_size=PATCH, num_classes=CLASSES, global_pool="avg",
                             embed_dim=WIDTH, depth=DEPTH, num_heads=HEADS).eval()
    at24.load_state_dict({**state, "pos_embed": expected_pos}, strict=True)
    x = torch.rand(2, 3, 24, 24)
    with torch.no_grad():
        torch.testing.assert_close(model(x), at24(_normalize(x)), atol=ATOL, rtol=0)

    _one_line_user_error(lambda: load_classifier(tmp_path / "c16.pth", img_size=18, num_heads=HEADS),
                         "18", "divisible")


# --------------------------------------------------------------------------- errors


def test_missing_file(tmp_path: Path) -> None:
    _one_line_user_error(lambda: load_classifier(tmp_path / "nope.pth"), "nope.pth", "does not exist")
    _one_line_user_error(lambda: load_pretrain(tmp_path / "nope.pth"), "does not exist")
    _one_line_user_error(lambda: encoder_state(tmp_path / "nope.safetensors"), "does not exist")
    _one_line_user_error(lambda: load_classifier(tmp_path), "not a file")  # a directory


@pytest.mark.parametrize("name", ["junk.pth", "junk.safetensors", "junk.bin"])
def test_not_a_checkpoint(name: str, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(7),
                                   dtype=torch.uint8).numpy().tobytes())
    expected = "cannot read" if name.endswith(".safetensors") else "not a PyTorch checkpoint"
    _one_line_user_error(lambda: load_classifier(path, num_heads=HEADS), expected, name)


def test_not_a_state_dict(tmp_path: Path) -> None:
    torch.save([1, 2, 3], tmp_path / "list.pth")
    _one_line_user_error(lambda: load_classifier(tmp_path / "list.pth"), "no state dict")
    torch.save({}, tmp_path / "empty.pth")
    _one_line_user_error(lambda: load_classifier(tmp_path / "empty.pth"), "no state dict")


class _Exploit:
    """Pickles to a call of os.system: what a malicious checkpoint would contain."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_code_executing_pickle_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    path = tmp_path / "evil.pth"
    torch.save({"model": {"x": torch.zeros(1)}, "args": _Exploit(f"touch {shlex.quote(str(marker))}")}, path)

    _one_line_user_error(lambda: load_classifier(path), "cannot read", "weights only")
    _one_line_user_error(lambda: load_pretrain(path), "cannot read")
    _one_line_user_error(lambda: encoder_state(path), "cannot read")
    assert not marker.exists(), "the checkpoint executed code"

    # the payload is real: an unsafe load does run it (so the assertion above means something)
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_wrong_keys_are_named(tmp_path: Path) -> None:
    torch.manual_seed(8)
    state = _timm_vit("avg").state_dict()
    del state["blocks.1.attn.proj.bias"]
    state["blocks.1.attn.extra_scale"] = torch.ones(3)
    torch.save(state, tmp_path / "bad.pth")
    message = _one_line_user_error(lambda: load_classifier(tmp_path / "bad.pth", num_heads=HEADS),
                                   "missing", "unexpected")
    assert "blocks.1.attn.proj.bias" in message and "blocks.1.attn.extra_scale" in message
    assert message.index("missing") < message.index("blocks.1.attn.proj.bias") < message.index("unexpected")
    assert message.index("unexpected") < message.index("blocks.1.attn.extra_scale")

    state = _timm_vit("avg").state_dict()
    state["blocks.0.mlp.fc2.bias"] = torch.zeros(WIDTH + 1)
    torch.save(state, tmp_path / "shape.pth")
    _one_line_user_error(lambda: load_classifier(tmp_path / "shape.pth", num_heads=HEADS),
                         "shape", "blocks.0.mlp.fc2.bias")


def test_unknown_width_without_heads(tmp_path: Path) -> None:
    torch.manual_seed(9)
    torch.save(_timm_vit("avg").state_dict(), tmp_path / "c.pth")
    _one_line_user_error(lambda: load_classifier(tmp_path / "c.pth"), "heads", "width 32")
    torch.save(_official_pretrain_tensors(), tmp_path / "p.pth")
    _one_line_user_error(lambda: load_pretrain(tmp_path / "p.pth"), "heads", "width 32")


def test_heads_that_do_not_divide_width(tmp_path: Path) -> None:
    torch.manual_seed(10)
    torch.save(_timm_vit("avg").state_dict(), tmp_path / "c.pth")
    _one_line_user_error(lambda: load_classifier(tmp_path / "c.pth", num_heads=3), "width 32", "3 heads")


def test_own_metadata_with_bad_encoder(tmp_path: Path) -> None:
    spec = ClassifierSpec(EncoderConfig(WIDTH, DEPTH, HEADS, PATCH, IMG), CLASSES, IMG, MEAN, STD)
    torch.manual_seed(11)
    model = SmoothingClassifier(spec)
    metadata = spec.to_json_dict()
    metadata["encoder"]["img_size"] = 18  # not divisible by the patch size 4
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    path = tmp_path / "bad.safetensors"
    safetensors.torch.save_file(state, str(path), metadata={"dmae_fast": json.dumps(metadata)})
    _one_line_user_error(lambda: load_classifier(path), "metadata", "18", "divisible")

    safetensors.torch.save_file(state, str(path), metadata={"dmae_fast": "{not json"})
    _one_line_user_error(lambda: load_classifier(path), "metadata")


@pytest.mark.parametrize("values", [(0.5,), (0.5, 0.5, 0.5, 0.5)])
def test_normalization_with_wrong_channel_count(values: tuple[float, ...], tmp_path: Path) -> None:
    torch.manual_seed(14)
    torch.save(_timm_vit("avg").state_dict(), tmp_path / "c.pth")
    _one_line_user_error(
        lambda: load_classifier(tmp_path / "c.pth", num_heads=HEADS, mean=values, std=values),
        "3",
    )


def test_zero_input_size_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(15)
    torch.save(_timm_vit("avg").state_dict(), tmp_path / "c.pth")
    _one_line_user_error(lambda: load_classifier(tmp_path / "c.pth", num_heads=HEADS, input_size=0),
                         "input size", ">= 1")


def test_negative_input_size_is_refused(tmp_path: Path) -> None:
    torch.manual_seed(15)
    torch.save(_timm_vit("avg").state_dict(), tmp_path / "c.pth")
    _one_line_user_error(lambda: load_classifier(tmp_path / "c.pth", num_heads=HEADS, input_size=-3),
                         "input size", ">= 1")


def test_encoder_without_head_is_not_a_classifier(tmp_path: Path) -> None:
    torch.manual_seed(12)
    state = {k: v for k, v in _timm_vit("avg").state_dict().items() if not k.startswith("head.")}
    torch.save(state, tmp_path / "enc.pth")
    _one_line_user_error(lambda: load_classifier(tmp_path / "enc.pth", num_heads=HEADS), "no classification head")


# --------------------------------------------------------------------------- heads from training args


@pytest.mark.parametrize(
    ("model_name", "heads"),
    [("mae_vit_large_patch16", 16), ("vit_small_patch16", 6), ("mae_vit_base_patch16", 12)],
)
def test_heads_from_training_args(model_name: str, heads: int, tmp_path: Path) -> None:
    # width 768 is "base" (12 heads) by the standard widths: the args must win over that.
    torch.manual_seed(13)
    reference = _timm_vit("avg", width=768, depth=1, heads=heads, patch=16, img_size=32, classes=3)
    payload = _training_checkpoint(reference, reference.state_dict(), model=model_name, nb_classes=3)
    torch.save(payload, tmp_path / "c.pth")

    model = load_classifier(tmp_path / "c.pth", mean=MEAN, std=STD)
    assert model.spec.encoder.num_heads == heads
    assert model.blocks[0].attn.num_heads == heads
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(_normalize(x)), atol=ATOL, rtol=0)

    # an explicit num_heads still wins over the args
    assert load_classifier(tmp_path / "c.pth", num_heads=24).spec.encoder.num_heads == 24
