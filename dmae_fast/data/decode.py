"""Reading image files as float32 tensors ``[C, H, W]`` in [0, 1], exactly (:func:`load_rgb`'s rules) or not at all."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision import transforms

from dmae_fast.base.errors import UserError
from dmae_fast.base.messages import one_line
from dmae_fast.data.checks import file_problem

# ImageNet evaluation: resize the short side to image_size / 0.875, then center-crop.
CROP_FRACTION = 0.875


def check_image_size(image_size: Any) -> int:
    """``image_size`` as an int; UserError unless a whole number >= 1 whose resized images stay within PIL's limit."""
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)):
        raise UserError(f"image size must be a whole number of pixels, got {image_size!r}")
    if image_size < 1:
        raise UserError(f"image size must be at least 1, got {image_size}")
    short = _resized_short_side(int(image_size))
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and short * short > limit:
        raise UserError(f"image size {image_size} is too large: images would be resized to at least "
                        f"{short}x{short} pixels, above PIL's limit of {limit}")
    return int(image_size)


def _resized_short_side(image_size: int) -> int:
    return round(image_size / CROP_FRACTION)


def eval_transform(image_size: int) -> Callable[[Image.Image | torch.Tensor], torch.Tensor]:
    """Resize the short side to ``round(image_size / 0.875)``, center-crop, to tensor: PIL images (8 bits per
    channel) by PIL, high-depth images (float32 tensors) by torchvision's tensor path."""
    image_size = check_image_size(image_size)
    resize = transforms.Resize(_resized_short_side(image_size), interpolation=transforms.InterpolationMode.BILINEAR)
    return transforms.Compose([resize, transforms.CenterCrop(image_size), to_tensor])


def read_image(path: str | os.PathLike, transform: Callable[[Image.Image | torch.Tensor], torch.Tensor],
               image_size: int | None, image_shape: tuple[int, int, int]) -> torch.Tensor:
    """Decode, transform and check one image of a file dataset; UserError naming the file."""
    image = load_rgb(path)
    if image_size is not None:
        _check_resizable(image, path, image_size)
    tensor = transform(image)
    if tuple(tensor.shape) != tuple(image_shape):  # without image_size: the file changed since it was opened
        raise UserError(f"image file {path} is {tensor.shape[-1]}x{tensor.shape[-2]} but the dataset's images are "
                        f"{image_shape[2]}x{image_shape[1]} (was it replaced after the dataset was opened?)")
    return tensor


def _check_resizable(image: Image.Image | torch.Tensor, path: str | os.PathLike, image_size: int) -> None:
    """UserError if resizing the short side to ``round(image_size / 0.875)`` makes more
    pixels than PIL's decompression-bomb limit (a very long, thin image)."""
    width, height = image.size if isinstance(image, Image.Image) else (image.shape[-1], image.shape[-2])
    short_side = _resized_short_side(image_size)
    long_side = int(short_side * max(width, height) / min(width, height))  # as torchvision's Resize
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and short_side * long_side > limit:
        raise UserError(f"image file {path} is {width}x{height}: resizing its short side to {short_side} would make "
                        f"{short_side * long_side} pixels, above PIL's limit of {limit}; crop it first")


def load_rgb(path: str | os.PathLike) -> Image.Image | torch.Tensor:
    """Decode an image file to RGB in [0, 1], naming the file if that cannot be done exactly.

    * 8-bit images: PIL RGB images (grey, palette, CMYK, LAB, 1/2/4-bit converted by PIL); an alpha channel
      is dropped, the colours kept as stored (not blended), as torchvision's loader does.
    * 16-bit grey (PIL ``I;16*``, or ``I`` from a 16-bit PNG/TIFF/PGM): float32 [3, H, W], the grey value
      / 65535 in each channel (12-bit TIFFs / 4095). Float images (mode ``F``): their values as they are.
    * Refused: NaN/inf or values outside [0, 1]; 16-bit colour and grey+alpha (PIL decodes them to 8 bits);
      32-bit and signed integers (no defined [0, 1] scale).
    * Only the first frame of an animated or multi-page file is used."""
    problem = file_problem(path)
    if problem is not None:
        raise UserError(f"cannot read image file {path}: {problem}")
    try:
        with Image.open(path) as image:
            tiles = list(getattr(image, "tile", None) or [])  # how PIL will decode: gone after load()
            image.load()
            return _to_rgb(image, tiles, path)
    except UserError:
        raise
    except Exception as exc:  # PIL fails on corrupt files in many ways (OSError, SyntaxError, MemoryError, ...)
        raise UserError(f"cannot decode image file {path}: {one_line(exc)}") from None


