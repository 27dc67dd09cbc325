"""Tests for dmae_fast.model: DMAE's pre-training objective, the fixed position embeddings,
the smoothing classifier's timm layout and preprocessing, and the encoder presets."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.model.config import ENCODER_PRESETS, ClassifierSpec, DecoderConfig, EncoderConfig
from dmae_fast.model.dmae import DMAEPretrain
from dmae_fast.model.pos_embed import sincos_2d

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
ENCODER = EncoderConfig(embed_dim=32, depth=2, num_heads=2, patch_size=4, img_size=16)
DECODER = DecoderConfig(embed_dim=16, depth=1, num_heads=2)
P, GRID = 4, 4  # patch size, patches per side


def _patchify(images: torch.Tensor, p: int = P) -> torch.Tensor:
    """MAE's patch order: patches row by row; inside a patch pixels row, column, channel."""
    b, c, h, w = images.shape
    x = images.reshape(b, c, h // p, p, w // p, p)  # b c gh ph gw pw
    x = x.permute(0, 2, 4, 3, 5, 1)  # b gh gw ph pw c
    return x.reshape(b, (h // p) * (w // p), p * p * c)


def _pretrain(norm_pix_loss: bool = False, seed: int = 0) -> DMAEPretrain:
    torch.manual_seed(seed)
    return DMAEPretrain(ENCODER, DECODER, norm_pix_loss=norm_pix_loss).eval()


def _noise(shape, seed: int) -> torch.Tensor:
    """The first normal draw of a generator seeded like the one given to the model."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- DMAE objective


def test_own_patchify_matches_mae_order() -> None:
    # guard the test's helper itself: patch (row 1, col 2), pixel (row 3, col 0), channel 2
    images = torch.arange(2 * 3 * 16 * 16, dtype=torch.float32).reshape(2, 3, 16, 16)
    patches = _patchify(images)
    assert patches.shape == (2, 16, 48)
    assert patches[1, 1 * GRID + 2, (3 * P + 0) * 3 + 2] == images[1, 2, 1 * P + 3, 2 * P + 0]
    assert torch.equal(_pretrain().patchify(images), patches)


def _official_target(clean: torch.Tensor, mean, std, norm_pix: bool) -> torch.Tensor:
    """The official DMAE target written out element by element, independently of the model:
    the clean image normalized per channel, cut into patches (pixel row, column, channel),
    each patch standardized by its own mean and unbiased variance when ``norm_pix``."""
    b, c, h, w = clean.shape
    rows = []
    for n in range(b):
        patches = []
        for i in range(h // P):
            for j in range(w // P):
                values = [(float(clean[n, ch, i * P + y, j * P + x]) - mean[ch]) / std[ch]
                          for y in range(P) for x in range(P) for ch in range(c)]
                if norm_pix:
                    mu = sum(values) / len(values)
                    var = sum((v - mu) ** 2 for v in values) / (len(values) - 1)
                    values = [(v - mu) / math.sqrt(var + 1e-6) for v in values]
                patches.append(values)
        rows.append(patches)
    return torch.tensor(rows, dtype=torch.float64)


def _official_loss(clean, pred, mean, std, norm_pix: bool) -> float:
    """DMAE's loss: mean squared error over every element of every patch (no mask)."""
    target = _official_target(clean, mean, std, norm_pix)
    return float(((pred.double() - target) ** 2).mean())


@pytest.mark.parametrize("norm_pix", [False, True])
@pytest.mark.parametrize("normalization", ["imagenet", "custom"])
def test_loss_matches_the_official_objective_on_fixed_noise_and_masks(norm_pix, normalization) -> None:
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if normalization == "imagenet" else ((0.3, 0.5, 0.7), (0.1, 0.2, 0.4))
    torch.manual_seed(0)
    model = DMAEPretrain(ENCODER, DECODER, mean=mean, std=std, norm_pix_loss=norm_pix).eval()
    clean = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    noise = torch.randn(clean.shape, generator=torch.Generator().manual_seed(2))
    scores = torch.rand(3, GRID * GRID, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(clean, sigma=0.25, noise=noise, scores=scores)
    assert out.pred.shape == (3, GRID * GRID, P * P * 3) and out.loss.shape == ()
    assert out.loss.item() == pytest.approx(_official_loss(clean, out.pred, mean, std, norm_pix), rel=1e-5)
    # the [0, 1] clean image as the target (this project's earlier objective) is measurably different
    raw = ((out.pred - _patchify(clean)) ** 2).mean().item()
    if not norm_pix:
        assert abs(out.loss.item() - raw) > 0.1
    # reconstruction_loss on a prediction we choose: the official target gives 0, one shifted patch 1/L
    target = _official_target(clean, mean, std, norm_pix).float()
    assert model.reconstruction_loss(clean, target).item() == pytest.approx(0.0, abs=1e-9)
    shifted = target.clone()
    shifted[0, 5] += 1.0
    assert model.reconstruction_loss(clean, shifted).item() == pytest.approx(1 / (3 * GRID * GRID), rel=1e-4)


def test_loss_covers_all_patches_and_the_clean_image() -> None:
    model = _pretrain()
    torch.manual_seed(1)
    clean = torch.rand(4, 3, 16, 16)
    sigma, seed = 0.5, 123
    with torch.no_grad():
        out = model(clean, sigma=sigma, generator=torch.Generator().manual_seed(seed))
    target = _official_target(clean, IMAGENET_MEAN, IMAGENET_STD, False).float()
    per_patch = ((out.pred - target) ** 2).mean(-1)
    torch.testing.assert_close(out.loss, per_patch.mean(), atol=1e-6, rtol=1e-6)
    # not MAE's loss (masked patches only) ...
    masked_only = (per_patch * out.mask).sum() / out.mask.sum()
    assert abs(out.loss.item() - masked_only.item()) > 1e-3
    # ... and not a reconstruction of the noisy input
    noisy = clean + sigma * _noise(clean.shape, seed)
    against_noisy = ((out.pred - _official_target(noisy, IMAGENET_MEAN, IMAGENET_STD, False).float()) ** 2).mean()
    assert abs(out.loss.item() - against_noisy.item()) > 1e-2


def test_mask_hides_75_percent_per_image() -> None:
    model = _pretrain()
    clean = torch.rand(6, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = model(clean, generator=torch.Generator().manual_seed(9))  # default ratio 0.75
    assert out.mask.shape == (6, 16)
    assert set(out.mask.unique().tolist()) <= {0.0, 1.0}
    assert out.mask.sum(1).tolist() == [12.0] * 6
    assert not all(torch.equal(out.mask[0], row) for row in out.mask[1:])  # random per image


def test_masked_patches_are_hidden_from_the_encoder() -> None:
    """pred depends on the visible patches only (mask 1 = hidden), through the encoder."""
    model = _pretrain()
    torch.manual_seed(5)
    clean = torch.rand(1, 3, 16, 16)
    with torch.no_grad():
        base = model(clean, generator=torch.Generator().manual_seed(11))
        mask = base.mask[0]
        hidden, visible = int(mask.argmax()), int(mask.argmin())
        for index, should_change in ((hidden, False), (visible, True)):
            changed = clean.clone()
            r, c = divmod(index, GRID)
            changed[:, :, r * P:(r + 1) * P, c * P:(c + 1) * P] += 0.5
            out = model(changed, generator=torch.Generator().manual_seed(11))
            assert torch.equal(out.mask, base.mask)
            assert torch.equal(out.pred, base.pred) is not should_change


def test_noise_added_in_pixel_space_before_normalization() -> None:
    mean, std = (0.3, 0.4, 0.5), (0.1, 0.2, 0.3)
    torch.manual_seed(6)
    model = DMAEPretrain(ENCODER, DECODER, mean=mean, std=std).eval()
    seen: list[torch.Tensor] = []
    handle = model.patch_embed.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    clean = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(7)) * 0.2 + 0.8
    sigma, seed = 1.0, 31
    with torch.no_grad():
        model(clean, sigma=sigma, generator=torch.Generator().manual_seed(seed))
    handle.remove()
    assert len(seen) == 1
    m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    noise = _noise(clean.shape, seed)
    noisy = clean + sigma * noise
    assert noisy.max() > 1 and noisy.min() < 0  # so a clamp to [0, 1] would show
    torch.testing.assert_close(seen[0], (noisy - m) / s, atol=1e-5, rtol=1e-5)
    # not noise added after normalization
    assert not torch.allclose(seen[0], (clean - m) / s + sigma * noise, atol=1e-2)


def test_noise_via_monkeypatched_randn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model draws its noise with torch.randn over the image's shape, scaled by sigma."""
    model = _pretrain()
    fixed = torch.full((1, 3, 16, 16), 0.7)
    calls: list[tuple] = []
    real_randn = torch.randn

    def fake_randn(*args, **kwargs):
        calls.append(args)
        return fixed.clone()

    monkeypatch.setattr(torch, "randn", fake_randn)
    seen: list[torch.Tensor] = []
    model.patch_embed.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    clean = torch.zeros(1, 3, 16, 16)
    with torch.no_grad():
        model(clean, sigma=0.5)
    monkeypatch.setattr(torch, "randn", real_randn)
    assert len(calls) == 1
    m, s = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(seen[0], (0.35 - m) / s * torch.ones(1, 3, 16, 16))


def test_pretrain_state_dict_follows_official_names() -> None:
    keys = set(_pretrain().state_dict())
    assert {"cls_token", "pos_embed", "mask_token", "decoder_pos_embed", "patch_embed.proj.weight",
            "norm.weight", "decoder_embed.weight", "decoder_norm.bias", "decoder_pred.weight",
            "blocks.1.attn.qkv.bias", "decoder_blocks.0.mlp.fc2.weight"} <= keys
    assert "mean" not in keys and "std" not in keys
    assert not any(k.startswith(("blocks.2.", "decoder_blocks.1.")) for k in keys)


def test_pretrain_backward() -> None:
    model = _pretrain().train()
    out = model(torch.rand(2, 3, 16, 16), generator=torch.Generator().manual_seed(0))
    out.loss.backward()
    assert model.patch_embed.proj.weight.grad is not None
    assert model.mask_token.grad is not None and model.mask_token.grad.abs().sum() > 0
    assert model.pos_embed.grad is None and model.decoder_pos_embed.grad is None


# --------------------------------------------------------------------------- sin-cos embeddings


def test_sincos_2d_shape_and_class_token() -> None:
    table = sincos_2d(32, 4)
    assert table.shape == (1, 17, 32) and table.dtype == torch.float32
    assert torch.equal(table[0, 0], torch.zeros(32))
    assert sincos_2d(32, 4, class_token=False).shape == (1, 16, 32)
    assert torch.equal(sincos_2d(32, 4, class_token=False), table[:, 1:])
    with pytest.raises(ValueError):
        sincos_2d(30, 4)


@pytest.mark.parametrize(("dim", "grid", "row", "col"), [(32, 4, 1, 2), (16, 5, 3, 0), (64, 7, 6, 5)])
def test_sincos_2d_values_by_hand(dim: int, grid: int, row: int, col: int) -> None:
    table = sincos_2d(dim, grid)
    vector = table[0, 1 + row * grid + col]  # patches numbered row by row after the class token
    quarter = dim // 4
    frequencies = [1.0 / 10000 ** (i / quarter) for i in range(quarter)]
    expected = (
        [math.sin(col * w) for w in frequencies] + [math.cos(col * w) for w in frequencies]
        + [math.sin(row * w) for w in frequencies] + [math.cos(row * w) for w in frequencies]
    )
    torch.testing.assert_close(vector, torch.tensor(expected, dtype=torch.float32), atol=1e-6, rtol=0)


def test_fixed_embeddings_in_pretrain_model() -> None:
    model = _pretrain()
    assert not model.pos_embed.requires_grad and not model.decoder_pos_embed.requires_grad
    assert torch.equal(model.pos_embed.data, sincos_2d(32, GRID))
    assert torch.equal(model.decoder_pos_embed.data, sincos_2d(16, GRID))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "pos_embed" not in trainable and "decoder_pos_embed" not in trainable
    assert {"cls_token", "mask_token"} <= trainable


# --------------------------------------------------------------------------- smoothing classifier


def _spec(**changes) -> ClassifierSpec:
    fields = dict(encoder=ENCODER, num_classes=7, input_size=16, mean=(0.2, 0.3, 0.4), std=(0.5, 0.6, 0.7))
    return ClassifierSpec(**{**fields, **changes})


@pytest.mark.parametrize("pool", ["avg", "token"])
def test_classifier_state_dict_is_timm_layout(pool: str) -> None:
    ours = SmoothingClassifier(_spec(pool=pool))
    timm_model = VisionTransformer(img_size=16, patch_size=4, num_classes=7, global_pool=pool,
                                   embed_dim=32, depth=2, num_heads=2)
    assert list(ours.state_dict()) == list(timm_model.state_dict())
    for key, value in timm_model.state_dict().items():
        assert ours.state_dict()[key].shape == value.shape, key
    keys = set(ours.state_dict())
    assert "mean" not in keys and "std" not in keys
    if pool == "avg":
        assert {"fc_norm.weight", "fc_norm.bias", "head.weight", "head.bias"} <= keys
        assert "norm.weight" not in keys
    top = {k.split(".")[0] for k in keys}
    norm = "fc_norm" if pool == "avg" else "norm"
    assert top == {"cls_token", "pos_embed", "patch_embed", "blocks", norm, "head"}


def test_linear_probe_head_keys() -> None:
    ours = SmoothingClassifier(_spec(head="bn_linear"))
    head_keys = sorted(k for k in ours.state_dict() if k.startswith("head."))
    assert head_keys == ["head.0.num_batches_tracked", "head.0.running_mean", "head.0.running_var",
                         "head.1.bias", "head.1.weight"]
    bn = ours.head[0]
    assert isinstance(bn, nn.BatchNorm1d) and not bn.affine and bn.eps == 1e-6


def test_normalization_is_the_first_operation() -> None:
    torch.manual_seed(8)
    spec = _spec()
    model = SmoothingClassifier(spec).eval()
    seen: list[torch.Tensor] = []
    model.patch_embed.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    x = torch.rand(3, 3, 16, 16)
    with torch.no_grad():
        logits = model(x)
    assert logits.shape == (3, 7)
    m, s = torch.tensor(spec.mean).view(1, 3, 1, 1), torch.tensor(spec.std).view(1, 3, 1, 1)
    torch.testing.assert_close(seen[0], (x - m) / s, atol=1e-6, rtol=0)
    # and the rest is exactly timm
    timm_model = VisionTransformer(img_size=16, patch_size=4, num_classes=7, global_pool="avg",
                                   embed_dim=32, depth=2, num_heads=2).eval()
    timm_model.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(logits, timm_model((x - m) / s), atol=1e-6, rtol=0)


def test_resize_after_normalization() -> None:
    torch.manual_seed(9)
    spec = _spec(input_size=11)
    model = SmoothingClassifier(spec).eval()
    assert spec.input_shape == (3, 11, 11)
    seen: list[torch.Tensor] = []
    model.patch_embed.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    x = torch.rand(2, 3, 11, 11)
    with torch.no_grad():
        model(x)
    m, s = torch.tensor(spec.mean).view(1, 3, 1, 1), torch.tensor(spec.std).view(1, 3, 1, 1)
    expected = F.interpolate((x - m) / s, size=(16, 16), mode="bicubic", align_corners=False)
    torch.testing.assert_close(seen[0], expected, atol=1e-6, rtol=0)
    # the resize mode is pinned: align_corners=True would give something else
    other = F.interpolate((x - m) / s, size=(16, 16), mode="bicubic", align_corners=True)
    assert not torch.allclose(seen[0], other, atol=1e-3)


@pytest.mark.parametrize("pool", ["avg", "token"])
def test_tokens_then_body_equals_forward(pool: str) -> None:
    """The split a fused front end relies on: forward(x) == forward_tokens(tokens(x))."""
    torch.manual_seed(10)
    model = SmoothingClassifier(_spec(pool=pool)).eval()
    x = torch.rand(3, 3, 16, 16)
    with torch.no_grad():
        tokens = model.tokens(x)
        assert tokens.shape == (3, 1 + GRID * GRID, 32)
        # row 0 is the class token plus its position embedding
        torch.testing.assert_close(tokens[:, 0], (model.cls_token[:, 0] + model.pos_embed[:, 0]).expand(3, -1))
        torch.testing.assert_close(model.forward_tokens(tokens), model(x), atol=1e-6, rtol=0)


def test_mean_std_are_non_persistent_buffers() -> None:
    model = SmoothingClassifier(_spec())
    buffers = dict(model.named_buffers())
    assert torch.equal(buffers["mean"].flatten(), torch.tensor((0.2, 0.3, 0.4)))
    assert torch.equal(buffers["std"].flatten(), torch.tensor((0.5, 0.6, 0.7)))
    assert "mean" not in model.state_dict() and "std" not in model.state_dict()


# --------------------------------------------------------------------------- presets


def test_encoder_presets() -> None:
    base, large = ENCODER_PRESETS["base"], ENCODER_PRESETS["large"]
    assert (base.embed_dim, base.depth, base.num_heads, base.patch_size, base.img_size) == (768, 12, 12, 16, 224)
    assert (large.embed_dim, large.depth, large.num_heads, large.patch_size, large.img_size) == (1024, 24, 16, 16, 224)
    assert base.mlp_ratio == large.mlp_ratio == 4.0 and base.in_chans == 3
    assert base.grid_size == 14


def test_decoder_defaults_and_config_validation() -> None:
    assert DecoderConfig() == DecoderConfig(512, 8, 16)
    with pytest.raises(ValueError, match="divisible"):
        EncoderConfig(32, 2, 2, patch_size=4, img_size=18)
    with pytest.raises(ValueError, match="divisible"):
        EncoderConfig(32, 2, 3, patch_size=4, img_size=16)
