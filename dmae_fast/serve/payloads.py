"""Request bodies -> validated parameters and image tensors, or a 4xx naming the problem.

Two shapes of request (docs/serving.md): a JSON object (images as base64 PNG, JPEG or ``.npy`` files, or nested
``{"array": ...}``; parameters in the object), or a raw PNG, JPEG or ``.npy`` body (parameters in the query string).
Nothing from a payload is executed: ``.npy`` headers are parsed and the data read with ``np.frombuffer`` (no
pickles), pictures are decoded by PIL's PNG and JPEG decoders only, after their pixel count is checked against the
limit, and turned into [0, 1] tensors exactly as ``dmae-certify`` reads image files. The server does not resize."""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from dmae_fast.base.errors import UserError
from dmae_fast.base.messages import one_line
from dmae_fast.data import decoded_image_tensor
from dmae_fast.noise.grid import check_on_grid, quantize
from dmae_fast.noise.sound_options import Sound
from dmae_fast.serve.config import Defaults, Limits
from dmae_fast.stats.procedure import CERTIFY, PREDICT, PROCEDURES, ProcedureSpec

RAW_TYPES = ("image/png", "image/jpeg", "application/x-npy", "application/octet-stream")
PNG_MAGIC, JPEG_MAGIC, NPY_MAGIC = b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"\x93NUMPY"
FIELDS = {PREDICT: ("image", "images", "n", "alpha", "sound"),
          CERTIFY: ("image", "images", "n", "n0", "alpha", "sound")}
_DIGITS = re.compile(r"[0-9]{1,19}")
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")  # float() would also take 1_0, inf, nan
NPY_DTYPES = ("float16", "float32", "float64", "uint8")
# numpy parses a .npy header with ast.literal_eval, whose AST state CPython 3.11 shares between threads:
# two requests parsed at once can fail with "AST constructor recursion depth mismatch" (python/cpython#106905)
_HEADER_LOCK = threading.Lock()


class PayloadError(Exception):
    """A request the server will not run: ``status`` (4xx) and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class ParsedRequest:
    spec: ProcedureSpec  # what the request asks for, under the server's sigma
    images: list[torch.Tensor]  # float32 [C, H, W] in [0, 1], on the CPU: what is smoothed
    rounded: tuple[bool, ...] | None = None  # with --sound --quantize: which images rounding onto the grid changed


def _flagged(kind: str) -> dict[str, str]:
    """The request fields that ask for a procedure of ``kind``: field -> the procedure's key."""
    return {p.flag: p.key for p in PROCEDURES.values() if p.kind == kind and p.flag is not None}


def parse_request(kind: str, content_type: str | None, body: bytes, query: list[tuple[str, str]],
                  shape: tuple[int, ...], limits: Limits, defaults: Defaults, sigma: float,
                  sound: Sound | None = None) -> ParsedRequest:
    """Validate one request to /v1/predict (``kind`` PREDICT) or /v1/certify (CERTIFY); ``sound``: the
    server's ``--sound`` (its requests' images must be on the grid; a request's ``sound`` must match)."""
    media = (content_type or "").split(";")[0].strip().lower()
    allowed = FIELDS[kind] + tuple(_flagged(kind))  # and the fields that ask for one of the kind's procedures
    if media == "application/json":
        if query:
            raise PayloadError(400, "with a JSON body the parameters go in the JSON object, not the query string")
        document = _json_object(body)
        unknown = sorted(set(document) - set(allowed))
        if unknown:
            raise PayloadError(400, f"unknown field {unknown[0]!r} for /v1/{kind} (allowed: {', '.join(allowed)})")
        spec = _spec(kind, document, defaults, limits, sigma, sound, from_query=False)
        images = _json_images(document, shape, limits)
    elif media in RAW_TYPES:
        fields = dict(query)
        if len(fields) != len(query):
            raise PayloadError(400, "a query parameter is given twice")
        unknown = sorted(set(fields) - set(allowed) | set(fields) & {"image", "images"})
        if unknown:
            raise PayloadError(400, f"unknown query parameter {unknown[0]!r} for /v1/{kind} "
                               f"(allowed: {', '.join(f for f in allowed if not f.startswith('image'))})")
        spec = _spec(kind, fields, defaults, limits, sigma, sound, from_query=True)
        images = decode_image(body, "the body", shape, limits)
    else:
        problem = f"unsupported Content-Type {media!r}" if media else "missing Content-Type"
        raise PayloadError(415, f"{problem}: send application/json, image/png, image/jpeg or application/x-npy")
    samples = len(images) * (spec.n + (spec.n0 or 0))
    if samples > limits.max_request_samples:
        raise PayloadError(413, f"the request needs {samples:,} noisy samples; the limit is "
                           f"{limits.max_request_samples:,} per request (fewer images or a smaller n)")
    return ParsedRequest(spec, *served_images(images, sound))


