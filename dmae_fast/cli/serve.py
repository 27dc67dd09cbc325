"""``dmae-serve``: certified predictions over HTTP, samples of concurrent requests batched together; a parser
over :func:`dmae_fast.serve.server.serve` (docs/serving.md). ``dmae-serve replay``: serve_replay.py."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

from dmae_fast.base.command import Parser, import_torch_while_starting, run_reporting_errors
from dmae_fast.base.errors import UserError

# Only light modules here: --help and option errors answer without importing torch or uvicorn.
from dmae_fast.batching.choices import PRECISION_CHOICES
from dmae_fast.cli.body_args import add_body_arguments, body_options
from dmae_fast.demo_files import DEMO, DEMO_CHECKPOINT
from dmae_fast.noise.sound_options import Sound, default_grid
from dmae_fast.run.inputs import check_classifier_file
from dmae_fast.serve.config import PROG, Defaults, Limits, ServeConfig


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Serve PREDICT and CERTIFY of a Gaussian-smoothed classifier over HTTP "
                    "(JSON); the noisy samples of concurrent requests share full batches; every answer carries the "
                    "seed and image index that reproduce it offline (docs/serving.md).")
    model = parser.add_argument_group("classifier")
    source = model.add_mutually_exclusive_group(required=True)
    source.add_argument("--ckpt", help="checkpoint (ours, official DMAE/MAE, timm); 'demo' for the embedded demo")
    source.add_argument("--engine", help="engine file (.onnx, .pt2, .engine/.plan with its sidecar) or checkpoint")
    model.add_argument("--sigma", type=float, help="noise level in [0,1] pixel units (default: the checkpoint's)")
    model.add_argument("--input-size", type=int, help="for checkpoints without our metadata (as dmae-certify)")
    model.add_argument("--normalize",
                       help="for checkpoints without our metadata: imagenet, cifar10, 'm1,m2,m3:s1,s2,s3'")
    model.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    model.add_argument("--precision", default="auto", choices=PRECISION_CHOICES)
    add_body_arguments(parser)
    sound = parser.add_argument_group("--sound (docs/sound.md)")
    sound.add_argument("--sound", action="store_true", help="answer every request with --sound's certificates: "
                       "images on the grid, the exact rounded Gaussian, the classifier on the exact grid sum")
    sound.add_argument("--sound-grid", type=int, help="the grid's levels L (images X / L; default 16 for the demo "
                       "checkpoint, else 255: 8-bit images)")
    sound.add_argument("--quantize", action="store_true", help="with --sound: round request images onto the grid "
                       "instead of refusing those off it (the certificate is then for the rounded image)")
    http = parser.add_argument_group("server")
    http.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    http.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0: a free port)")
    http.add_argument("--token-file", help="file holding a bearer token required on /v1/* and /metrics")
    http.add_argument("--max-connections", type=int, default=1024, help="concurrent connections (default 1,024; "
                      "503 beyond)")
    http.add_argument("--keep-alive", type=float, default=5.0, help="seconds an idle keep-alive connection is kept "
                      "open (default 5)")
    http.add_argument("--read-timeout", type=float, default=ServeConfig.read_timeout_s, help="seconds a client "
                      "has to send a request's line and headers (from connecting, or from its first byte on a "
                      "keep-alive connection), and again its body; 408 and the connection closed after (default "
                      f"{ServeConfig.read_timeout_s:g})")
    http.add_argument("--access-log", action="store_true", help="log every request (uvicorn's access log)")
    batching = parser.add_argument_group("batching")
    batching.add_argument("--batch", type=int, default=1000, help="noisy samples per forward pass (default 1000)")
    batching.add_argument("--max-wait-ms", type=float, default=5.0, help="run a partial batch once its oldest "
                          "row has waited this long (default 5)")
    batching.add_argument("--max-queue", type=int, default=256, help="images admitted and not yet answered; "
                          "429 beyond (default 256)")
    batching.add_argument("--slots", type=int, help="images on the device at once (default: from --batch and the "
                          "image size)")
    noise = parser.add_argument_group("noise key")
    noise.add_argument("--seed", type=int, help="64-bit noise seed (default: random at start; every answer names it)")
    noise.add_argument("--first-index", type=int, help="give images consecutive image indices from this one, as an "
                       "offline run over a dataset does; clients can then predict their noise, so only for trusted "
                       "clients (default: each image gets a random index when it is admitted)")
    defaults = parser.add_argument_group("request defaults")
    defaults.add_argument("--n0", type=int, default=Defaults.n0,
                          help=f"CERTIFY selection samples (default {Defaults.n0})")
    defaults.add_argument("--n", type=int, default=Defaults.n, help=f"samples (default {Defaults.n:,})")
    defaults.add_argument("--alpha", type=float, default=Defaults.alpha, help=f"default {Defaults.alpha}")
    limits = parser.add_argument_group("request limits")
    for field in fields(Limits):  # a flag per field, named after it (timeout_s: --timeout)
        default = field.default
        limits.add_argument("--" + field.name.removesuffix("_s").replace("_", "-"), dest=field.name, type=type(default),
                            help=f"default {default:,}" if isinstance(default, int) else f"default {default:g}")
    return parser


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    engine_path = args.engine or args.ckpt
    engine_path = str(DEMO_CHECKPOINT) if engine_path == DEMO else engine_path
    if args.token_file == "":
        raise UserError("--token-file must name a file")
    limits = Limits(**{f.name: getattr(args, f.name) for f in fields(Limits) if getattr(args, f.name) is not None})
    return ServeConfig(
        engine_path=engine_path, host=args.host, port=args.port, batch=args.batch, max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue, slots=args.slots, token_file=args.token_file, seed=args.seed,
        first_index=args.first_index, sigma=args.sigma, device=args.device, precision=args.precision,
        input_size=args.input_size, normalize=args.normalize, body=body_options(args, os.environ), sound=_sound(args),
        max_connections=args.max_connections, keep_alive_s=args.keep_alive, read_timeout_s=args.read_timeout,
        access_log=args.access_log, limits=limits, defaults=Defaults(args.n0, args.n, args.alpha))


def _sound(args: argparse.Namespace) -> Sound | None:
    """The server's ``--sound`` (grid: ``--sound-grid``, else the demo's or 8 bits), or None."""
    if not args.sound:
        if args.sound_grid is not None or args.quantize:
            raise UserError("--sound-grid and --quantize apply to --sound; add --sound")
        return None
    demo = (args.engine or args.ckpt) in (DEMO, str(DEMO_CHECKPOINT))
    grid = args.sound_grid if args.sound_grid is not None else default_grid(demo)
    return Sound(grid, args.quantize)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["replay"]:
        from dmae_fast.cli.serve_replay import main as replay_main

        return replay_main(argv[1:])

    def body() -> int:
        config = config_from_args(build_parser().parse_args(argv))
        config.validate()  # before the classifier is loaded
        check_classifier_file(config.engine_path)  # before torch: a mistyped path is refused at once
        import_torch_while_starting(PROG)
        from dmae_fast.serve.server import serve

        result = serve(config)
        how = f"stopped by {result.stopped_by}" if result.stopped_by else "stopped"
        print(f"{PROG}: {how} after answering {result.requests:,} requests", file=sys.stderr)
        return 0

    return run_reporting_errors(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
