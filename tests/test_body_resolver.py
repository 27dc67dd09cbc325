"""One body resolver (issue 36 items 4 and 6): the body options are resolved from the command line
in one place for dmae-certify, dmae-serve and its replay, and the start line, the run record and
/v1/model name the body that was actually built, and why."""

from __future__ import annotations

import json
import types

import pytest
from helpers import rows_without

from dmae_fast.base.command import Parser
from dmae_fast.base.errors import UserError
from dmae_fast.batching.bodies import ResolvedBody
from dmae_fast.batching.body_options import BodyOptions
from dmae_fast.batching.fast_body import FastBody
from dmae_fast.batching.stream import PlainBody
from dmae_fast.cli import serve, serve_replay
from dmae_fast.cli.body_args import add_body_arguments, body_options
from dmae_fast.cli.certify import main as certify_main
from dmae_fast.demo import DEMO_CHECKPOINT

TINY = ["--data", "demo", "--seed", "0",
        "--max", "1", "--n0", "10", "--n", "20", "--batch", "32", "--quiet", "--workers", "0",
        "--device", "cpu"]


@pytest.mark.parametrize(("flags", "name", "reason", "fast"), [
    (["--fast-parts", "fused"], "fast", "--fast-parts fused", False),  # was: "(plain body: the fast path's parts ...)"
    (["--fused"], "fast", "--fast-parts fused", False),  # the older spelling of the same part
    (["--body", "plain"], "plain", "--body plain", False),
    (["--fast"], "fast", "--fast", True),
])
def test_the_start_line_and_the_record_name_the_body_built(flags, name, reason, fast, tmp_path, capsys):
    out = tmp_path / "r.tsv"
    assert certify_main([*TINY, *flags, "--out", str(out)]) == 0
    record = json.loads(out.with_name("r.tsv.json").read_text())
    start = next(line for line in capsys.readouterr().err.splitlines() if " samples each, " in line)
    assert f"{record['engine']} ({name} body: {reason}), seed 0, batch 32" in start
    assert record["body"] == {"name": name, "reason": reason}
    assert record["config"]["fast"] is fast and record["config"]["body_reason"] == reason
    assert ("plain body" in start) == (name == "plain")
    assert ("fused" in record["engine"]) == ("fused" in " ".join(flags))



@pytest.mark.parametrize("body", ["plain", "fast"])
def test_profile_times_the_body_asked_for_and_changes_no_row(body, tmp_path, capsys):
    """--profile chooses no body: the plain body and the CPU fast body run as asked, their stages timed
    (the CPU fast body's workers make the noise and classify it: its front end is in its body's time)."""
    args = [*TINY, "--max", "2", "--n", "200", "--body", body]
    assert certify_main([*args, "--out", str(tmp_path / "plain.tsv")]) == 0
    profile = tmp_path / "profile"
    assert certify_main([*args, "--out", str(tmp_path / "timed.tsv"), "--profile", str(profile)]) == 0
    record = json.loads((tmp_path / "timed.tsv.json").read_text())
    assert record["body"] == {"name": body, "reason": f"--body {body}"}
    stages = {line.split()[0]: line.split()[1:] for line in (profile / "stages.txt").read_text().splitlines()}
    assert float(stages["body"][0]) > 0 and float(stages["counting"][0]) > 0
    assert (float(stages["front"][1]) > 0) == (body == "plain")  # "front end": the row's first word
    assert int(stages["total"][2]) >= 1  # batches
    assert rows_without(tmp_path / "plain.tsv") == rows_without(tmp_path / "timed.tsv")

def _args(*flags: str):
    """The body options' words as dmae-certify's parser reads them."""
    parser = Parser(prog="test")
    add_body_arguments(parser)
    return parser.parse_args(flags)


def test_the_body_choice_and_its_reason():
    default = "the default (--body plain runs the plain reference body)"
    assert (body_options(_args(), {}).fast, body_options(_args(), {}).reason) == (True, default)
    assert body_options(_args("--body", "plain"), {}).body == "plain"
    assert body_options(_args("--fast"), {"DMAE_FAST_BODY": "plain"}).reason == "--fast"
    assert body_options(_args("--body", "fast"), {"DMAE_FAST_BODY": "plain"}).reason == "--body fast"
    assert body_options(_args("--fast", "--body", "fast"), {}).fast  # the alias and its word agree
    assert body_options(_args(), {"DMAE_FAST_BODY": "plain"}).reason == "DMAE_FAST_BODY=plain"
    assert body_options(_args(), {}, default="plain").body == "plain"
    fused = body_options(_args("--fused", "--compile"), {"DMAE_FAST_BODY": "plain"})
    assert (fused.fast, fused.body, fused.reason) == (False, "fast", "--fast-parts fused,compile")  # their own body
    with pytest.raises(UserError, match="--body plain and --fast-parts fused contradict each other"):
        body_options(_args("--fused", "--body", "plain"), {})
    with pytest.raises(UserError, match="^--fast and --body plain contradict each other; give one$"):
        _args("--fast", "--body", "plain")
    with pytest.raises(UserError, match="^--body plain and --fast contradict each other; give one$"):
        _args("--body", "plain", "--fast")  # in either order
    with pytest.raises(UserError, match="DMAE_FAST_BODY='quick': choose fast or plain"):
        body_options(_args(), {"DMAE_FAST_BODY": "quick"})


