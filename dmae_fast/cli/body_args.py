"""The batch-body options of dmae-certify, dmae-serve and ``dmae-serve replay``: added to a parser
once (:func:`add_body_arguments`) and resolved once (:func:`body_options`)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import replace

from dmae_fast.base.errors import UserError
from dmae_fast.batching.body_options import BodyOptions
from dmae_fast.batching.choices import BODY_CHOICES, BODY_ENV, CPU_RUNTIMES, FAST_PARTS, NOISE_CHOICES

REASONS = {"fast": "the default (--body plain runs the plain reference body)",
           "plain": "the default (--body fast runs the fastest body for the device)"}


def add_body_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Add the body options to ``parser``, in a group of their own (returned, for a command's extras)."""
    group = parser.add_argument_group("batch body (PyTorch checkpoints, or token engines from dmae-export --input "
                                      "tokens; every body gives the same counts up to the classifier's rounding)")
    group.add_argument("--body", choices=BODY_CHOICES, action=_OneBody, help="fast: the fastest body for the device "
                       "that passes a check against the plain body on a trial batch (on CUDA fused + compiled + CUDA "
                       "graphs; on a CPU one worker per core on cache-sized chunks, OpenVINO or ONNX Runtime for fp32, "
                       "PyTorch otherwise), falling back one step at a time with a notice; plain: the reference body "
                       f"(default from ${BODY_ENV} where set; docs/performance.md)")
    group.add_argument("--fast", dest="body", action=_OneBody, nargs=0, const="fast", help="the same as --body fast")
    group.add_argument("--fast-parts", action="extend", type=_parts, metavar="PARTS", help="for experts: the fast "
                       "body with exactly these of its parts, comma-separated: fused (a Triton kernel: noise + patch "
                       "embedding in one pass; falls back, with a notice, for classifiers that resize inside, e.g. "
                       "CIFAR-10), compile (torch.compile), cuda-graphs (each batch's work captured once and "
                       "replayed; CUDA). --fast picks the parts for the device")
    for part in FAST_PARTS:  # the older spelling of each part, kept working and out of --help
        group.add_argument(f"--{part}", dest="fast_parts", action="append_const", const=part, help=argparse.SUPPRESS)
    group.add_argument("--cpu-runtime", default="auto", choices=CPU_RUNTIMES, help="--fast on a CPU: the "
                       "classifier's runtime (default auto: OpenVINO, else ONNX Runtime, else PyTorch; for fp32)")
    group.add_argument("--noise", default="compiled", choices=NOISE_CHOICES, help="compiled (default): the noise "
                       "contract as one compiled kernel, falling back with a notice; reference: the torch-op "
                       "reference (slow; same noise to float32 rounding)")
    parser.set_defaults(body_option=None)
    return group


class _OneBody(argparse.Action):
    """``--body NAME`` and its alias ``--fast``: one body, however spelled (two that differ contradict each other);
    the spelling given is kept as ``body_option``, the reason a run reports."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        body, given = self.const or values, f"{option_string} {values}".strip() if values else option_string
        if namespace.body not in (None, body):
            parser.error(f"{namespace.body_option} and {given} contradict each other; give one")
        namespace.body, namespace.body_option = body, given


def _parts(text: str) -> list[str]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in parts if part not in FAST_PARTS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"{','.join(unknown) or repr(text)}: name parts among {', '.join(FAST_PARTS)}")
    return parts


def body_options(args: argparse.Namespace, environ: Mapping[str, str], default: str = "fast") -> BodyOptions:
    """The body options ``args`` ask for, and why: ``--body`` (or ``--fast``), else the fast path's parts (which
    run the fast body with those parts), else ``$DMAE_FAST_BODY``, else ``default``."""
    parts = set(args.fast_parts or ())
    options = BodyOptions(fused="fused" in parts, compile="compile" in parts, cuda_graphs="cuda-graphs" in parts,
                          noise=args.noise, cpu_runtime=args.cpu_runtime)
    if args.body == "plain" and parts:
        raise UserError(f"{args.body_option} and {options.parts} contradict each other (the parts are the fast "
                        "body's); give one")
    env = environ.get(BODY_ENV)
    if args.body is not None:
        body, why = args.body, args.body_option
    elif options.parts:  # fast=False with parts named: the fast body with exactly those (BodyOptions.body)
        body, why = "plain", options.parts
    elif env is not None:
        if env not in BODY_CHOICES:
            raise UserError(f"{BODY_ENV}={env!r}: choose {' or '.join(BODY_CHOICES)}")
        body, why = env, f"{BODY_ENV}={env}"
    else:
        body, why = default, REASONS[default]
    return replace(options, fast=body == "fast", reason=why)
