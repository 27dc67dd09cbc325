"""The files a training run reads, checked before torch loads (as ``dmae-certify`` checks its own,
:mod:`dmae_fast.run.inputs`): a mistyped path is one line at once, not after seconds of imports."""

from __future__ import annotations

from pathlib import Path

from dmae_fast.base.errors import UserError
from dmae_fast.base.paths import check_readable_file, dataset_path
from dmae_fast.demo_files import DEMO
from dmae_fast.train.config import TrainingConfig, VisualizeConfig


def training_data_dir(spec: str) -> Path:
    """The training images' directory ``spec`` (``~`` expanded); UserError unless it is one."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise UserError(f"training data {spec} is not '{DEMO}' or an existing directory")
    return path


def check_inputs_before_loading(config: TrainingConfig | VisualizeConfig) -> None:
    """The checkpoint to start from (``init``, or visualize's ``checkpoint``) and the images exist, in the words
    their loaders use; what they hold is checked when they are opened."""
    if isinstance(config, VisualizeConfig):
        start, images = config.checkpoint, config.dataset
        if images != DEMO:
            dataset_path(images)
    else:
        start, images = config.init, config.data.dataset
        if images != DEMO:
            training_data_dir(images)
    if start is not None:
        check_readable_file(Path(start), "checkpoint")
