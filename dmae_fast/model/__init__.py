"""Networks: the DMAE pre-training model and the smoothing base classifier."""

from dmae_fast.model.classifier import SmoothingClassifier
from dmae_fast.model.config import (
    ENCODER_PRESETS,
    NORMALIZATIONS,
    ClassifierSpec,
    DecoderConfig,
    EncoderConfig,
)
from dmae_fast.model.dmae import DMAEPretrain, PretrainOutput

__all__ = [
    "ENCODER_PRESETS",
    "NORMALIZATIONS",
    "ClassifierSpec",
    "DMAEPretrain",
    "DecoderConfig",
    "EncoderConfig",
    "PretrainOutput",
    "SmoothingClassifier",
]
