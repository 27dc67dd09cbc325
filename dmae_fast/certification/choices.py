"""The fixed choices of ``dmae-certify``'s options, in a module that imports nothing heavy, so
that ``--help`` and option errors answer without loading torch."""

from pathlib import Path

from dmae_fast.errors import UserError

PROG = "dmae-certify"
DEMO = "demo"  # --data demo, --ckpt demo: the embedded demo digits and classifier
DEMO_CHECKPOINT = Path(__file__).parents[1] / "assets" / "demo-digits-vit.safetensors"
SHARD_CHOICES = ("images", "samples")
NOISE_CHOICES = ("compiled", "reference")
CPU_RUNTIMES = ("auto", "openvino", "onnxruntime", "torch")
PRECISION_CHOICES = ("auto", "fp32", "fp16", "bf16", "fp8")  # fp8: opt-in, Ada/Hopper GPUs (dmae_fast.model.fp8)
BODY_CHOICES = ("fast", "plain")  # --body: the fastest verified body for the device, or the plain reference
BODY_ENV = "DMAE_FAST_BODY"  # the default of --body where it is set (e.g. plain, for a test suite)


def chosen_body(body: str | None, fast: bool, parts: bool, environ: dict[str, str]) -> tuple[str, str]:
    """(the body a command runs, why): ``--body``, else ``--fast``, else the fast path's parts
    (``--fused/--compile/--cuda-graphs/--profile`` pick their own body), else $DMAE_FAST_BODY, else fast."""
    if fast and body == "plain":
        raise UserError("--fast and --body plain contradict each other; give one")
    if body is not None:
        return body, f"--body {body}"
    if fast:
        return "fast", "--fast"
    if parts:
        return "plain", "the fast path's parts were named (--fused/--compile/--cuda-graphs/--profile)"
    env = environ.get(BODY_ENV)
    if env is not None:
        if env not in BODY_CHOICES:
            raise UserError(f"{BODY_ENV}={env!r}: choose {' or '.join(BODY_CHOICES)}")
        return env, f"{BODY_ENV}={env}"
    return "fast", "the default (--body plain runs the plain reference body)"
