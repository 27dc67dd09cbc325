"""``dmae-certify``: certify (or predict) a dataset with a smoothed classifier; a parser over
:class:`dmae_fast.run.driver.Run`, which writes rows as images finish and records the run in ``<out>.json``.

    dmae-certify --ckpt model.safetensors --data /imagenet/val --sigma 0.5 --skip 50
    dmae-certify analyze results.tsv --plot curve.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from dmae_fast.base.command import Parser, run_reporting_errors
from dmae_fast.base.errors import AlreadyReported, Interrupted, UserError, starting
from dmae_fast.batching.choices import PRECISION_CHOICES, SHARD_CHOICES
from dmae_fast.cli.body_args import add_body_arguments, body_options

# Only light modules here: --help and option errors answer without importing torch.
from dmae_fast.demo_files import DEMO, DEMO_CHECKPOINT
from dmae_fast.distributed.launch import LaunchedRun, in_launched_rank, launch_local, leave_to_launcher
from dmae_fast.distributed.torchrun_env import world_size
from dmae_fast.run.config import PROG
from dmae_fast.stats.settings import FUTILITY_MODES, SEQUENTIAL_TESTS

if TYPE_CHECKING:
    from dmae_fast.run.config import CertifyConfig
    from dmae_fast.run.record import RunResult


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Certify (CERTIFY) or predict (PREDICT) with a Gaussian-smoothed "
                    "classifier, Cohen et al.'s procedures, samples from many images packed into full batches. "
                    "Subcommand: 'dmae-certify analyze FILE...' summarizes results files.")
    model = parser.add_argument_group("classifier")
    source = model.add_mutually_exclusive_group()
    source.add_argument("--ckpt", help="checkpoint: ours (.safetensors), official DMAE/MAE, timm; "
                        "'demo' for the embedded demo model (default with --data demo)")
    source.add_argument("--engine", help="engine file (.onnx, .engine/.plan, .pt2, with its sidecar) or checkpoint")
    model.add_argument("--input-size", type=int, help="side of the images the classifier receives, where "
                       "noise is added (default: from the checkpoint; e.g. 32 for DMAE CIFAR-10 models)")
    model.add_argument("--normalize", help="input normalization for checkpoints without metadata: "
                       "imagenet (default), cifar10, or 'm1,m2,m3:s1,s2,s3'")
    model.add_argument("--precision", default="auto", choices=PRECISION_CHOICES, help="classifier precision (auto: "
                       "fp32 on CPU, fp16 on CUDA; fp8: opt-in, float8 matrix products on Ada/Hopper GPUs)")
    data = parser.add_argument_group("data")
    data.add_argument("--data", required=True, help="'demo', an ImageFolder directory, a CIFAR-10 "
                      "python-batches directory, an image directory (with --labels) or a list file")
    data.add_argument("--labels", help="labels file ('filename label' lines) for an image directory")
    data.add_argument("--split", default="test", choices=["test", "train"], help="split of demo/CIFAR-10 data")
    data.add_argument("--image-size", type=int, help="resize + center-crop size for image files "
                      "(default: the classifier's input size)")
    data.add_argument("--skip", type=int, default=1, help="certify every SKIP-th image (paper: 50 on ImageNet)")
    data.add_argument("--max", "--max-images", dest="max_images", type=int, help="certify at most MAX images "
                      "(spell it --max-images after torchrun, whose parser takes --max for its --max-restarts)")
    data.add_argument("--workers", type=int, help="DataLoader workers (default: 0 for in-memory data, else 4)")
    smooth = parser.add_argument_group("smoothing")
    smooth.add_argument("--sigma", type=float, help="noise level in [0,1] pixel units "
                        "(default: the sigma the checkpoint was trained with, if recorded)")
    smooth.add_argument("--n0", type=int, default=100, help="selection samples (default 100)")
    smooth.add_argument("--n", "--num-samples", dest="n", type=int, default=10_000, help="estimation samples "
                        "(default 10,000; spell it --num-samples after torchrun, whose parser takes --n for its own)")
    smooth.add_argument("--alpha", type=float, default=0.001, help="failure probability (default 0.001)")
    smooth.add_argument("--predict", action="store_true", help="run PREDICT (n samples, binomial test) instead")
    smooth.add_argument("--seed", type=int, help="64-bit noise seed: --seed N reproduces a run exactly (default: a "
                        "fresh seed from the OS, printed in the start line and recorded; --resume keeps the recorded)")
    smooth.add_argument("--sound", action="store_true", help="certificates that hold in floating point: inputs on "
                        "their grid (8-bit images: 1/255; the demo digits: 1/16), the Gaussian rounded onto it drawn "
                        "exactly, the classifier on the exact grid sum (docs/sound.md); off-grid inputs are refused")
    smooth.add_argument("--quantize", action="store_true", help="with --sound: round inputs that are on no grid "
                        "(16-bit or float images) onto it; the certificate is then for the rounded image")
    run = parser.add_argument_group("run")
    run.add_argument("--batch", type=int, default=1000, help="noisy samples per forward pass (default 1000)")
    run.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    run.add_argument("--out", help="results file (default: a new timestamped .tsv in the current directory)")
    run.add_argument("--overwrite", action="store_true", help="replace an existing --out (atomically, at the end)")
    run.add_argument("--resume", action="store_true", help="continue an existing --out: certify only missing images")
    run.add_argument("--radii", type=float, nargs="+", help="radii of the summary table (default 0, 0.25, ..., 3); "
                     "with --sequential also the radii of interest (default 0.25 steps up to what min(--n, 10,000) "
                     "samples certify)")
    seq = parser.add_argument_group("sequential certification (opt-in; same alpha guarantee, fewer samples)")
    seq.add_argument("--sequential", action="store_true", help="stop sampling an image as soon as the largest "
                     "reachable radius of interest is certified, or the next one is out of reach; --n is the cap")
    seq.add_argument("--sequential-test", default="exact", choices=SEQUENTIAL_TESTS, help="exact (default): exact "
                     "group-sequential boundaries per radius of interest, tested in order at the full alpha, "
                     "certifying grid radii; bonferroni: Clopper-Pearson at alpha/K at K looks")
    seq.add_argument("--looks", type=int, nargs="+", help="cumulative estimation samples at which to decide (last = "
                     "--n; default: exact every 100 samples to 2,000 then x1.1; bonferroni 6 looks doubling up to --n)")
    seq.add_argument("--futility", choices=FUTILITY_MODES, help="early abstain/lower-radius stop (it never certifies): "
                     "deterministic (only when even all remaining samples could not reach the next radius), upper "
                     "(also by a 99%% upper bound), none; default upper for exact, deterministic for bonferroni")
    seq.add_argument("--grow", type=number_or_off, metavar="Z|off", help="exact test: an image it would stop draws "
                     "on while its radius is expected to grow by more than Z * sigma per 10,000 further samples, up to "
                     "--n (no alpha spent; smaller Z: more samples, larger radii; default 0.1; off: stop where the "
                     "grid test stops)")
    incremental = parser.add_argument_group("incremental certification of a derived engine (docs/certify.md)")
    incremental.add_argument("--reference", metavar="REF.tsv", help="certify --engine (an fp16/fp8/int8 export of "
                             "the reference's classifier) from this completed fixed-n CERTIFY run: the reference's "
                             "class, radius sigma * Phi^-1(pA_lower - zeta_U), zeta_U bounding the disagreement on "
                             "--paired-samples noisy images (the reference's own, where it kept its votes: the "
                             "derived classifier alone runs; else fresh ones that both classify); fails with "
                             "probability <= the reference's alpha + --alpha")
    incremental.add_argument("--paired-samples", type=int, metavar="N", help="with --reference: paired samples per "
                             "image (default: the reference's votes per image, else its n / 5); an image the "
                             "reference abstained on takes none")
    incremental.add_argument("--scratch-above", type=float, metavar="P", help="with --reference: certify from "
                             "scratch (the derived classifier alone, the reference's n0 + n) the images whose "
                             "reference pA_lower is above P, where any bound on the disagreement costs a radius level "
                             "(default 0.99; 1: none)")
    incremental.add_argument("--disagreement-rate", type=float, metavar="D", help="with --reference: the derived "
                             "engine's expected disagreement with the reference on noisy inputs (e.g. the zeta_U "
                             "dmae-export --check-agreement records): each image takes the fewest paired samples, of "
                             "5, 10, 20 and 50%% of the reference's n (at most --paired-samples), that keep its "
                             "reference radius's 0.25 step at the disagreements D predicts, from scratch where none "
                             "do (instead of --scratch-above)")
    incremental.add_argument("--keep-votes", type=int, metavar="N", help="keep this run's votes on the first N "
                             "estimation samples of each image (whether the classifier chose the row's class; N bits "
                             "an image) in OUT.votes, so that a --reference run against it counts disagreements on "
                             "those noisy inputs without running this classifier again (fixed-n CERTIFY, one "
                             "process)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--nproc-per-node", type=int, help="run as this many processes on this machine (torch's "
                     "elastic launcher, like torchrun --standalone; one per GPU, or CPU processes sharing the cores)")
    run.add_argument("--max-restarts", type=int, default=0, help="with --nproc-per-node: restart the processes "
                     "this often after a crash; a restart continues from the rows on disk (default 0)")
    run.add_argument("--shard", default="images", choices=SHARD_CHOICES, help="under torchrun with several "
                     "processes: 'images' (default; each rank claims the next image, rows merged at the end) or "
                     "'samples' (all ranks on one image at a time, each a share of its samples: lowest latency)")
    body = add_body_arguments(parser)
    body.add_argument("--profile", metavar="DIR", help="write a torch profiler trace (DIR/trace.json) and print "
                      "a per-stage breakdown (front end, body, counting, host) of the body that runs (CUDA graphs off "
                      "while profiling); use with a small --max")
    return parser


def number_or_off(text: str) -> float:
    """``--grow``: a number >= 0, or off (infinity: no image draws on)."""
    value = math.inf if text == "off" else float(text)
    if not value >= 0:
        raise ValueError(text)
    return value


def _config_from_args(args: argparse.Namespace) -> CertifyConfig:
    from dmae_fast.run.config import SETTINGS, CertifyConfig

    engine = args.engine or args.ckpt or (str(DEMO_CHECKPOINT) if args.data == DEMO else None)
    if engine is None:
        raise UserError("--ckpt (or --engine) is required unless --data demo")
    engine = str(DEMO_CHECKPOINT) if engine == DEMO else engine
    out = args.out or f"certify-{Path(args.data).name or 'data'}-{datetime.now():%Y%m%d-%H%M%S}.tsv"
    settings = {k: v for k, v in vars(args).items() if k in SETTINGS and v is not None}
    settings.update(engine=engine, out=out, progress=not args.quiet, sigma=args.sigma,
                    radii=tuple(args.radii) if args.radii else None, looks=tuple(args.looks) if args.looks else None)
    # an incremental run without the reference's votes runs both classifiers on each noisy image: the plain body
    paired = args.reference is not None and not _keeps_votes(args.reference)
    body = body_options(args, os.environ, default="plain" if paired else "fast")
    return CertifyConfig.from_settings(settings, body)


def _keeps_votes(reference: str) -> bool:
    """Whether the run record of the reference ``reference`` names a votes file (False where it cannot be read:
    reading the reference says why)."""
    try:
        record = json.loads(Path(reference + ".json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and isinstance(record.get("votes"), dict)


def _print_summary(result: RunResult) -> None:
    import numpy as np

    from dmae_fast.analysis import (
        DEFAULT_RADII,
        average_certified_radius,
        format_table,
        reachable_radii,
        rounding_warning,
    )
    from dmae_fast.results.format import read_results
    from dmae_fast.stats.procedure import Procedure

    config, out = result.config, result.config.output.out
    ranks = f" by {result.world_size} processes" if result.world_size > 1 else ""
    if result.images == 0:  # a --resume of a finished run
        print(f"{PROG}: nothing left to certify: every image of the run is already in {out}", file=sys.stderr)
    else:
        print(f"{PROG}: {result.images} images in {result.elapsed_s:.1f} s{ranks} ({result.samples_per_s:,.0f} "
              f"noisy samples/s); results in {out}", file=sys.stderr)
    table = read_results(out)
    if len(table) == 0:
        return
    if warning := rounding_warning(table):  # rows of an older run that this one resumed
        print(f"{PROG}: warning: {warning}", file=sys.stderr)
    procedure = Procedure(config.procedure_spec())
    cap = procedure.max_radius() if table.kind == "certify" else None
    radii, note = reachable_radii(procedure.summary_radii(config.procedure.radii, DEFAULT_RADII), cap)
    print(format_table([table], radii))
    if note:
        print(note)
    if table.kind == "certify":
        print(f"average certified radius (ACR): {average_certified_radius(table):.3f}; "
              f"clean accuracy of the smoothed classifier: {np.mean(table.correct):.1%}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["analyze"]:
        from dmae_fast.cli.analyze import main as analyze_main

        return analyze_main(argv[1:])
    return run_reporting_errors(PROG, lambda: _run(argv))


def _run(argv: list[str]) -> int:
    """Parse ``argv``, check ``--out``, then launch ``--nproc-per-node`` ranks or certify and print the summary
    table (rank 0 only under torchrun). In a rank of ``--nproc-per-node`` the launcher says that the run was
    interrupted, and what it kept, and that a signal ended it while it started."""
    prog = None if in_launched_rank() else PROG
    try:
        with starting(prog):  # nothing is written before the run begins
            args = build_parser().parse_args(argv)  # before any heavy import: --help and option errors are quick
            config = _config_from_args(args)
            config.validate()
            if config.output.keep_votes is not None and max(args.nproc_per_node or 1, world_size()) > 1:
                raise UserError("--keep-votes writes its votes file from one process; run it without "
                                "--nproc-per-node or torchrun")
            if world_size() == 1:  # the ranks of a multi-process run check in step (rank 0 says it)
                from dmae_fast.run.inputs import check_inputs_before_loading
                from dmae_fast.run.output import check_out_before_loading

                check_out_before_loading(config)  # before torch: an --out this run must not write is refused at once
                check_inputs_before_loading(config)  # and a missing classifier, dataset or labels file
        if args.nproc_per_node is not None and world_size() == 1 and not in_launched_rank():
            from dmae_fast.run.output import record_path

            launched = LaunchedRun(PROG, config.output.out, record_path(config), config.output.overwrite)
            return launch_local(argv, launched, args.nproc_per_node, args.max_restarts)
        with starting(prog):  # torch, the engines: seconds of imports before anything is written
            from dmae_fast.run.driver import Run
        result = Run(config).certify()
        if result.primary:
            _print_summary(result)
        return 0
    except Interrupted as stop:
        if leave_to_launcher(stop.kept):
            raise AlreadyReported(stop.exit_status) from None
        raise


if __name__ == "__main__":  # python -m (torchrun's ranks): as the console script
    from dmae_fast.cli import entry

    sys.exit(entry.certify())
