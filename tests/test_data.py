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

from dmae_fast import data
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
from dmae_fast.errors import UserError


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
    for k, name in enumerate((*data.CIFAR_TRAIN_BATCHES, data.CIFAR_TEST_BATCH)):
        pixels = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        write_batch(directory / name, pixels, [(k + i) % 10 for i in range(per_batch)])
    if meta:
        names = [f"class{i}".encode() for i in range(10)]
        with open(directory / data.CIFAR_META, "wb") as file:
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
    write_cifar(tmp_path / data.CIFAR_SUBDIR)
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
    with open(tmp_path / data.CIFAR_META, "wb") as file:
        pickle.dump({b"label_names": [b"a", b"b"]}, file, protocol=2)
    raises_user_error(lambda: cifar10(tmp_path), tmp_path / data.CIFAR_META)


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


def test_unreadable_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(data.os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
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


def write_png16_rgb(path: Path, pixels: np.ndarray) -> Path:
    """A 16-bit colour PNG written by hand (PIL cannot write one): uint16 [H, W, 3]."""
    import struct
    import zlib

    height, width, _ = pixels.shape
    raw = b"".join(b"\x00" + pixels[y].astype(">u2").tobytes() for y in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
                     + chunk(b"IEND", b""))
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
    pixels = np.zeros((4, 4, 3), np.uint16)
    pixels[..., 0] = 60000
    write_png16_rgb(tmp_path / "colour16.png", pixels)
    dataset = open_dataset(str(_list_of(tmp_path, "colour16.png")), image_size=4)
    raises_user_error(lambda: dataset[0], "colour16.png", "16-bit colour")


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


def test_a_listed_directory_is_not_an_image(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    raises_user_error(lambda: open_dataset(str(_list_of(tmp_path, "sub"))), "sub")


def test_label_file_that_is_not_utf8(tmp_path: Path) -> None:
    write_png(tmp_path / "a.png", solid(4, 4, (0, 0, 0)))
    labels = tmp_path / "labels.txt"
    labels.write_bytes(b"a.png \xff\xfe\n")
    raises_user_error(lambda: open_dataset(str(tmp_path), labels=str(labels)), "labels.txt")
