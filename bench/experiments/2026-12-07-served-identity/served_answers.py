"""Served answers and their replays, for comparing two checkouts (issue 57's "answers identical" check).

Runs the demo classifier's ``Service`` in-process on the CPU (no HTTP) at a fixed seed and first index: PREDICT,
CERTIFY, sequential CERTIFY, and a ``--sound`` server's CERTIFY; replays each answer with ``replay_answer`` (which
must find it identical) and writes every answer as JSON (an answer holds no timing field).

    python bench/experiments/2026-12-07-served-identity/served_answers.py OUT.json   (run from the checkout)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.noise.sound_options import Sound
from dmae_fast.serve.config import ServeConfig
from dmae_fast.serve.payloads import ParsedRequest
from dmae_fast.serve.receipt import replay_answer
from dmae_fast.serve.service import Service
from dmae_fast.stats.procedure import CERTIFY, PREDICT, ProcedureSpec


def answers(sound: Sound | None) -> dict:
    config = ServeConfig(engine_path=str(DEMO_CHECKPOINT), seed=4242, first_index=500, device="cpu", batch=256,
                         max_wait_ms=0)
    if sound is not None:  # before 5ec93eb --sound was a body option
        has_field = "sound" in {field.name for field in dataclasses.fields(ServeConfig)}
        config = replace(config, sound=sound) if has_field else replace(config, body=replace(config.body, sound=sound))
    service = Service(config)
    sigma, digits = service.config.sigma, demo_digits("test").images
    requests = {"certify": ((11, 3), ProcedureSpec(CERTIFY, 200, 0.001, sigma, 20, sound=sound is not None)),
                "predict": ((11, 21), ProcedureSpec(PREDICT, 100, 0.01, sigma, sound=sound is not None)),
                "sequential": ((0, 11), ProcedureSpec(CERTIFY, 1000, 0.001, sigma, 20, sequential=True,
                                                      sound=sound is not None))}
    out = {}
    service.start()
    try:
        for name, (which, spec) in requests.items():
            images = [digits[i] for i in which]
            answer = json.loads(json.dumps(asyncio.run(service.answer(ParsedRequest(spec, images)))))
            replay = replay_answer(answer, images, service.engine, 97)
            out[name] = {"answer": answer, "replay_identical": replay.identical}
    finally:
        service.stop()
    return out


def main() -> None:
    torch.set_num_threads(1)
    result = {"gaussian": answers(None), "sound": answers(Sound(16))}
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print({kind: {name: a["replay_identical"] for name, a in runs.items()} for kind, runs in result.items()})


if __name__ == "__main__":
    main()
