"""``dmae-serve replay``: re-compute a server answer's counts offline and compare them.

    curl -s ... /v1/certify --data-binary @digit.png -H 'Content-Type: image/png' > answer.json
    dmae-serve replay answer.json digit.png --ckpt demo

Exit status 0 when every result's counts are identical, 1 when any differs, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dmae_fast.certification.choices import (
    DEMO,
    DEMO_CHECKPOINT,
    NOISE_CHOICES,
    PRECISION_CHOICES,
)
from dmae_fast.cli.common import Parser, parse_normalization, run_reporting_errors
from dmae_fast.errors import UserError
from dmae_fast.serve.config import Limits

PROG = "dmae-serve replay"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Re-run a dmae-serve answer offline from its receipt (seed, image "
                    "indices, plan) with the library's streaming certifier; compare the class counts.")
    parser.add_argument("answer", help="the JSON answer as the server sent it")
    parser.add_argument("images", nargs="+", help="the image files sent (PNG, JPEG or .npy), in the answer's order")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ckpt", help="the checkpoint the server ran ('demo' for the embedded demo)")
    source.add_argument("--engine", help="the engine file the server ran")
    parser.add_argument("--input-size", type=int)
    parser.add_argument("--normalize")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto", choices=PRECISION_CHOICES)
    parser.add_argument("--batch", type=int, default=1000, help="any batch size gives the same counts")
    parser.add_argument("--noise", default="compiled", choices=NOISE_CHOICES)
    parser.add_argument("--fast", action="store_true")
    return parser


def replay(args: argparse.Namespace) -> int:
    from dmae_fast.engines import EngineOptions, open_engine
    from dmae_fast.serve.payloads import PayloadError, decode_image
    from dmae_fast.serve.receipt import replay_answer

    try:
        answer = json.loads(Path(args.answer).read_text(encoding="utf-8"))
    except ValueError as error:
        raise UserError(f"{args.answer} is not JSON: {error}") from None
    if not isinstance(answer, dict):
        raise UserError(f"{args.answer} is not a dmae-serve answer")
    engine_path = args.engine or args.ckpt
    engine_path = str(DEMO_CHECKPOINT) if engine_path == DEMO else engine_path
    mean, std = parse_normalization(args.normalize)
    engine = open_engine(engine_path, EngineOptions(args.device, args.precision, args.input_size, mean, std))
    shape = tuple(engine.spec.input_shape)
    images = []
    for path in args.images:
        try:
            images += decode_image(Path(path).read_bytes(), path, shape, Limits(max_images=1 << 20))
        except PayloadError as problem:
            raise UserError(problem.message) from None
    rows = replay_answer(answer, images, engine, args.batch, args.noise, args.fast)
    for row in rows:
        verdict = "identical counts" if row.same_counts else f"DIFFERENT counts: served {row.served.tolist()}, " \
                                                              f"offline {row.offline.tolist()}"
        same = "same input" if row.same_input else "input differs from the one served (SHA-256)"
        print(f"index {row.index}: {verdict} ({same})")
    return 0 if all(row.same_counts for row in rows) else 1


def main(argv: list[str] | None = None) -> int:
    return run_reporting_errors(PROG, lambda: replay(build_parser().parse_args(sys.argv[1:] if argv is None else argv)))
