"""DMAE pre-training model: Gaussian noise + masking, reconstruct the clean image.

clean x in [0, 1] -> x + sigma * eta (no clamp) -> normalize -> patchify/embed -> keep a random 25% of patches ->
ViT encoder -> light decoder with mask tokens -> pixels per patch. The loss is the MSE against the CLEAN image over
ALL patches (MAE: masked only), the target normalized like the input (``norm_pix_loss``: each patch by its own mean
and variance). Parameter names follow the official MAE/DMAE release, so its files load strictly."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from timm.layers import PatchEmbed
from timm.models.vision_transformer import Block
from torch import nn

from dmae_fast.model.config import IMAGENET_MEAN, IMAGENET_STD, DecoderConfig, EncoderConfig
from dmae_fast.model.pos_embed import sincos_2d


@dataclass(frozen=True)
class PretrainOutput:
    loss: torch.Tensor  # scalar
    pred: torch.Tensor  # [B, L, patch*patch*C] reconstruction of every patch
    mask: torch.Tensor  # [B, L], 1 = masked (hidden from the encoder)


def _blocks(width: int, depth: int, heads: int, mlp_ratio: float) -> nn.Sequential:
    norm = partial(nn.LayerNorm, eps=1e-6)
    return nn.Sequential(*(Block(width, heads, mlp_ratio, qkv_bias=True, norm_layer=norm) for _ in range(depth)))


class DMAEPretrain(nn.Module):
    """Encoder + decoder of DMAE with the noise, masking and loss of the paper."""

    def __init__(self, encoder: EncoderConfig, decoder: DecoderConfig = DecoderConfig(),
                 mean: tuple[float, ...] = IMAGENET_MEAN, std: tuple[float, ...] = IMAGENET_STD,
                 norm_pix_loss: bool = False) -> None:
        super().__init__()
        self.encoder_config = encoder
        self.norm_pix_loss = norm_pix_loss
        p, width, grid = encoder.patch_size, encoder.embed_dim, encoder.grid_size
        self.patch_embed = PatchEmbed(encoder.img_size, p, encoder.in_chans, width)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embed = nn.Parameter(sincos_2d(width, grid), requires_grad=False)
        self.blocks = _blocks(width, encoder.depth, encoder.num_heads, encoder.mlp_ratio)
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.decoder_embed = nn.Linear(width, decoder.embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder.embed_dim))
        self.decoder_pos_embed = nn.Parameter(sincos_2d(decoder.embed_dim, grid), requires_grad=False)
        self.decoder_blocks = _blocks(decoder.embed_dim, decoder.depth, decoder.num_heads, encoder.mlp_ratio)
        self.decoder_norm = nn.LayerNorm(decoder.embed_dim, eps=1e-6)
        self.decoder_pred = nn.Linear(decoder.embed_dim, p * p * encoder.in_chans)
        channels = (1, encoder.in_chans, 1, 1)
        self.register_buffer("mean", torch.tensor(mean).view(channels), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(channels), persistent=False)
        self._init_weights()

    def _init_weights(self) -> None:
        """MAE's initialization: xavier-uniform linears (patch embedding as a linear)."""
        proj = self.patch_embed.proj.weight
        nn.init.xavier_uniform_(proj.view(proj.shape[0], -1))
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """[B, C, H, W] -> [B, L, p*p*C] (pixels of a patch ordered row, column, channel)."""
        p = self.encoder_config.patch_size
        b, c, h, w = images.shape
        x = images.reshape(b, c, h // p, p, w // p, p)
        return torch.einsum("bchpwq->bhwpqc", x).reshape(b, (h // p) * (w // p), p * p * c)

    def random_masking(self, tokens: torch.Tensor, mask_ratio: float, generator: torch.Generator | None = None,
                       scores: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keep a random subset of tokens per image: (kept, mask [B, L], restore order); the tokens with
        the lowest ``scores`` [B, L] are kept (default: uniform random)."""
        b, length, width = tokens.shape
        keep = int(length * (1 - mask_ratio))
        if scores is None:
            scores = torch.rand(b, length, device=tokens.device, generator=generator)
        shuffle = torch.argsort(scores, dim=1)
        restore = torch.argsort(shuffle, dim=1)
        kept = torch.gather(tokens, 1, shuffle[:, :keep, None].expand(-1, -1, width))
        mask = torch.ones(b, length, device=tokens.device)
        mask[:, :keep] = 0
        return kept, torch.gather(mask, 1, restore), restore

    def encode(self, noisy: torch.Tensor, mask_ratio: float, generator: torch.Generator | None = None,
               scores: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.patch_embed(self.normalize(noisy)) + self.pos_embed[:, 1:]
        x, mask, restore = self.random_masking(x, mask_ratio, generator, scores)
        cls = (self.cls_token + self.pos_embed[:, :1]).expand(x.shape[0], -1, -1)
        return self.norm(self.blocks(torch.cat([cls, x], dim=1))), mask, restore

    def decode(self, latent: torch.Tensor, restore: torch.Tensor) -> torch.Tensor:
        x = self.decoder_embed(latent)
        b, length = restore.shape
        masks = self.mask_token.expand(b, length + 1 - x.shape[1], -1)
        patches = torch.cat([x[:, 1:], masks], dim=1)
        patches = torch.gather(patches, 1, restore[:, :, None].expand(-1, -1, x.shape[2]))
        x = self.decoder_blocks(torch.cat([x[:, :1], patches], dim=1) + self.decoder_pos_embed)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:]

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """[0, 1] pixels -> the per-channel normalized input of the encoder."""
        return (images - self.mean) / self.std

    def target(self, clean: torch.Tensor) -> torch.Tensor:
        """What the decoder reconstructs: the normalized clean image per patch [B, L, p*p*C]
        (each patch standardized on its own with ``norm_pix_loss``)."""
        target = self.patchify(self.normalize(clean))
        if self.norm_pix_loss:
            mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
            target = (target - mean) / (var + 1e-6) ** 0.5
        return target

    def reconstruction_loss(self, clean: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """Mean squared error against the (normalized) clean image over all patches."""
        return ((pred - self.target(clean)) ** 2).mean()

    def forward(self, clean: torch.Tensor, sigma: float = 0.25, mask_ratio: float = 0.75,
                generator: torch.Generator | None = None, noise: torch.Tensor | None = None,
                scores: torch.Tensor | None = None) -> PretrainOutput:
        """One pre-training step's forward: ``clean`` holds [0, 1] images. ``noise`` (standard Gaussian, shaped
        like ``clean``) and the masking ``scores`` [B, L] may be given, e.g. drawn per sample so that a
        distributed or resumed run sees the same randomness; otherwise they are drawn from ``generator``."""
        if noise is None:
            noise = torch.randn(clean.shape, device=clean.device, generator=generator)
        latent, mask, restore = self.encode(clean + sigma * noise, mask_ratio, generator, scores)
        pred = self.decode(latent, restore)
        return PretrainOutput(self.reconstruction_loss(clean, pred), pred, mask)
