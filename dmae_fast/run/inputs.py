"""The files a command reads, checked before torch loads: a mistyped path is one line at once, not after
seconds of imports (or, with ``dmae-certify --nproc-per-node``, after every rank has started)."""

from __future__ import annotations

from pathlib import Path

from dmae_fast.base.paths import check_readable_file, dataset_path, ensure_readable
from dmae_fast.demo_files import DEMO, DEMO_CHECKPOINT
from dmae_fast.engines.sidecar import KIND_BY_SUFFIX
from dmae_fast.run.config import CertifyConfig


def check_classifier_file(path: str | Path) -> None:
    """A checkpoint or engine file (``demo``: the embedded one) exists and can be read, in its loader's words."""
    path = DEMO_CHECKPOINT if str(path) == DEMO else Path(path)
    check_readable_file(path, "engine" if path.suffix in KIND_BY_SUFFIX else "checkpoint")


def check_inputs_before_loading(config: CertifyConfig) -> None:
    """The classifier file, the dataset path and the labels file exist and can be read, in the words the
    loaders use; what a file holds is checked when it is opened."""
    check_classifier_file(config.classifier.engine_path)
    data = config.data
    if data.data != DEMO:
        dataset_path(data.data)
    if data.labels is not None:
        ensure_readable(Path(data.labels))
