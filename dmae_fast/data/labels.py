"""Label files: ``image label`` lines naming a dataset's images and their classes."""

from __future__ import annotations

import re
from pathlib import Path

from dmae_fast.base.errors import UserError
from dmae_fast.base.messages import one_line
from dmae_fast.data.checks import file_problem

# Largest label accepted (from label files and CIFAR batches): far above any classifier's class
# count, and small enough that labels and num_classes = max + 1 stay exact in every integer type.
MAX_LABEL = 2**31 - 1


def read_label_file(list_path: Path, base_dir: Path) -> list[tuple[Path, int]]:
    """``(image path, label)`` pairs from a file of ``image label`` lines: blank and ``#`` lines skipped, fields
    separated by whitespace or a comma, labels ASCII digits (at most ``MAX_LABEL``)."""
    try:
        lines = list_path.read_text(encoding="utf-8-sig").splitlines()  # -sig: a BOM is not part of a name
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read label file {list_path}: {one_line(exc)}") from None
    samples = []
    for number, line in enumerate(lines, start=1):
        line = line.strip()
        if line and not line.startswith("#"):
            samples.append(_parse_label_line(line, base_dir, f"{list_path}:{number}"))
    return samples


def _parse_label_line(line: str, base_dir: Path, where: str) -> tuple[Path, int]:
    """Split one ``image label`` line; the image path may contain spaces."""
    fields = line.rsplit(",", 1) if "," in line else line.rsplit(None, 1)
    if len(fields) != 2 or not fields[0].strip():
        raise UserError(f"{where}: expected 'image label', got {line!r}")
    image, label = base_dir / fields[0].strip(), _parse_label(fields[1].strip(), where)
    problem = file_problem(image)
    if problem is not None:
        raise UserError(f"{where}: image file {str(image)!r}: {problem}")
    return image, label


def _parse_label(text: str, where: str) -> int:
    """A label written in ASCII digits, at most ``MAX_LABEL``. ``str.isdigit`` and ``int`` also accept other
    Unicode digits ('²', '٣'), and ``int`` refuses more than 4,300 digits with a ValueError; neither reaches them."""
    shown = text if len(text) <= 24 else text[:20] + "..."
    if re.fullmatch(r"[0-9]+", text) is None:
        raise UserError(f"{where}: label must be a non-negative integer in ASCII digits, got {shown!r}")
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(MAX_LABEL)) or int(digits) > MAX_LABEL:
        raise UserError(f"{where}: label {shown} is larger than {MAX_LABEL}")
    return int(digits)