def served_images(images: list[torch.Tensor],
                  sound: Sound | None) -> tuple[list[torch.Tensor], tuple[bool, ...] | None]:
    """The float32 images a server with ``sound`` smooths for the decoded ``images`` (float32 or float64, as sent):
    with ``--sound`` checked on the grid in their own dtype (422 off it), or with ``--quantize`` rounded onto it,
    and then which of them that changed (None without ``--quantize``)."""
    if sound is not None and sound.quantize:
        rounded = [quantize(image, sound.grid) for image in images]
        return rounded, tuple(not torch.equal(new, old.to(torch.float32)) for new, old in zip(rounded, images))
    if sound is not None:
        for number, image in enumerate(images):
            try:
                check_on_grid(image[None], sound.grid, "the request", first=number)
            except UserError as error:
                message = " ".join(str(error).replace("pass --quantize", "start dmae-serve with --quantize").split())
                raise PayloadError(422, message) from None
    return [image.to(torch.float32).contiguous() for image in images], None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    document = {}
    for key, value in pairs:
        if key in document:
            raise PayloadError(400, f"the JSON body has the key {_brief(json.dumps(key))} twice")
        document[key] = value
    return document


def _json_object(body: bytes) -> dict:
    try:
        document = json.loads(body, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise PayloadError(400, "the JSON body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise PayloadError(400, f"the body is not valid JSON: {one_line(error)}") from None
    if not isinstance(document, dict):
        raise PayloadError(400, f"the JSON body must be an object, got {type(document).__name__}")
    return document


def _spec(kind: str, fields: Mapping, defaults: Defaults, limits: Limits, sigma: float, sound: Sound | None,
          from_query: bool) -> ProcedureSpec:
    n = _integer(fields, "n", defaults.n, 1, limits.max_n, from_query)
    alpha = _alpha(fields, defaults.alpha, limits, from_query)
    n0 = _integer(fields, "n0", defaults.n0, 1, limits.max_n0, from_query) if kind == CERTIFY else None
    asked = {field: key for field, key in _flagged(kind).items() if _boolean(fields, field, from_query)}
    if len(asked) > 1:
        raise PayloadError(400, f"{' and '.join(asked)} each ask for another procedure; give at most one")
    if "sound" in fields and _boolean(fields, "sound", from_query) != (sound is not None):
        raise PayloadError(400, "this server answers every request with --sound; drop \"sound\": false" if sound
                           else "this server runs without --sound; restart dmae-serve with --sound for sound answers")
    return ProcedureSpec(kind, n, alpha, sigma, n0, name=next(iter(asked.values()), None), sound=sound is not None)


def _integer(fields: Mapping, name: str, default: int, low: int, high: int, from_query: bool) -> int:
    if name not in fields:
        return default
    value = fields[name]
    if from_query:
        if not _DIGITS.fullmatch(value):
            raise PayloadError(400, f"{name} must be a whole number, got {value[:40]!r}")
        value = int(value)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise PayloadError(400, f"{name} must be a whole number, got {_brief(json.dumps(value))}")
    if not low <= value <= high:
        raise PayloadError(400, f"{name} must be in [{low}, {high:,}] on this server, got {_brief(str(value))}")
    return value


def _alpha(fields: Mapping, default: float, limits: Limits, from_query: bool) -> float:
    if "alpha" not in fields:
        return default
    value = fields["alpha"]
    if from_query:
        if not _DECIMAL.fullmatch(value):
            raise PayloadError(400, f"alpha must be a decimal number such as 0.001, got {_brief(repr(value))}")
        value = float(value)
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PayloadError(400, f"alpha must be a number, got {_brief(json.dumps(value))}")
    if not limits.min_alpha <= value <= limits.max_alpha:  # compares exactly: an int of any size, NaN, inf
        raise PayloadError(400, f"alpha must be in [{limits.min_alpha:g}, {limits.max_alpha:g}] on this server, "
                           f"got {_brief(str(value))}")
    return float(value)


def _boolean(fields: Mapping, name: str, from_query: bool) -> bool:
    value = fields.get(name, False)
    if from_query and value in ("true", "false", "1", "0"):
        return value in ("true", "1")
    if isinstance(value, bool):
        return value
    raise PayloadError(400, f"{name} must be true or false, got {str(value)[:40]!r}")


def _json_images(document: dict, shape: tuple[int, ...], limits: Limits) -> list[torch.Tensor]:
    if ("image" in document) == ("images" in document):
        raise PayloadError(400, "give exactly one of 'image' (one image) and 'images' (a list)")
    if "image" in document:
        items = [("image", document["image"])]
    else:
        listed = document["images"]
        if not isinstance(listed, list) or not listed:
            raise PayloadError(400, "'images' must be a non-empty list")
        if len(listed) > limits.max_images:
            raise PayloadError(413, f"{len(listed)} images in one request; the limit is {limits.max_images}")
        items = [(f"images[{i}]", item) for i, item in enumerate(listed)]
    images = []
    for where, item in items:
        if isinstance(item, str):
            try:
                data = base64.b64decode(item, validate=True)
            except (binascii.Error, ValueError):
                raise PayloadError(400, f"{where} is not valid base64") from None
            images += decode_image(data, where, shape, limits)
        elif isinstance(item, dict) and set(item) == {"array"}:
            images.append(_checked(_nested_array(item["array"], where), where, shape))
        else:
            raise PayloadError(400, f"{where} must be a base64 string (PNG, JPEG or .npy) or {{\"array\": [...]}}")
        if len(images) > limits.max_images:
            raise PayloadError(413, f"more than {limits.max_images} images in one request")
    return images


def decode_image(data: bytes, where: str, shape: tuple[int, ...], limits: Limits) -> list[torch.Tensor]:
    """The images in one PNG, JPEG or .npy file (a 4-D .npy array holds several): float64 for a float64
    .npy file, else float32 (:func:`served_images` gives what is smoothed)."""
    if data.startswith(NPY_MAGIC):
        return _npy_images(data, where, shape, limits)
    if data.startswith(PNG_MAGIC) or data.startswith(JPEG_MAGIC):
        return [_checked(_picture(data, where, shape, limits), where, shape)]
    raise PayloadError(415, f"{where} is not a PNG, JPEG or .npy file")


def _picture(data: bytes, where: str, shape: tuple[int, ...], limits: Limits) -> torch.Tensor:
    if shape[0] != 3:
        raise PayloadError(422, f"the classifier takes {shape[0]}-channel images; send {where} as a .npy array")
    try:
        with Image.open(io.BytesIO(data), formats=("PNG", "JPEG")) as image:
            width, height = image.size
            if width * height > limits.max_image_pixels:
                raise PayloadError(413, f"{where} is {width}x{height} pixels; the limit is "
                                   f"{limits.max_image_pixels:,} pixels")
            if (height, width) != tuple(shape[1:]):
                raise PayloadError(422, f"{where} is {width}x{height}; the classifier takes {shape[2]}x{shape[1]} "
                                   "images (resize and crop it first)")
            tiles = list(getattr(image, "tile", None) or [])
            image.load()
            return decoded_image_tensor(image, tiles, where)
    except PayloadError:
        raise
    except Image.DecompressionBombError as error:  # PIL's own limit, above ours, checked while opening
        raise PayloadError(413, f"{where}: {one_line(error)}") from None
    except UserError as error:  # decoded, but not an image dmae-certify would read (e.g. 16-bit colour)
        raise PayloadError(422, " ".join(str(error).replace("image file ", "").split())) from None
    except Exception as error:  # noqa: BLE001 (PIL fails on corrupt data in many ways)
        message = one_line(error).replace("image file ", "")
        raise PayloadError(400, f"cannot decode {where}: {message}") from None


def _npy_images(data: bytes, where: str, shape: tuple[int, ...], limits: Limits) -> list[torch.Tensor]:
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read_header:
            raise ValueError(f"unsupported .npy version {version}")
        with _HEADER_LOCK:
            array_shape, fortran, dtype = read_header[version](stream)
    except Exception as error:  # noqa: BLE001 (numpy's header parser fails in many ways; it never executes)
        raise PayloadError(400, f"{where} is not a valid .npy file: {one_line(error)}") from None
    if not all(type(size) is int and size >= 0 for size in array_shape):  # numpy takes -8 and True
        raise PayloadError(400, f"{where} is not a valid .npy file: its shape {array_shape} has a dimension "
                           "that is not a whole number >= 0")
    if dtype.name not in NPY_DTYPES or dtype.hasobject:
        raise PayloadError(400, f"{where} has dtype {dtype}; send float16/32/64 values in [0, 1] or uint8")
    if len(array_shape) not in (3, 4):
        raise PayloadError(422, f"{where} has shape {array_shape}; send [C, H, W] or [N, C, H, W] with "
                           f"[C, H, W] = {list(shape)}")
    count = math.prod(array_shape)
    if count == 0:
        raise PayloadError(400, f"{where} has shape {array_shape}: it holds no image")
    if len(array_shape) == 4 and array_shape[0] > limits.max_images:
        raise PayloadError(413, f"{where} holds {array_shape[0]} images; the limit is {limits.max_images}")
    if math.prod(array_shape[-2:]) > limits.max_image_pixels:
        raise PayloadError(413, f"{where} has {array_shape[-1]}x{array_shape[-2]} pixels; the limit is "
                           f"{limits.max_image_pixels:,}")
    if count * dtype.itemsize != len(data) - stream.tell():
        raise PayloadError(400, f"{where}: the .npy header says {array_shape} {dtype} ({count * dtype.itemsize:,} "
                           f"bytes) but {len(data) - stream.tell():,} bytes follow it")
    array = np.frombuffer(data, dtype=dtype, count=count, offset=stream.tell())
    array = array.reshape(array_shape, order="F" if fortran else "C")
    exact = np.float64 if dtype == np.float64 else np.float32  # float64 kept until the grid check
    values = array.astype(np.float32) / 255 if dtype == np.uint8 else array.astype(exact)
    stack = values[None] if values.ndim == 3 else values
    names = [where] if values.ndim == 3 else [f"{where}[{i}]" for i in range(len(stack))]
    return [_checked(torch.from_numpy(np.ascontiguousarray(image)), name, shape) for image, name in zip(stack, names)]


def _nested_array(value: object, where: str) -> torch.Tensor:
    try:
        array = np.array(value)
    except (ValueError, TypeError, RecursionError):
        raise PayloadError(400, f"{where}['array'] is not a rectangular array of numbers") from None
    if array.dtype.kind not in "iuf":
        raise PayloadError(400, f"{where}['array'] must hold numbers only")
    return torch.from_numpy(array.astype(np.float64))  # JSON numbers are doubles; checked as such


def _checked(image: torch.Tensor, where: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The classifier's shape, finite, in [0, 1]."""
    if tuple(image.shape) != tuple(shape):
        raise PayloadError(422, f"{where} has shape {list(image.shape)}; the classifier takes {list(shape)} "
                           "([C, H, W])")
    low, high = (float(value) for value in torch.aminmax(image))  # NaN and infinities show in these
    if not (math.isfinite(low) and math.isfinite(high)):
        raise PayloadError(422, f"{where} contains NaN or infinite pixel values")
    if low < 0 or high > 1:
        raise PayloadError(422, f"{where} has pixel values in [{low:g}, {high:g}]; they must be in [0, 1]")
    return image.contiguous()


def _brief(text: str) -> str:
    return text if len(text) <= 40 else text[:40] + "..."
