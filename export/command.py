"""``dmae-export``: a classifier checkpoint -> verified engine files with JSON sidecars. Every engine is run
against the fp32 PyTorch model right after writing; one that agrees on fewer than 99.9% (fp32) / 99% (fp16, bf16)
of top-1 classes is deleted and the run fails."""

from __future__ import annotations

import argparse
import sys

from dmae_fast.base.command import Parser, import_torch_while_starting, run_reporting_errors
from dmae_fast.engines.sidecar import BatchRange
from dmae_fast.export.config import DEFAULT_BATCH, FORMATS, MAX_PARITY_SAMPLES, ExportConfig
from dmae_fast.model.config import parse_normalization
from dmae_fast.run.inputs import check_classifier_file

PROG = "dmae-export"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Export a classifier checkpoint to ONNX, TensorRT and/or an "
                    "AOTInductor package (.pt2), each verified against PyTorch and described by a JSON sidecar.")
    parser.add_argument("--ckpt", required=True, help="classifier checkpoint (any layout dmae-certify reads); "
                        "'demo' for the embedded demo model")
    parser.add_argument("--format", default="onnx", choices=[*FORMATS, "all"], help="engine kind: onnx, tensorrt, "
                        "torch (.pt2) or all (default onnx; all skips TensorRT when it is not installed)")
    precision = parser.add_mutually_exclusive_group()
    precision.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"], help="weights and compute "
                           "precision (bf16: --format torch only); inputs and logits stay float32")
    precision.add_argument("--fp16", dest="precision", action="store_const", const="fp16",
                           help="same as --precision fp16")
    parser.add_argument("--input", default="image", choices=["image", "tokens"],
                        help="image: [B, C, H, W] in [0, 1]; tokens: [B, 1+L, D] token embeddings after the patch "
                        "embedding (for the fused noise + patch-embedding front end)")
    parser.add_argument("--batch", default=str(DEFAULT_BATCH), help="batch range MIN:OPT:MAX (TensorRT's "
                        f"optimization profile; .pt2 dynamic range; default {DEFAULT_BATCH})")
    parser.add_argument("--out", default=".", help="directory for the engine files (created if missing)")
    parser.add_argument("--name", help="engine file name without extension (default: the checkpoint's name, "
                        "plus -tokens and -fp16/-bf16)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N: where graphs are compiled "
                        "and verified (a .pt2 runs only on this device type; TensorRT needs cuda)")
    parser.add_argument("--parity-samples", type=int, default=1000, help="noisy inputs of the verification "
                        f"(default 1000, at most {MAX_PARITY_SAMPLES:,})")
    parser.add_argument("--seed", type=int, help="seed of the verification (and agreement) inputs (default: random, "
                        "recorded)")
    parser.add_argument("--input-size", type=int, help="for checkpoints without metadata: side of the images "
                        "the classifier receives (e.g. 32 for DMAE CIFAR-10 models)")
    parser.add_argument("--normalize", help="for checkpoints without metadata: imagenet (default), cifar10, or "
                        "'m1,m2,m3:s1,s2,s3'")
    parser.add_argument("--timing-cache", help="TensorRT timing cache file, read and updated "
                        "(default <out>/tensorrt-timing.cache; --format tensorrt or all only)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing engine files and sidecars "
                        "(never the checkpoint or a directory)")
    agreement = parser.add_argument_group("certified agreement (image engines; recorded in the sidecar)")
    agreement.add_argument("--check-agreement", metavar="DATA", help="measure how often the engine's class "
                           "differs from PyTorch's on DATA's images (demo, a folder or a file list, as dmae-certify "
                           "--data) under the smoothing noise, with a 99.9%% upper bound on the rate: the radius "
                           "cost of certifying the engine from a reference run (docs/export.md)")
    agreement.add_argument("--agreement-images", type=int, default=100, help="DATA's first images (default 100)")
    agreement.add_argument("--agreement-samples", type=int, default=1000, help="noisy copies of each "
                           "(default 1000)")
    agreement.add_argument("--sigma", type=float, help="the noise level (default: the checkpoint's sigma)")
    return parser


def config_from_args(args: argparse.Namespace) -> ExportConfig:
    mean, std = parse_normalization(args.normalize)
    everything = args.format == "all"
    return ExportConfig(ckpt=args.ckpt, out=args.out, formats=FORMATS if everything else (args.format,),
                        precision=args.precision, input=args.input, batch=BatchRange.parse(args.batch), name=args.name,
                        device=args.device, parity_samples=args.parity_samples, seed=args.seed,
                        input_size=args.input_size, mean=mean, std=std, timing_cache=args.timing_cache,
                        overwrite=args.overwrite, strict_formats=not everything,
                        check_agreement=args.check_agreement, agreement_images=args.agreement_images,
                        agreement_samples=args.agreement_samples, sigma=args.sigma)


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        config = config_from_args(build_parser().parse_args(argv))
        config.validate()  # before torch is imported: --help and option errors answer at once
        check_classifier_file(config.ckpt)  # and a mistyped --ckpt
        import_torch_while_starting(PROG)
        from dmae_fast.export.pipeline import export_engines

        export_engines(config)
        return 0

    return run_reporting_errors(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
