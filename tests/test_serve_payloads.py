"""Pixel checks of served images, without HTTP: one bad value anywhere in an image refuses it."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest

from dmae_fast.serve.config import Limits
from dmae_fast.serve.payloads import PayloadError, decode_image

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
