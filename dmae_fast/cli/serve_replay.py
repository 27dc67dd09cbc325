"""``dmae-serve replay ANSWER IMAGE... --ckpt CKPT``: check a server answer against its receipt, re-running
its counts offline. One line for each difference (the procedure and plan the receipt's settings give, the model's
and inputs' SHA-256, each result's counts and decision fields); exit status 0 when there is none, 1 when any field
differs, 2 on bad input (a malformed answer included)."""

from __future__ import annotations

import argparse
import json
import os

from dmae_fast.base.command import Parser, import_torch_while_starting, run_reporting_errors
from dmae_fast.base.errors import UserError
from dmae_fast.base.files import read_regular_file
from dmae_fast.batching.choices import PRECISION_CHOICES
from dmae_fast.cli.body_args import add_body_arguments, body_options
from dmae_fast.demo_files import DEMO, DEMO_CHECKPOINT
from dmae_fast.run.config import MAX_BATCH
from dmae_fast.run.inputs import check_classifier_file
from dmae_fast.serve.config import Limits

PROG = "dmae-serve replay"
MAX_ANSWER_BYTES = 256 * 2**20  # the files are regular files of at most these sizes (never a device or a FIFO)
MAX_IMAGE_BYTES = 1 << 30


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="Check a dmae-serve answer against its receipt: rebuild the procedure "
                    "from its settings, re-run the counts offline with the library's streaming certifier (seed, image "
                    "indices, plan), recompute every decision field and compare the model's and inputs' SHA-256; "
                    "exit 1 naming each difference.")
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
    add_body_arguments(parser)  # the default here: the plain reference body
    return parser


def replay(args: argparse.Namespace) -> int:
    if not 1 <= args.batch <= MAX_BATCH:
        raise UserError(f"--batch must be in [1, {MAX_BATCH:,}], got {args.batch}")
    options = body_options(args, os.environ, default="plain")
    options.validate()
    # the files, read (the classifier's checked) before torch loads: a mistyped path is one line at once
    try:
        document = json.loads(read_regular_file(args.answer, MAX_ANSWER_BYTES, "dmae-serve answer").decode("utf-8"))
    except (ValueError, RecursionError) as error:
        problem = "is nested too deeply" if isinstance(error, RecursionError) else f"is not JSON: {error}"
        raise UserError(f"{args.answer} {problem}") from None
    engine_path = args.engine or args.ckpt
    engine_path = str(DEMO_CHECKPOINT) if engine_path == DEMO else engine_path
    check_classifier_file(engine_path)
    files = [(path, read_regular_file(path, MAX_IMAGE_BYTES, "image file")) for path in args.images]
    import_torch_while_starting(PROG)
    from dmae_fast.batching.classifier import open_classifier
    from dmae_fast.serve.payloads import PayloadError, decode_image
    from dmae_fast.serve.receipt import read_answer, replay_answer, settings

    answer = read_answer(document)
    engine = open_classifier(engine_path, options, args.device, args.precision, args.input_size, args.normalize)
    shape = tuple(engine.spec.input_shape)
    images = []
    for path, data in files:
        try:
            images += decode_image(data, path, shape, Limits(max_images=1 << 20))
        except PayloadError as problem:
            raise UserError(problem.message) from None
    replayed = replay_answer(answer, images, engine, args.batch, options, engine_path)
    print(f"receipt: {settings(answer.receipt.spec)}, seed {answer.receipt.seed}")
    for difference in replayed.differences:
        print(difference)
    if not replayed.results:
        print("not replayed: the receipt records another procedure or plan than its settings give")
    for row in replayed.results:
        for difference in row.differences or ("identical counts (same input); every field it states is as recomputed",):
            print(f"index {row.index}: {difference}")
    return 0 if replayed.identical else 1


def main(argv: list[str] | None = None) -> int:
    return run_reporting_errors(PROG, lambda: replay(build_parser().parse_args(argv)))
