"""Pixel checks of served images, without HTTP: one bad value anywhere in an image refuses it, and on a
``--sound`` server one pixel off the grid, however little."""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest
import torch

from dmae_fast.noise.sound_options import Sound
from dmae_fast.serve.config import Defaults, Limits
from dmae_fast.serve.payloads import ParsedRequest, PayloadError, decode_image, parse_request
from dmae_fast.stats.procedure import CERTIFY

SHAPE = (3, 8, 8)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.parametrize("position", [0, 77, 3 * 8 * 8 - 1])
@pytest.mark.parametrize(("value", "message"), [(np.nan, "NaN or infinite"), (np.inf, "NaN or infinite"),
                                                (-np.inf, "NaN or infinite"), (1.0000001, "[0, 1]"),
                                                (-1e-9, "[0, 1]")])
def test_one_bad_pixel_refuses_the_image(position, value, message):
    image = np.random.default_rng(position).random(SHAPE, dtype=np.float32)
    image.flat[position] = value
    with pytest.raises(PayloadError, match=re.escape(message)) as refused:
        decode_image(_npy(image), "image 0", SHAPE, Limits())
    assert refused.value.status == 422


def test_a_valid_image_is_accepted_unchanged():
    image = np.random.default_rng(1).random(SHAPE, dtype=np.float32)
    image[0, 0, 0], image[2, 7, 7] = 0.0, 1.0
    (decoded,) = decode_image(_npy(image), "image 0", SHAPE, Limits())
    assert np.array_equal(decoded.numpy(), image)



def _formats(array: np.ndarray) -> list[tuple[str, bytes]]:
    """One float64 image in each request format: a raw .npy body, base64 .npy in JSON, a JSON array."""
    npy = _npy(array)
    return [("application/x-npy", npy),
            ("application/json", json.dumps({"image": base64.b64encode(npy).decode()}).encode()),
            ("application/json", json.dumps({"image": {"array": array.tolist()}}).encode())]


def _parsed(media: str, body: bytes, sound: Sound) -> ParsedRequest:
    return parse_request(CERTIFY, media, body, [], SHAPE, Limits(), Defaults(), 0.25, sound)


@pytest.mark.parametrize("steps", [5e-4, 9e-4, 1e-6])
def test_a_float64_pixel_just_off_the_grid_is_refused_in_every_format(steps):
    """Checked as sent (float64), in every format; under --quantize rounded, and said so."""
    on_grid = np.random.default_rng(2).integers(0, 17, SHAPE) / 16
    off = on_grid.copy()
    off[1, 2, 3] += steps / 16 if off[1, 2, 3] < 1 else -steps / 16
    for media, body in _formats(off):
        with pytest.raises(PayloadError, match=re.escape("image 0 of the request is not on the 1/16 grid")) as refused:
            _parsed(media, body, Sound(16))
        assert refused.value.status == 422 and "\n" not in refused.value.message
        rounded = _parsed(media, body, Sound(16, quantize=True))
        assert rounded.rounded == (True,) and rounded.images[0].dtype == torch.float32
        assert np.array_equal(rounded.images[0].numpy(), on_grid.astype(np.float32))
    for media, body in _formats(on_grid):
        accepted = _parsed(media, body, Sound(16))
        assert accepted.rounded is None and np.array_equal(accepted.images[0].numpy(), on_grid.astype(np.float32))
        assert _parsed(media, body, Sound(16, quantize=True)).rounded == (False,)
