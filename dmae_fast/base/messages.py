"""What the package says besides its errors: a notice on stderr, and an error (or any text) on one line."""

from __future__ import annotations

import sys

from tqdm import tqdm

LIMIT = 200  # the most characters of a line made of an error


def one_line(said: object, typed: bool = False, first: bool = False, limit: int = LIMIT) -> str:
    """``said`` (an error or any text) on one line of at most ``limit`` characters: an error's message (else its
    type's name), with ``typed`` as ``Type: message``, with ``first`` only its first line (further lines: hints)."""
    text = str(said).strip()
    text = text.splitlines()[0] if first and text else text
    text = f"{type(said).__name__}: {text}" if typed and isinstance(said, BaseException) else text
    text = " ".join(text.split()) or type(said).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def print_notice(message: str) -> None:
    """Say ``message`` on stderr in one line, as the package's notices are (``dmae-fast: ...``); through tqdm, so
    that a progress bar being drawn is cleared first and drawn again below it."""
    tqdm.write(f"dmae-fast: {message}", file=sys.stderr)
