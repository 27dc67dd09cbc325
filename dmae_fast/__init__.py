"""dmae-fast: certified-robust classification with Denoising Masked Autoencoders."""

__version__ = "0.1.0"