# Raw modes in which PIL reads 16 bits per channel into an 8-bit mode. ("RGB;16" and
# "BGR;16" without a byte order are 5-6-5 packed 16-bit pixels, which 8 bits hold exactly.)
_DEEP_TO_8_BIT = re.compile(r"L;16[BLN]?|(?:LA|RGB|RGBA|RGBX|RGBa|CMYK);16[BLN]")
_UNSIGNED_16 = ("I;16", "I;16B", "I;16L", "I;16N")


def _rawmode(tile: Any) -> str:
    """The raw mode of one PIL tile (``args`` is a raw mode or a tuple starting with one)."""
    args = tile[3]
    if isinstance(args, tuple) and args and isinstance(args[0], str):
        return args[0]
    return args if isinstance(args, str) else ""


def _to_rgb(image: Image.Image, tiles: list[Any], path: str | os.PathLike) -> Image.Image | torch.Tensor:
    """A decoded PIL image as in :func:`load_rgb`; ``tiles`` is its tile list before loading."""
    rawmodes = [_rawmode(tile) for tile in tiles]
    # PIL's PPM decoder rescales samples above 8 bits to the mode: 65535 for grey (mode I), 255 for colour (quantized).
    ppm_maxval = max((tile[3][-1] for tile in tiles if tile[0] in ("ppm", "ppm_plain")
                      and isinstance(tile[3], tuple) and isinstance(tile[3][-1], int)), default=0)
    if image.mode == "F":
        return _grey_tensor(np.asarray(image, dtype=np.float64), path, "float")
    if image.mode.startswith("I;16"):
        scale = 4095.0 if "I;12" in rawmodes else 65535.0
        return _grey_tensor(np.asarray(image, dtype=np.float64) / scale, path, "16-bit")
    if image.mode == "I":
        if (tiles and all(mode in _UNSIGNED_16 for mode in rawmodes)) or ppm_maxval > 255:
            return _grey_tensor(np.asarray(image, dtype=np.float64) / 65535.0, path, "16-bit")
        kind = ", ".join(sorted(set(rawmodes))) or "unknown"
        raise UserError(f"image file {path} has 32-bit or signed integer pixels (PIL raw mode {kind}), which have "
                        "no defined [0, 1] scale; save it as 8- or 16-bit unsigned, or as float in [0, 1]")
    deep = [mode for mode in rawmodes if _DEEP_TO_8_BIT.fullmatch(mode)]
    if deep or ppm_maxval > 255:
        depth = f"raw mode {deep[0]}" if deep else f"maximum value {ppm_maxval}"
        raise UserError(f"image file {path} has 16 bits per channel ({depth}), which PIL reads as 8 bits only; "
                        "convert it to 8 bits per channel (or, if it is grey, to 16-bit grey without alpha) first")
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # the same colours; converting directly warns about the alpha
    return image.convert("RGB")


def decoded_image_tensor(image: Image.Image, tiles: list[Any], where: str | os.PathLike) -> torch.Tensor:
    """A loaded PIL image (``tiles``: its tile list before loading) as float32 [C, H, W] in [0, 1] under the rules
    image files follow (UserError naming ``where`` otherwise). The server decodes request images with it."""
    return to_tensor(_to_rgb(image, tiles, where))


def _grey_tensor(values: np.ndarray, path: str | os.PathLike, kind: str) -> torch.Tensor:
    """A grey image [H, W] in [0, 1] as float32 RGB [3, H, W]; UserError for NaN/inf or values outside [0, 1]."""
    if not np.isfinite(values).all():
        raise UserError(f"image file {path} contains NaN or infinite pixel values")
    low, high = float(values.min()), float(values.max())
    if low < 0 or high > 1:
        raise UserError(f"{kind} image file {path} has pixel values in [{low:g}, {high:g}], outside [0, 1]")
    return torch.from_numpy(values.astype(np.float32)).expand(3, -1, -1).contiguous()


def to_tensor(image: Image.Image | torch.Tensor) -> torch.Tensor:
    """PIL images to float32 [C, H, W] in [0, 1]; tensors (high-depth images) pass through, clamped to [0, 1]."""
    if isinstance(image, torch.Tensor):
        return image.clamp(0, 1)
    return transforms.functional.to_tensor(image)


def common_size(paths: Sequence[str | os.PathLike]) -> tuple[int, int]:
    """The (width, height) shared by all images; UserError naming the first that differs."""
    first = _image_size(paths[0])
    for path in paths[1:]:
        size = _image_size(path)
        if size != first:
            raise UserError(f"image {path} is {size[0]}x{size[1]} but {paths[0]} is {first[0]}x{first[1]}; "
                            "give an image size to resize and crop all images")
    return first


def _image_size(path: str | os.PathLike) -> tuple[int, int]:
    """An image's (width, height) from its header."""
    try:
        with Image.open(path) as image:
            return image.size
    except Exception as exc:  # as in load_rgb
        raise UserError(f"cannot decode image file {path}: {one_line(exc)}") from None
