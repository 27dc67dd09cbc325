"""The keys of what every ``--fast`` start on a CPU rebuilds, kept in the package's disk cache
(:mod:`dmae_fast.base.disk_cache`): the exported graph, the verdict of its parity check against PyTorch, and
OpenVINO's compiled models (in a subfolder). A build lists the entries it read (``reads``), so that a body built
from a wrong one that fails is dropped (:func:`~dmae_fast.base.disk_cache.drop_entries`) and rebuilt."""

from __future__ import annotations

from pathlib import Path

from dmae_fast.base.disk_cache import digest_key, installed_versions, package_sha256
from dmae_fast.base.integrity import file_sha256

# Bump when what an entry holds, or how it is keyed, changes.
FORMAT_VERSION = 1
LIBRARIES = ("torch", "timm", "onnx", "openvino", "onnxruntime")


def library_versions() -> dict[str, str | None]:
    """The installed versions of the libraries that export, check and compile a graph (None: absent)."""
    return installed_versions(LIBRARIES)


def cache_key(**parts) -> str:
    """The SHA-256 of ``parts`` (JSON values), the library versions, this package's sources and the format version."""
    return digest_key(format=FORMAT_VERSION, libraries=library_versions(), code=package_sha256(), **parts)


def files_sha256(folder: Path) -> dict[str, str]:
    """The SHA-256 of each file in ``folder`` by name; none where the folder is missing or unreadable."""
    try:
        return {path.name: file_sha256(path) for path in sorted(folder.iterdir()) if path.is_file()}
    except OSError:
        return {}
