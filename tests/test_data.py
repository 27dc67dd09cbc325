"""Tests for dmae_fast.data: every source, the pickle guard and every user-error case."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from dmae_fast.base.errors import UserError
from dmae_fast.data import (
    DEMO,
    TensorImageDataset,
    check_finite,
    cifar10,
    demo_digits,
    image_folder,
    image_list,
    open_dataset,
    subset_indices,
)
from dmae_fast.data.cifar import CIFAR_META, CIFAR_SUBDIR, CIFAR_TEST_BATCH, CIFAR_TRAIN_BATCHES


def raises_user_error(call: Callable[[], object], *mentions: object) -> str:
    """Run ``call``, expect a one-line UserError that mentions every item of ``mentions``."""
    with pytest.raises(UserError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for item in mentions:
        assert str(item) in message
    return message


def write_png(path: Path, pixels: np.ndarray) -> Path:
    """Write a uint8 HxW or HxWx3 array as a PNG, creating parent folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


def solid(height: int, width: int, rgb: tuple[int, int, int]) -> np.ndarray:
    return np.broadcast_to(np.array(rgb, dtype=np.uint8), (height, width, 3)).copy()


def random_pixels(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


# --------------------------------------------------------------------------- demo


def test_demo_splits_partition_the_digits() -> None:
    from sklearn.datasets import load_digits

    train, test = demo_digits("train"), demo_digits("test")
    assert (len(train), len(test)) == (1297, 500)

    def rows(images: np.ndarray, labels: np.ndarray) -> list[tuple]:
        """Each (image, label) as one sortable tuple."""
        flat = images.reshape(len(images), -1)
        return sorted(tuple(row) + (int(y),) for row, y in zip(flat.tolist(), labels.tolist()))

    digits = load_digits()
    everything = rows((digits.images / 16).astype(np.float32), digits.target)
    combined = rows(
        torch.cat([train.images, test.images])[:, 0].numpy(), torch.cat([train.labels, test.labels]).numpy()
    )
    assert combined == everything  # disjoint and covering

    perm = np.random.default_rng(0).permutation(1797)
    assert torch.equal(test.labels, torch.from_numpy(digits.target[perm[:500]]))
    # the embedded file is scikit-learn's digits, in its order, to the last value
    assert torch.equal(test.images[:, 0], torch.from_numpy((digits.images[perm[:500]] / 16.0).astype(np.float32)))


def test_demo_images_and_metadata() -> None:
    test = demo_digits("test")
    image, label = test[0]
    assert image.dtype == torch.float32 and image.shape == (3, 8, 8)
    assert isinstance(label, int) and 0 <= label <= 9
    assert torch.equal(image[0], image[1]) and torch.equal(image[0], image[2])
    assert test.images.min() >= 0 and test.images.max() == 1
    assert test.num_classes == 10
    assert test.class_names == [str(d) for d in range(10)]
    assert test.image_shape == (3, 8, 8)


def test_demo_is_deterministic_and_checks_split() -> None:
    first, second = demo_digits("train"), demo_digits("train")
    assert torch.equal(first.images, second.images) and torch.equal(first.labels, second.labels)
    assert isinstance(open_dataset(DEMO, split="test"), TensorImageDataset)
    raises_user_error(lambda: demo_digits("val"), "val")


# --------------------------------------------------------------------------- CIFAR-10


def write_batch(path: Path, data: np.ndarray, labels: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        pickle.dump({b"batch_label": b"fake", b"data": data, b"labels": labels, b"filenames": []}, file, protocol=2)


def write_cifar(directory: Path, per_batch: int = 4, meta: bool = True) -> None:
    """Fake CIFAR-10 batches; batch ``k`` has labels ``k, k+1, ...`` (mod 10)."""
    rng = np.random.default_rng(1)
    for k, name in enumerate((*CIFAR_TRAIN_BATCHES, CIFAR_TEST_BATCH)):
        pixels = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        write_batch(directory / name, pixels, [(k + i) % 10 for i in range(per_batch)])
    if meta:
        names = [f"class{i}".encode() for i in range(10)]
        with open(directory / CIFAR_META, "wb") as file:
            pickle.dump({b"label_names": names, b"num_vis": 3072}, file, protocol=2)


def test_cifar_pixel_layout_is_channel_major(tmp_path: Path) -> None:
    pixels = np.zeros((2, 3072), dtype=np.uint8)
    pixels[1, 1 * 1024 + 3 * 32 + 5] = 200  # image 1, channel G, row 3, column 5
    write_batch(tmp_path / "test_batch", pixels, [7, 2])
    dataset = cifar10(tmp_path)
    image, label = dataset[1]
    assert image.dtype == torch.float32 and image.shape == (3, 32, 32)
    assert image[1, 3, 5].item() == pytest.approx(200 / 255, abs=1e-7)
    assert image.sum().item() == pytest.approx(200 / 255, abs=1e-6)
    assert label == 2 and dataset[0][1] == 7
    assert dataset.num_classes == 8 and dataset.class_names is None
    assert dataset.image_shape == (3, 32, 32)


def test_cifar_splits_meta_and_subfolder(tmp_path: Path) -> None:
    write_cifar(tmp_path / CIFAR_SUBDIR)
    test = open_dataset(str(tmp_path))
    train = open_dataset(str(tmp_path), split="train")
    assert (len(train), len(test)) == (20, 4)
    assert [train[i][1] for i in (0, 4, 19)] == [0, 1, 7]
    assert [label for _, label in test] == [5, 6, 7, 8]
    assert test.class_names == [f"class{i}" for i in range(10)] and test.num_classes == 10
    assert 0 <= float(train.images.min()) and float(train.images.max()) <= 1


def test_cifar_refuses_malicious_pickle(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"echo pwned > {marker}",))

    with open(tmp_path / "test_batch", "wb") as file:
        pickle.dump({b"data": Exploit(), b"labels": [0]}, file, protocol=2)
    message = raises_user_error(lambda: cifar10(tmp_path), "refuses to unpickle", "system", tmp_path / "test_batch")
    assert "os.system" in message or "posix.system" in message
    assert not marker.exists()


def test_cifar_errors_name_the_file(tmp_path: Path) -> None:
    write_cifar(tmp_path, meta=False)
    (tmp_path / "data_batch_3").unlink()
    raises_user_error(lambda: cifar10(tmp_path, "train"), tmp_path / "data_batch_3")

    (tmp_path / "test_batch").write_bytes(b"definitely not a pickle")
    raises_user_error(lambda: cifar10(tmp_path), tmp_path / "test_batch")

    write_batch(tmp_path / "test_batch", np.zeros((2, 100), dtype=np.uint8), [0, 1])
    raises_user_error(lambda: cifar10(tmp_path), tmp_path / "test_batch", "data")

    write_batch(tmp_path / "test_batch", np.zeros((2, 3072), dtype=np.uint8), [0])
    raises_user_error(lambda: cifar10(tmp_path), tmp_path / "test_batch", "labels")

    raises_user_error(lambda: cifar10(tmp_path / "elsewhere"), tmp_path / "elsewhere")


def test_cifar_labels_beyond_meta_names(tmp_path: Path) -> None:
    write_batch(tmp_path / "test_batch", np.zeros((1, 3072), dtype=np.uint8), [3])
    with open(tmp_path / CIFAR_META, "wb") as file:
        pickle.dump({b"label_names": [b"a", b"b"]}, file, protocol=2)
    raises_user_error(lambda: cifar10(tmp_path), tmp_path / CIFAR_META)


# --------------------------------------------------------------------------- image folders


def test_image_folder_labels_shapes_values(tmp_path: Path) -> None:
    write_png(tmp_path / "cat" / "a.png", solid(10, 12, (255, 0, 128)))
    write_png(tmp_path / "dog" / "b.png", solid(16, 9, (0, 51, 0)))
    write_png(tmp_path / "dog" / "c.png", np.full((9, 9), 255, dtype=np.uint8))  # grayscale
    dataset = image_folder(tmp_path, 8)
    assert dataset.class_names == ["cat", "dog"] and dataset.num_classes == 2
    assert dataset.image_shape == (3, 8, 8) and len(dataset) == 3
    assert [label for _, label in dataset] == [0, 1, 1]
    image, _ = dataset[0]
    assert image.dtype == torch.float32 and image.shape == (3, 8, 8)
    expected = torch.tensor([1.0, 0.0, 128 / 255]).view(3, 1, 1).expand(3, 8, 8)
    assert torch.allclose(image, expected, atol=1e-6)
    assert torch.allclose(dataset[2][0], torch.ones(3, 8, 8))

    opened = open_dataset(str(tmp_path), image_size=8)
    assert len(opened) == 3 and opened.image_shape == (3, 8, 8)


def test_image_folder_needs_size_and_decodable_images(tmp_path: Path) -> None:
    write_png(tmp_path / "cat" / "a.png", solid(8, 8, (1, 2, 3)))
    raises_user_error(lambda: open_dataset(str(tmp_path)), tmp_path)

    broken = tmp_path / "cat" / "broken.png"
    broken.write_bytes(b"not a png")
    dataset = open_dataset(str(tmp_path), image_size=8)
    raises_user_error(lambda: dataset[1], broken)


def test_image_folder_with_empty_class(tmp_path: Path) -> None:
    write_png(tmp_path / "cat" / "a.png", solid(8, 8, (1, 2, 3)))
    (tmp_path / "dog").mkdir()
    raises_user_error(lambda: open_dataset(str(tmp_path), image_size=8), tmp_path)


# --------------------------------------------------------------------------- image lists


def test_image_list_file_exact_pixels(tmp_path: Path) -> None:
    first = random_pixels(5, 6, seed=0)
    write_png(tmp_path / "imgs" / "one.png", first)
    write_png(tmp_path / "imgs" / "with space.png", random_pixels(5, 6, seed=1))
    absolute = write_png(tmp_path / "abs" / "three.png", np.zeros((5, 6), dtype=np.uint8))
    listing = tmp_path / "list.txt"
    listing.write_text(f"# comment\n\nimgs/one.png 3\nimgs/with space.png\t0\n{absolute} 1\n")

    dataset = open_dataset(str(listing))
    assert len(dataset) == 3 and dataset.image_shape == (3, 5, 6)
    assert [label for _, label in dataset] == [3, 0, 1]
    assert dataset.num_classes == 4 and dataset.class_names is None
    image, _ = dataset[0]
    assert image.dtype == torch.float32
    assert torch.equal(image, torch.from_numpy(first).permute(2, 0, 1).float() / 255)
    assert torch.equal(dataset[2][0], torch.zeros(3, 5, 6))


def test_image_list_csv_resized(tmp_path: Path) -> None:
    write_png(tmp_path / "a.png", solid(20, 30, (0, 255, 0)))
    write_png(tmp_path / "b.png", solid(7, 7, (0, 0, 255)))
    listing = tmp_path / "list.csv"
    listing.write_text("a.png,1\nb.png, 2\n")
    dataset = image_list(listing, 4)
    assert dataset.image_shape == (3, 4, 4)
    image, label = dataset[0]
    assert label == 1 and image.shape == (3, 4, 4)
    assert torch.allclose(image, torch.tensor([0.0, 1.0, 0.0]).view(3, 1, 1).expand(3, 4, 4))


def test_image_directory_with_labels_file(tmp_path: Path) -> None:
    images = tmp_path / "images"
    write_png(images / "x.png", solid(4, 4, (10, 20, 30)))
    write_png(images / "y.png", solid(4, 4, (40, 50, 60)))
    labels = tmp_path / "labels"
    labels.write_text("y.png 5\nx.png 2\n")
    dataset = open_dataset(str(images), labels=str(labels))
    assert [label for _, label in dataset] == [5, 2]
    assert dataset.num_classes == 6 and dataset.image_shape == (3, 4, 4)
    assert dataset[1][0][:, 0, 0].tolist() == pytest.approx([10 / 255, 20 / 255, 30 / 255])
    raises_user_error(lambda: image_list(images, None), images)


def test_image_list_sizes_must_agree_without_image_size(tmp_path: Path) -> None:
    write_png(tmp_path / "a.png", solid(4, 4, (0, 0, 0)))
    write_png(tmp_path / "b.png", solid(4, 4, (0, 0, 0)))
    write_png(tmp_path / "c.png", solid(5, 4, (0, 0, 0)))
    listing = tmp_path / "list.txt"
    listing.write_text("a.png 0\nb.png 0\nc.png 1\n")
    message = raises_user_error(lambda: open_dataset(str(listing)), tmp_path / "c.png")
    assert "b.png" not in message
    assert open_dataset(str(listing), image_size=4).image_shape == (3, 4, 4)


@pytest.mark.parametrize(
    "line, mention",
    [("a.png -1", "-1"), ("a.png cat", "cat"), ("a.png", "a.png"), ("missing.png 0", "missing.png"),
     ("a.png \u00b2", "\u00b2"),  # was: a ValueError traceback
     ("a.png \u0663", "\u0663"),  # Arabic-Indic 3: was silently read as label 3
     ("a.png 1.0", "1.0"), ("a.png 0x1", "0x1"), ("a.png +1", "+1")],
)
def test_image_list_bad_lines(tmp_path: Path, line: str, mention: str) -> None:
    write_png(tmp_path / "a.png", solid(4, 4, (0, 0, 0)))
    listing = tmp_path / "list.txt"
    listing.write_text(f"a.png 0\n{line}\n")
    raises_user_error(lambda: open_dataset(str(listing)), f"{listing}:2", mention)


def test_image_list_undecodable_image(tmp_path: Path) -> None:
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG garbage")
    listing = tmp_path / "list.txt"
    listing.write_text("broken.png 0\n")
    raises_user_error(lambda: open_dataset(str(listing)), broken)
    dataset = open_dataset(str(listing), image_size=4)
    raises_user_error(lambda: dataset[0], broken)


# --------------------------------------------------------------------------- open_dataset errors


def test_missing_path(tmp_path: Path) -> None:
    raises_user_error(lambda: open_dataset(str(tmp_path / "nope")), tmp_path / "nope", "does not exist")


def test_labels_for_the_demo_are_refused_not_ignored(tmp_path: Path) -> None:
    raises_user_error(lambda: open_dataset("demo", labels=str(tmp_path / "labels.txt")), "--data demo has its own")


def test_unreadable_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    raises_user_error(lambda: open_dataset(str(locked)), locked, "not readable")


def test_directory_without_layout(tmp_path: Path) -> None:
    write_png(tmp_path / "a.png", solid(4, 4, (0, 0, 0)))
    message = raises_user_error(lambda: open_dataset(str(tmp_path)), tmp_path)
    assert "CIFAR-10" in message and "class subfolders" in message and "labels" in message


def test_empty_list_file(tmp_path: Path) -> None:
    listing = tmp_path / "list.txt"
    listing.write_text("# nothing here\n\n")
    raises_user_error(lambda: open_dataset(str(listing)), listing, "empty")


def test_unusable_files(tmp_path: Path) -> None:
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\x00")
    raises_user_error(lambda: open_dataset(str(other)), other)

    binary = tmp_path / "list.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    raises_user_error(lambda: open_dataset(str(binary)), binary)

    binary.write_text("")
    raises_user_error(lambda: open_dataset(str(binary), labels=str(binary)), binary)


# --------------------------------------------------------------------------- selection


def test_subset_indices() -> None:
    assert subset_indices(10, 3, None) == [0, 3, 6, 9]
    assert subset_indices(10, 3, 2) == [0, 3]
    assert subset_indices(3, 1, 100) == [0, 1, 2]
    assert subset_indices(0, 5, None) == []
    assert len(subset_indices(50_000, 50, None)) == 1000
    raises_user_error(lambda: subset_indices(10, 0, None), "skip")
    raises_user_error(lambda: subset_indices(10, 1, 0), "max_images")


def test_check_finite() -> None:
    check_finite(torch.rand(3, 4, 4), 0)
    for bad in (float("nan"), float("inf"), float("-inf")):
        image = torch.zeros(3, 4, 4)
        image[1, 2, 3] = bad
        raises_user_error(lambda: check_finite(image, 17), "image 17", "NaN or infinite")


# --------------------------------------------------------------------------- pixels at full precision


def png_chunk(kind: bytes, body: bytes) -> bytes:
    import struct
    import zlib

    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def write_png16_rgb(path: Path, pixels: np.ndarray) -> Path:
    """A 16-bit PNG written by hand (PIL cannot write colour or grey+alpha ones): uint16
    [H, W, 3] (colour) or [H, W, 2] (grey + alpha)."""
    import struct
    import zlib

    height, width, channels = pixels.shape
    raw = b"".join(b"\x00" + pixels[y].astype(">u2").tobytes() for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 16, {2: 4, 3: 2}[channels], 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", zlib.compress(raw))
                     + png_chunk(b"IEND", b""))
    return path


def _list_of(tmp_path: Path, name: str) -> Path:
    listing = tmp_path / "list.txt"
    listing.write_text(f"{name} 0\n")
    return listing


def test_16_bit_grey_png_keeps_its_precision(tmp_path: Path) -> None:
    """Was: clipped to 8 bits by PIL's convert('RGB') (every value above 255 became 255)."""
    values = (np.arange(64, dtype=np.int64).reshape(8, 8) * 1000 + 7).astype(np.uint16)
    Image.fromarray(values).save(tmp_path / "deep.png")
    image, _ = open_dataset(str(_list_of(tmp_path, "deep.png")))[0]
    assert image.shape == (3, 8, 8) and image.dtype == torch.float32
    expected = torch.from_numpy(values.astype(np.float64) / 65535).float()
    assert all(torch.equal(image[c], expected) for c in range(3))
    resized, _ = open_dataset(str(_list_of(tmp_path, "deep.png")), image_size=4)[0]  # the eval transform too
    assert resized.shape == (3, 4, 4) and 0 < float(resized.max()) <= 1 and float(resized.std()) > 0.1


def test_16_bit_colour_png_is_refused_not_quantized(tmp_path: Path) -> None:
    """PIL 13 opens a 16-bit RGB PNG as mode "RGB" (raw mode "RGB;16B"): 8 bits per channel."""
    pixels = np.zeros((4, 4, 3), np.uint16)
    pixels[..., 0] = 60000
    write_png16_rgb(tmp_path / "colour16.png", pixels)
    assert Image.open(tmp_path / "colour16.png").mode == "RGB"
    dataset = open_dataset(str(_list_of(tmp_path, "colour16.png")), image_size=4)
    raises_user_error(lambda: dataset[0], "colour16.png", "16 bits per channel", "RGB;16B")


def test_float_tiff_is_read_as_is(tmp_path: Path) -> None:
    values = np.linspace(0, 1, 36, dtype=np.float32).reshape(6, 6)
    Image.fromarray(values, mode="F").save(tmp_path / "float.tiff")
    image, _ = open_dataset(str(_list_of(tmp_path, "float.tiff")))[0]
    assert torch.equal(image[1], torch.from_numpy(values))


@pytest.mark.parametrize(("value", "mention"), [(np.nan, "NaN or infinite"), (np.inf, "NaN or infinite"),
                                                (-np.inf, "NaN or infinite"), (1.5, "outside [0, 1]"),
                                                (-0.25, "outside [0, 1]")])
def test_float_tiff_with_bad_pixels_is_refused(tmp_path: Path, value: float, mention: str) -> None:
    """Was: NaN/inf converted to finite values by convert('RGB') and certified."""
    values = np.full((6, 6), 0.5, np.float32)
    values[2, 3] = value
    Image.fromarray(values, mode="F").save(tmp_path / "bad.tiff")
    dataset = open_dataset(str(_list_of(tmp_path, "bad.tiff")), image_size=6)
    raises_user_error(lambda: dataset[0], "bad.tiff", mention)


@pytest.mark.parametrize("mode", ["L", "P", "RGBA", "LA", "CMYK", "1"])
def test_8_bit_modes_convert_to_rgb(tmp_path: Path, mode: str) -> None:
    rgb = Image.fromarray(random_pixels(5, 5, seed=3))
    rgb.convert(mode).save(tmp_path / ("image.tiff" if mode == "CMYK" else "image.png"))
    name = "image.tiff" if mode == "CMYK" else "image.png"
    image, _ = open_dataset(str(_list_of(tmp_path, name)))[0]
    expected = torch.from_numpy(np.array(Image.open(tmp_path / name).convert("RGB"))).permute(2, 0, 1) / 255
    assert image.shape == (3, 5, 5) and torch.equal(image, expected.float())


@pytest.mark.parametrize("size", [0, -4])
def test_image_size_below_one_is_refused(tmp_path: Path, size: int) -> None:
    write_png(tmp_path / "a.png", solid(4, 4, (0, 0, 0)))
    raises_user_error(lambda: open_dataset(str(_list_of(tmp_path, "a.png")), image_size=size), "image size")
    (tmp_path / "cls").mkdir()
    write_png(tmp_path / "cls" / "a.png", solid(4, 4, (0, 0, 0)))
    raises_user_error(lambda: image_folder(str(tmp_path), size), "image size")


def test_empty_and_truncated_image_files(tmp_path: Path) -> None:
    (tmp_path / "empty.png").write_bytes(b"")
    raises_user_error(lambda: open_dataset(str(_list_of(tmp_path, "empty.png"))), "empty.png")
    write_png(tmp_path / "whole.png", random_pixels(16, 16, seed=1))
    (tmp_path / "cut.png").write_bytes((tmp_path / "whole.png").read_bytes()[:60])
    dataset = open_dataset(str(_list_of(tmp_path, "cut.png")), image_size=8)
    raises_user_error(lambda: dataset[0], "cut.png")
    Image.fromarray(random_pixels(16, 16, seed=2)).save(tmp_path / "whole.jpg", quality=90)
    (tmp_path / "cut.jpg").write_bytes((tmp_path / "whole.jpg").read_bytes()[:300])
    dataset = open_dataset(str(_list_of(tmp_path, "cut.jpg")), image_size=8)
    raises_user_error(lambda: dataset[0], "cut.jpg", "truncated")


def test_a_listed_directory_is_not_an_image(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    raises_user_error(lambda: open_dataset(str(_list_of(tmp_path, "sub"))), "sub", "directory")


def test_label_file_that_is_not_utf8(tmp_path: Path) -> None:
    write_png(tmp_path / "a.png", solid(4, 4, (0, 0, 0)))
    labels = tmp_path / "labels.txt"
    labels.write_bytes(b"a.png \xff\xfe\n")
    raises_user_error(lambda: open_dataset(str(tmp_path), labels=str(labels)), "labels.txt")


# --------------------------------------------------------------------------- hostile inputs


def write_tiff(path: Path, pixels: np.ndarray, bits: int, sample_format: int = 1) -> Path:
    """An uncompressed one-strip grey little-endian TIFF written by hand (PIL cannot write
    12-bit, 16-bit colour or signed ones): ``pixels`` [H, W] (12 bits: packed 2 per 3 bytes)
    or [H, W, 3]; ``sample_format`` 1 unsigned, 2 signed."""
    import struct

    height, width = pixels.shape[:2]
    channels = 1 if pixels.ndim == 2 else pixels.shape[2]
    if bits == 12:
        flat, body = pixels.ravel().astype(int), bytearray()
        for a, b in zip(flat[0::2], flat[1::2]):
            body += bytes([a >> 4, ((a & 15) << 4) | (b >> 8), b & 255])
        body = bytes(body)
    else:
        kind = "i" if sample_format == 2 else "u"
        body = pixels.astype(f"<{kind}{bits // 8}").tobytes()
    entries = [(256, width), (257, height), (258, bits), (259, 1), (262, 2 if channels == 3 else 1),
               (273, None), (277, channels), (278, height), (279, len(body)), (339, sample_format)]
    offset = 8 + 2 + 12 * len(entries) + 4
    ifd = struct.pack("<H", len(entries))
    for tag, value in entries:
        if tag == 273:
            ifd += struct.pack("<HHII", tag, 4, 1, offset)
        elif tag == 279:
            ifd += struct.pack("<HHII", tag, 4, 1, value)
        else:
            ifd += struct.pack("<HHIHH", tag, 3, 1, value, 0)
    path.write_bytes(b"II*\x00" + struct.pack("<I", 8) + ifd + b"\x00" * 4 + body)
    return path


def first_image(tmp_path: Path, name: str, image_size: int | None = None) -> torch.Tensor:
    return open_dataset(str(_list_of(tmp_path, name)), image_size=image_size)[0][0]


def test_12_bit_tiff_is_scaled_by_4095(tmp_path: Path) -> None:
    """PIL opens a 12-bit TIFF as mode I;16 holding 0..4095; was: divided by 65535 (16x too dark)."""
    values = (np.arange(16).reshape(4, 4) * 273).astype(np.uint16)  # 0 .. 4095
    write_tiff(tmp_path / "twelve.tiff", values, 12)
    assert Image.open(tmp_path / "twelve.tiff").mode == "I;16"
    image = first_image(tmp_path, "twelve.tiff")
    assert torch.equal(image[2], torch.from_numpy(values / 4095).float()) and float(image.max()) == 1.0


def test_16_bit_pgm_is_read_at_full_precision(tmp_path: Path) -> None:
    """PIL mode "I": a 16-bit PGM, and one with maxval 1000 (PIL rescales it to 0..65535)."""
    values = (np.arange(16).reshape(4, 4) * 4000 + 3).astype(np.uint16)
    (tmp_path / "deep.pgm").write_bytes(b"P5 4 4 65535\n" + values.astype(">u2").tobytes())
    assert Image.open(tmp_path / "deep.pgm").mode == "I"
    assert torch.equal(first_image(tmp_path, "deep.pgm")[0], torch.from_numpy(values / 65535).float())
    (tmp_path / "kilo.pgm").write_bytes(b"P5 2 1 1000\n" + np.array([1000, 500], ">u2").tobytes())
    assert first_image(tmp_path, "kilo.pgm")[1, 0].tolist() == pytest.approx([1.0, 0.5], abs=1e-5)


@pytest.mark.parametrize(("bits", "sample_format", "mention"), [(32, 1, "I;32N"), (32, 2, "I;32S"), (16, 2, "I;16S")])
def test_32_bit_and_signed_integer_images_are_refused(tmp_path: Path, bits: int, sample_format: int,
                                                      mention: str) -> None:
    """Mode "I" without a 16-bit unsigned source has no [0, 1] scale; was: divided by 65535 or clipped."""
    write_tiff(tmp_path / "int.tiff", np.full((4, 4), 200), bits, sample_format)
    assert Image.open(tmp_path / "int.tiff").mode == "I"
    raises_user_error(lambda: first_image(tmp_path, "int.tiff"), "int.tiff", mention, "no defined [0, 1] scale")


def test_16_bit_colour_and_grey_alpha_files_are_refused(tmp_path: Path) -> None:
    """PIL reads all of these as 8 bits per channel; was: silently quantized."""
    write_tiff(tmp_path / "rgb16.tiff", np.full((4, 4, 3), 40000), 16)
    raises_user_error(lambda: first_image(tmp_path, "rgb16.tiff"), "rgb16.tiff", "RGB;16L")
    colour = np.full((2, 2, 3), 40000, ">u2").tobytes()
    (tmp_path / "rgb16.ppm").write_bytes(b"P6 2 2 65535\n" + colour)
    raises_user_error(lambda: first_image(tmp_path, "rgb16.ppm"), "rgb16.ppm", "maximum value 65535")
    (tmp_path / "rgb1000.ppm").write_bytes(b"P6 2 2 1000\n" + np.full((2, 2, 3), 999, ">u2").tobytes())
    raises_user_error(lambda: first_image(tmp_path, "rgb1000.ppm"), "rgb1000.ppm", "maximum value 1000")
    write_png16_rgb(tmp_path / "la16.png", np.full((2, 2, 2), 40000, np.uint16))  # PIL: mode RGBA
    raises_user_error(lambda: first_image(tmp_path, "la16.png"), "la16.png", "LA;16B")


def test_16_bit_bmp_is_exact_in_8_bits(tmp_path: Path) -> None:
    """A 5-6-5 BMP (PIL raw mode "BGR;16") is not 16 bits per channel; was: refused as 16-bit colour."""
    import struct

    pixels = struct.pack("<HHHH", 0xF800, 0x07E0, 0x001F, 0xFFFF)  # red, green, blue, white; bottom-up
    info = struct.pack("<IiiHHIIiiII", 40, 2, 2, 1, 16, 3, len(pixels), 0, 0, 0, 0)
    masks = struct.pack("<III", 0xF800, 0x07E0, 0x001F)
    start = 14 + len(info) + len(masks)
    (tmp_path / "565.bmp").write_bytes(b"BM" + struct.pack("<IHHI", start + len(pixels), 0, 0, start)
                                       + info + masks + pixels)
    image = first_image(tmp_path, "565.bmp")
    assert image[:, 1, 0].tolist() == [1.0, 0.0, 0.0] and image[:, 0, 1].tolist() == [1.0, 1.0, 1.0]


def test_palette_with_transparency_converts_without_a_warning(tmp_path: Path) -> None:
    import warnings

    palette = Image.fromarray(np.arange(16, dtype=np.uint8).reshape(4, 4)).convert("P")
    palette.save(tmp_path / "trns.png", transparency=b"\x00" * 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # was: "Palette images with Transparency expressed in bytes ..."
        image = first_image(tmp_path, "trns.png")
    expected = np.array(Image.open(tmp_path / "trns.png").convert("RGBA").convert("RGB"))
    assert torch.equal(image, torch.from_numpy(expected).permute(2, 0, 1).float() / 255)


def test_rgba_alpha_is_dropped_not_blended(tmp_path: Path) -> None:
    Image.new("RGBA", (2, 2), (10, 20, 30, 0)).save(tmp_path / "clear.png")  # fully transparent
    image = first_image(tmp_path, "clear.png")
    assert image.shape == (3, 2, 2) and image[:, 0, 0].tolist() == pytest.approx([10 / 255, 20 / 255, 30 / 255])


def test_animated_gif_uses_its_first_frame(tmp_path: Path) -> None:
    frames = [Image.new("RGB", (4, 4), (255, 0, 0)), Image.new("RGB", (4, 4), (0, 0, 255))]
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:])
    assert first_image(tmp_path, "anim.gif")[:, 0, 0].tolist() == [1.0, 0.0, 0.0]


def test_resized_high_depth_images_stay_in_0_1(tmp_path: Path) -> None:
    """Bilinear resizing of a white float tensor rounds to 1 + 2e-7; was: returned as is."""
    Image.fromarray(np.full((13, 13), 65535, np.uint16)).save(tmp_path / "white.png")
    image = first_image(tmp_path, "white.png", image_size=8)
    assert float(image.max()) == 1.0 and float(image.min()) > 0.999


def test_corrupt_file_that_pil_fails_on_with_another_exception(tmp_path: Path) -> None:
    """A DDS with unknown pixel-format flags: PIL raises NotImplementedError; was: a traceback."""
    import io

    buffer = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buffer, format="DDS")
    blob = bytearray(buffer.getvalue())
    blob[80:84] = (16).to_bytes(4, "little")  # DDS_PIXELFORMAT.dwFlags
    (tmp_path / "odd.dds").write_bytes(bytes(blob))
    raises_user_error(lambda: open_dataset(str(_list_of(tmp_path, "odd.dds"))), "odd.dds")
    raises_user_error(lambda: open_dataset(str(_list_of(tmp_path, "odd.dds")), image_size=4)[0], "odd.dds")


