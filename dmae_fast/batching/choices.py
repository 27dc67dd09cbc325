"""The fixed choices of ``dmae-certify``'s options, in a module that imports nothing heavy, so
that ``--help`` and option errors answer without loading torch."""

SHARD_CHOICES = ("images", "samples")
NOISE_CHOICES = ("compiled", "reference")
CPU_RUNTIMES = ("auto", "openvino", "onnxruntime", "torch")
PRECISION_CHOICES = ("auto", "fp32", "fp16", "bf16", "fp8")  # fp8: opt-in, Ada/Hopper GPUs (dmae_fast.model.fp8)
FAST_PARTS = ("fused", "compile", "cuda-graphs")  # --fast-parts: the fast body's parts a command may name
BODY_CHOICES = ("fast", "plain")  # --body: the fastest verified body for the device, or the plain reference
BODY_ENV = "DMAE_FAST_BODY"  # the default of --body where it is set (e.g. plain, for a test suite)
