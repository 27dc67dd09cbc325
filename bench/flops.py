"""FLOPs of one ViT forward pass, from the model's configuration (2 FLOPs per multiply-add).

With N = L + 1 tokens (L = (img / p)^2 patches plus the class token), width D, MLP ratio r,
depth k, C input channels, patch p and K classes, the multiply-adds are

    patch embedding   L * D * C * p^2
    each block        4 N D^2 (qkv + projection) + 2 N^2 D (scores + weighted values) + 2 r N D^2 (MLP)
    head              D * K

Norms, softmax, GELU and additions are left out (< 1%). ViT-B/16 at 224: 17.6 GMACs = 35.1
GFLOP; ViT-L/16: 61.6 GMACs = 123.1 GFLOP. A classifier that resizes inside (CIFAR-10
32 -> 224) pays the encoder's size, which is what the formula counts.
"""

from __future__ import annotations

from dmae_fast.model.config import ClassifierSpec


def vit_forward_flops(spec: ClassifierSpec) -> float:
    """FLOPs (2 x multiply-adds) of one forward pass of ``spec``'s classifier."""
    enc = spec.encoder
    patches = enc.grid_size**2
    tokens, width = patches + 1, enc.embed_dim
    block = 4 * tokens * width**2 + 2 * tokens**2 * width + 2 * enc.mlp_ratio * tokens * width**2
    macs = patches * width * enc.in_chans * enc.patch_size**2 + enc.depth * block + width * spec.num_classes
    return 2.0 * macs