def test_decompression_bomb_is_refused(tmp_path: Path) -> None:
    import struct

    header = struct.pack(">IIBBBBB", 30000, 30000, 8, 0, 0, 0, 0)  # 900 M pixels claimed
    (tmp_path / "bomb.png").write_bytes(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IEND", b""))
    raises_user_error(lambda: open_dataset(str(_list_of(tmp_path, "bomb.png"))), "bomb.png", "decompression bomb")
    dataset = open_dataset(str(_list_of(tmp_path, "bomb.png")), image_size=8)
    raises_user_error(lambda: dataset[0], "bomb.png", "decompression bomb")


def test_resizing_a_thin_image_past_the_pixel_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """A 1x2000 image resized to short side 9 would have 9x18000 pixels; was: resized anyway."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)
    Image.new("RGB", (1, 2000)).save(tmp_path / "thin.png")
    dataset = open_dataset(str(_list_of(tmp_path, "thin.png")), image_size=8)
    raises_user_error(lambda: dataset[0], "thin.png", "1x2000", "crop it first")
    raises_user_error(lambda: open_dataset(str(_list_of(tmp_path, "thin.png")), image_size=200), "too large")


@pytest.mark.parametrize("size", [0, -3])
def test_image_size_below_one_is_refused_for_every_source(tmp_path: Path, size: int) -> None:
    """Was: ignored by open_dataset for the demo and CIFAR-10."""
    raises_user_error(lambda: open_dataset(DEMO, image_size=size), "image size must be at least 1")
    write_cifar(tmp_path, meta=False)
    raises_user_error(lambda: open_dataset(str(tmp_path), image_size=size), "image size must be at least 1")
    raises_user_error(lambda: image_list(_list_of(tmp_path, "x.png"), size), "image size must be at least 1")


@pytest.mark.parametrize("size", [None, 7.5, True, "8"])
def test_image_size_must_be_a_whole_number(tmp_path: Path, size: object) -> None:
    """Was: a TypeError traceback (None, "8"), or silently 7 (7.5) or 1 (True)."""
    write_png(tmp_path / "cls" / "a.png", solid(4, 4, (0, 0, 0)))
    raises_user_error(lambda: image_folder(tmp_path, size), "image size")
    if size is not None:
        raises_user_error(lambda: image_list(_list_of(tmp_path, "cls/a.png"), size), "image size")


@pytest.mark.parametrize("label", ["1" * 5000,  # was: int()'s ValueError traceback (more than 4,300 digits)
                                   str(2**31), "9" * 30])  # was: accepted
def test_huge_labels_are_refused(tmp_path: Path, label: str) -> None:
    write_png(tmp_path / "a.png", solid(4, 4, (0, 0, 0)))
    listing = tmp_path / "list.txt"
    listing.write_text(f"a.png {label}\n")
    message = raises_user_error(lambda: open_dataset(str(listing)), f"{listing}:1", "larger than 2147483647")
    assert len(message) < 300
    listing.write_text("a.png 0002147483647\n")  # leading zeros are fine
    assert open_dataset(str(listing))[0][1] == 2**31 - 1


def test_labels_file_unicode_digits_and_bom(tmp_path: Path) -> None:
    """The labels file of an image directory: non-ASCII digits refused; a UTF-8 BOM (Windows
    editors) accepted -- was: part of the first file name ('image file not found')."""
    images = tmp_path / "images"
    write_png(images / "x.png", solid(4, 4, (0, 0, 0)))
    labels = tmp_path / "labels.txt"
    labels.write_text("x.png \u0663\n", encoding="utf-8")
    raises_user_error(lambda: open_dataset(str(images), labels=str(labels)), f"{labels}:1", "\u0663")
    labels.write_text("x.png 3\n", encoding="utf-8-sig")
    assert [label for _, label in open_dataset(str(images), labels=str(labels))] == [3]


@pytest.mark.parametrize(
    ("labels", "mention"),
    [([2**70], "integers in [0, 2147483647]"),  # was: torch's "Overflow when unpacking long" traceback
     ([2**31], "integers in [0, 2147483647]"), ([1.0], "labels"), ([True], "labels"), ([-1], "labels"),
     (np.array([[1]]), "labels"), (np.array([0.5]), "labels"), ("0", "labels")],
)
def test_cifar_label_types_and_range(tmp_path: Path, labels: object, mention: str) -> None:
    write_batch(tmp_path / "test_batch", np.zeros((1, 3072), dtype=np.uint8), labels)
    raises_user_error(lambda: cifar10(tmp_path), tmp_path / "test_batch", mention)


@pytest.mark.parametrize("pixels", [np.zeros((1, 3072), np.float32), np.zeros((1, 3072), np.int64),
                                    np.zeros((1, 3, 32, 32), np.uint8), np.zeros(3072, np.uint8), [[0] * 3072]])
def test_cifar_data_types_and_shapes(tmp_path: Path, pixels: object) -> None:
    write_batch(tmp_path / "test_batch", pixels, [0])
    raises_user_error(lambda: cifar10(tmp_path), tmp_path / "test_batch", "'data' must be a uint8")


def test_listed_image_paths_that_cannot_be_opened(tmp_path: Path) -> None:
    """Each names the list line and what is wrong; was: an OSError traceback for a name that is
    too long, and 'image file not found' for a symlink loop or a FIFO."""
    (tmp_path / "loop.png").symlink_to(tmp_path / "loop.png")
    os.mkfifo(tmp_path / "fifo.png")
    listing = tmp_path / "list.txt"
    for name, mention in [("a" * 300 + ".png", "File name too long"), ("loop.png", "symbolic links"),
                          ("fifo.png", "not a regular file"), ("a\x00.png", "null"),
                          ("missing.png", "No such file")]:
        listing.write_text(f"{name} 0\n")
        raises_user_error(lambda: open_dataset(str(listing)), f"{listing}:1", mention)


def test_fifo_in_an_image_folder_is_refused_without_waiting(tmp_path: Path) -> None:
    """Was: PIL opened the FIFO and waited for a writer forever (a helper thread writes a PNG
    if anything opens it, so that the old code fails instead of hanging)."""
    import threading
    import time

    write_png(tmp_path / "cat" / "a.png", solid(4, 4, (0, 0, 0)))
    fifo = tmp_path / "cat" / "b.png"
    os.mkfifo(fifo)
    png = (tmp_path / "cat" / "a.png").read_bytes()

    def feed() -> None:
        for _ in range(100):
            try:
                descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet
                time.sleep(0.05)
                continue
            os.write(descriptor, png)
            os.close(descriptor)
            return

    threading.Thread(target=feed, daemon=True).start()
    dataset = image_folder(tmp_path, 4)
    assert dataset[0][0].shape == (3, 4, 4)
    raises_user_error(lambda: dataset[1], fifo, "not a regular file")


def test_image_folder_symlink_loop_is_refused(tmp_path: Path) -> None:
    """Was: ImageFolder followed cat/loop -> cat 40 levels deep: 41 copies of one image."""
    write_png(tmp_path / "cat" / "a.png", solid(4, 4, (0, 0, 0)))
    (tmp_path / "cat" / "loop").symlink_to(tmp_path / "cat")
    raises_user_error(lambda: open_dataset(str(tmp_path), image_size=4), tmp_path / "cat", "symbolic link loop")


def test_image_folder_that_is_a_file(tmp_path: Path) -> None:
    """Was: NotADirectoryError traceback."""
    image = write_png(tmp_path / "a.png", solid(4, 4, (0, 0, 0)))
    raises_user_error(lambda: image_folder(image, 4), image, "not the file")


def test_image_replaced_after_the_dataset_was_opened(tmp_path: Path) -> None:
    """Without image_size all images share one size; was: a wrong-sized tensor returned."""
    write_png(tmp_path / "a.png", solid(4, 4, (0, 0, 0)))
    dataset = open_dataset(str(_list_of(tmp_path, "a.png")))
    write_png(tmp_path / "a.png", solid(5, 4, (0, 0, 0)))
    raises_user_error(lambda: dataset[0], tmp_path / "a.png", "4x5", "4x4")


def test_dataset_paths_that_cannot_be_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: the current directory opened for an empty path, RuntimeError for ~nosuchuser,
    OSError for a name too long, 'does not exist' for a symlink loop."""
    write_cifar(tmp_path, meta=False)
    monkeypatch.chdir(tmp_path)
    raises_user_error(lambda: open_dataset(""), "empty")
    raises_user_error(lambda: image_list("", None), "empty")
    raises_user_error(lambda: open_dataset("~no_such_user_dmae/data"), "~no_such_user_dmae", "no such user")
    raises_user_error(lambda: open_dataset("d" * 300), "File name too long")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    raises_user_error(lambda: open_dataset(str(tmp_path / "loop")), "loop", "symbolic links")
    images = tmp_path / "images"
    write_png(images / "a.png", solid(4, 4, (0, 0, 0)))
    raises_user_error(lambda: open_dataset(str(images), labels=str(tmp_path)), tmp_path, "directory")
    raises_user_error(lambda: open_dataset(str(images), labels=""), "empty")
