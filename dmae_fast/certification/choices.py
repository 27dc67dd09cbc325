"""The fixed choices of ``dmae-certify``'s options, in a module that imports nothing heavy, so
that ``--help`` and option errors answer without loading torch."""

from pathlib import Path

PROG = "dmae-certify"
DEMO = "demo"  # --data demo, --ckpt demo: the embedded demo digits and classifier
DEMO_CHECKPOINT = Path(__file__).parents[1] / "assets" / "demo-digits-vit.safetensors"
SHARD_CHOICES = ("images", "samples")
NOISE_CHOICES = ("compiled", "reference")
CPU_RUNTIMES = ("auto", "openvino", "onnxruntime", "torch")
FUTILITY_MODES = ("none", "deterministic", "upper")
PAPER_RADII = (0.5, 1.0, 1.5, 2.0, 3.0)  # the paper's radii of interest (sequential CERTIFY's default)
PRECISION_CHOICES = ("auto", "fp32", "fp16", "bf16", "fp8")  # fp8: opt-in, Ada/Hopper GPUs (dmae_fast.model.fp8)
