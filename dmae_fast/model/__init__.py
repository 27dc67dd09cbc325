"""Networks: the DMAE pre-training model and the smoothing base classifier. The names load on first use, so that
importing ``dmae_fast.model.config`` (needed by every command's parser) does not import torch and timm."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dmae_fast.base.lazy import lazy_attributes

_HOME = {
    "ENCODER_PRESETS": "config",
    "NORMALIZATIONS": "config",
    "ClassifierSpec": "config",
    "DecoderConfig": "config",
    "EncoderConfig": "config",
    "DMAEPretrain": "dmae",
    "PretrainOutput": "dmae",
    "SmoothingClassifier": "classifier",
}
__all__ = sorted(_HOME)

if TYPE_CHECKING:  # the lazy names, for type checkers (unused here, hence noqa: F401)
    from dmae_fast.model.classifier import SmoothingClassifier  # noqa: F401
    from dmae_fast.model.config import (  # noqa: F401
        ENCODER_PRESETS,
        NORMALIZATIONS,
        ClassifierSpec,
        DecoderConfig,
        EncoderConfig,
    )
    from dmae_fast.model.dmae import DMAEPretrain, PretrainOutput  # noqa: F401

__getattr__ = lazy_attributes(__name__, _HOME)
