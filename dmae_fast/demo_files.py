"""The embedded demo's names, importable by every layer (nothing heavy here): ``--data demo`` and
``--ckpt demo``, and the classifier file the latter means."""

from pathlib import Path

DEMO = "demo"  # --data demo, --ckpt demo: the embedded demo digits and classifier
DEMO_CHECKPOINT = Path(__file__).parent / "assets" / "demo-digits-vit.safetensors"
DEMO_HAS_LABELS = "--labels names the labels of a flat directory of images or an image list; --data demo has its own"