def test_a_body_other_than_the_one_asked_for_says_why():
    plain = object.__new__(PlainBody)  # only its type is read
    assert str(ResolvedBody(plain, BodyOptions(fast=True, reason="--fast"))) == \
        "plain body: --fast; every fast body failed"
    plain.fallbacks = ["the fast body (fused) failed: no Triton", "the fast body (unfused) failed: out of memory"]
    assert ResolvedBody(plain, BodyOptions(fast=True, reason="--fast")).reason == \
        "--fast; every fast body failed; the fast body (fused) failed: no Triton; the fast body (unfused) failed: " \
        "out of memory"  # the notices of the bodies passed over, in the one reason
    token_body = types.SimpleNamespace(description="unfused front end + onnx fp32 engine")
    assert str(ResolvedBody(token_body, BodyOptions(reason="--body plain"))) == \
        "fast body: --body plain; a token engine runs only behind the fast body's front end"
    assert ResolvedBody(token_body, BodyOptions(compile=True)).reason == "--fast-parts compile"
    fast = object.__new__(FastBody)
    assert str(ResolvedBody(fast, BodyOptions(fast=True, reason="--fast"))) == "fast body: --fast"


def test_the_server_and_the_replay_take_dmae_certifys_body_options():
    args = ["--ckpt", "demo", "--fast", "--fast-parts", "fused,compile", "--cuda-graphs", "--cpu-runtime", "torch",
            "--noise", "reference"]
    config = serve.config_from_args(serve.build_parser().parse_args(args))
    assert config.body == BodyOptions(fast=True, fused=True, compile=True, cuda_graphs=True, noise="reference",
                                      cpu_runtime="torch", reason="--fast")
    replay = serve_replay.build_parser().parse_args(["a.json", "b.png", *args])
    assert body_options(replay, {}, default="plain") == config.body
    with pytest.raises(UserError, match="--cpu-runtime applies to --fast"):
        serve.config_from_args(serve.build_parser().parse_args(["--ckpt", "demo", "--body", "plain",
                                                                "--cpu-runtime", "torch"])).validate()


def test_the_server_runs_the_body_asked_for_and_says_which():
    """Was: dmae-serve dropped --fused (and had no --compile, --cuda-graphs, --cpu-runtime)."""
    from dmae_fast.serve.config import ServeConfig
    from dmae_fast.serve.service import Service

    argv = ["--ckpt", "demo", "--device", "cpu", "--batch", "32", "--seed", "0", "--fused"]
    config = serve.config_from_args(serve.build_parser().parse_args(argv))
    assert config.engine_path == str(DEMO_CHECKPOINT) and isinstance(config, ServeConfig)
    info = Service(config).model_info
    assert info["engine"].startswith("torch fused fp32 on cpu")
    assert info["body"] == {"name": "fast", "reason": "--fast-parts fused"}


def test_the_fast_paths_parts_are_one_option():
    """--fast-parts names the expert parts in one option (the older --fused/--compile/--cuda-graphs still
    name one part each, out of --help); a part it does not know is refused in one line."""
    from dmae_fast.cli.certify import build_parser

    parser = build_parser()
    args = parser.parse_args(["--data", "demo", "--seed", "0", "--fast-parts", "fused, cuda-graphs", "--compile"])
    options = body_options(args, {})
    assert (options.fused, options.compile, options.cuda_graphs) == (True, True, True)
    assert options.reason == "--fast-parts fused,compile,cuda-graphs"
    assert "--fused" not in parser.format_help() and "--fast-parts" in parser.format_help()
    refused = "^argument --fast-parts: graphs: name parts among fused, compile, cuda-graphs$"
    with pytest.raises(UserError, match=refused):
        parser.parse_args(["--data", "demo", "--seed", "0", "--fast-parts", "fused,graphs"])
