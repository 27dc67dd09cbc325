"""The paper's pre-training figure: original / noisy / masked noisy / reconstruction.

Works for our ``pretrain.pth`` files and for official DMAE/MAE pre-training files. The
reconstruction is the decoder's prediction of EVERY patch (DMAE also denoises the visible
ones); with ``norm_pix_loss`` models it is shown with each patch's clean mean and variance
restored.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch
from matplotlib.figure import Figure

from dmae_fast.base.errors import UserError
from dmae_fast.data import open_dataset
from dmae_fast.model.checkpoints import load_pretrain
from dmae_fast.model.dmae import DMAEPretrain
from dmae_fast.train.config import VisualizeConfig, check_mask_ratio
from dmae_fast.train.pretrain import load_own_pretrain
from dmae_fast.train.randomness import Stream, gaussians, uniforms

ROWS = ("original", "noisy", "masked noisy", "reconstruction")


def unpatchify(model: DMAEPretrain, patches: torch.Tensor) -> torch.Tensor:
    """[B, L, p*p*C] -> [B, C, H, W] (the inverse of ``model.patchify``)."""
    p, c, grid = model.encoder_config.patch_size, model.encoder_config.in_chans, model.encoder_config.grid_size
    x = patches.reshape(-1, grid, grid, p, p, c)
    return torch.einsum("bhwpqc->bchpwq", x).reshape(-1, c, grid * p, grid * p)


@torch.no_grad()
def figure_rows(model: DMAEPretrain, images: torch.Tensor, config: VisualizeConfig) -> list[torch.Tensor]:
    """The four rows of the figure, each [N, C, H, W] in [0, 1]."""
    model.eval()
    index = torch.arange(len(images))
    noise = gaussians(config.seed, Stream.PRETRAIN_NOISE, index, 0, tuple(images.shape[1:]))
    scores = uniforms(config.seed, Stream.MASK, index, 0, model.encoder_config.grid_size ** 2)
    output = model(images, config.sigma, config.mask_ratio, noise=noise, scores=scores)
    pred = output.pred  # in the normalized space of the target
    if model.norm_pix_loss:
        target = model.patchify(model.normalize(images))
        pred = pred * (target.var(-1, keepdim=True) + 1e-6) ** 0.5 + target.mean(-1, keepdim=True)
    reconstruction = unpatchify(model, pred) * model.std + model.mean
    noisy = images + config.sigma * noise
    p, c = model.encoder_config.patch_size, model.encoder_config.in_chans
    hidden = unpatchify(model, output.mask[:, :, None].expand(-1, -1, p * p * c))
    masked = noisy * (1 - hidden) + 0.5 * hidden
    return [t.clamp(0, 1) for t in (images, noisy, masked, reconstruction)]


#: Figure formats by file name suffix (no suffix: PNG).
FORMATS = ("png", "pdf", "svg", "jpg", "jpeg")


def figure_format(out: Path) -> str:
    """The format of a new figure at ``out``; UserError for a path that cannot take one."""
    if out.exists() or out.is_symlink():
        raise _taken(out)
    if not out.parent.is_dir():
        raise UserError(f"--out {out}: {out.parent} is not an existing directory")
    kind = out.suffix[1:].lower() or "png"
    if kind not in FORMATS:
        raise UserError(f"--out {out}: unknown figure format {out.suffix!r}; name it .{', .'.join(FORMATS)}")
    return kind


def visualize(config: VisualizeConfig, out: Path) -> Path:
    kind = figure_format(out)
    if config.checkpoint is None:
        raise UserError("visualize needs a pre-training checkpoint: --init PATH (or --set checkpoint=PATH)")
    model = load_own_pretrain(config.checkpoint) or load_pretrain(config.checkpoint, num_heads=config.num_heads)
    check_mask_ratio(config.mask_ratio, model.encoder_config)
    size = config.input_size or model.encoder_config.img_size
    dataset = open_dataset(config.dataset, split=config.split, image_size=size)
    count = min(config.images, len(dataset))
    images = torch.stack([dataset[i][0] for i in range(count)])
    if tuple(images.shape[1:]) != (model.encoder_config.in_chans, model.encoder_config.img_size,
                                   model.encoder_config.img_size):
        raise UserError(f"images of {config.dataset} are {tuple(images.shape[1:])}, the model takes "
                        f"{model.encoder_config.img_size}x{model.encoder_config.img_size}: set input_size")
    rows = figure_rows(model, images, config)
    fig = Figure(figsize=(1.6 * count, 1.6 * len(ROWS)))  # no pyplot: works headless
    axes = fig.subplots(len(ROWS), count, squeeze=False)
    for r, (name, row) in enumerate(zip(ROWS, rows)):
        for i in range(count):
            axis = axes[r][i]
            axis.imshow(row[i].permute(1, 2, 0).numpy(), interpolation="nearest")
            axis.set_xticks([])
            axis.set_yticks([])
            if i == 0:
                axis.set_ylabel(name, fontsize=8)
    fig.suptitle(f"sigma {config.sigma}, mask ratio {config.mask_ratio}", fontsize=9)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format=kind, dpi=120)
    try:
        file = open(out, "xb")  # never over a file that appeared meanwhile
    except FileExistsError:
        raise _taken(out) from None
    try:
        with file:
            file.write(image.getvalue())
    except OSError:  # a full disk: no half-written figure is left behind
        out.unlink(missing_ok=True)
        raise
    return out


def _taken(out: Path) -> UserError:
    return UserError(f"{out} exists; choose another --out (results are never overwritten)")
