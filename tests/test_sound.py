"""``--sound`` end to end: the attack it defends against, the commands, the server and replay.

The noise itself (exact pmf, thresholds, bit-identity with the Triton kernel and C++) is tested in
test_sound_noise.py, test_sound_kernel.py and test_cpp.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest
import torch
from helpers import rows_without, stream
from PIL import Image

from dmae_fast.base.errors import UserError
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import PlainBody
from dmae_fast.cli.certify import main as certify_main
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines.base import Engine
from dmae_fast.model.config import ClassifierSpec, EncoderConfig
from dmae_fast.noise.compiled import NoiseSource
from dmae_fast.noise.patch_layout import PatchLayout
from dmae_fast.noise.sound_options import Sound
from dmae_fast.results.format import read_results
from dmae_fast.run.config import CertifyConfig
from dmae_fast.run.output import run_seed
from dmae_fast.serve.config import Defaults, Limits, ServeConfig
from dmae_fast.serve.payloads import ParsedRequest, PayloadError, parse_request
from dmae_fast.serve.receipt import read_answer, replay_answer
from dmae_fast.serve.service import Service
from dmae_fast.stats import rounded_gaussian
from dmae_fast.stats.decisions import certify_from_counts
from dmae_fast.stats.plan import SamplingPlan
from dmae_fast.stats.procedure import CERTIFY, ProcedureSpec
from dmae_fast.stats.rounded_gaussian import MAX_K, MAX_STEPS, sound_table, table_problem

CPU = torch.device("cpu")
SIGMA = 0.25
TWO_PI = 2.0 * math.pi


class TraceReader(Engine):
    """A classifier that reads a floating-point trace of its input's clean image x0 = 0.

    The noise contract's Box-Muller pairs (elements 4k, 4k+1 and 4k+2, 4k+3) are r (cos t, sin t) with
    t = float32(2 pi) * u, u on the grid (j + 1/2) 2**-23; at x0 = 0 the noisy pair is sigma r (cos t, sin t)
    exactly, so its angle sits on that grid to float32 rounding (~6e-8 rad) in every pair. Class 0 where
    90% of the pairs do; class 1 otherwise. Real Gaussians (or any x near x0) put about 40% of the angles
    within its tolerance of the grid, and the classifier says 1: it is constant on the real neighbourhood
    of x0 except at x0's own floating-point noise."""

    def __init__(self) -> None:
        encoder = EncoderConfig(embed_dim=8, depth=0, num_heads=1, patch_size=4, img_size=16, in_chans=1)
        self.spec = ClassifierSpec(encoder, num_classes=2, input_size=16, mean=(0.0,), std=(1.0,))
        self.device, self.precision, self.description, self.input = CPU, "fp32", "trace reader", "image"
        self.input_shape = self.spec.input_shape

    def classify(self, images: torch.Tensor) -> torch.Tensor:
        z = images.reshape(len(images), -1, 4).double()
        x, y = torch.cat((z[..., 0], z[..., 2]), 1), torch.cat((z[..., 1], z[..., 3]), 1)
        angle = torch.remainder(torch.atan2(y, x), TWO_PI)
        j = torch.floor(angle / TWO_PI * 2**23 - 0.5)
        nearest = torch.full_like(angle, math.inf)
        for step in (-1, 0, 1, 2):  # the generator's own float32 angles around it
            t = (TWO_PI * ((j + step + 0.5) * 2.0**-23).float()).double()
            nearest = torch.minimum(nearest, (angle - t).abs())
        return torch.where((nearest < 1.5e-7).double().mean(1) > 0.9, 0, 1)


def _counts(engine: Engine, image: torch.Tensor, plan: SamplingPlan, grid: int | None = None,
            seed: int = 0) -> np.ndarray:
    smoothing = Smoothing(engine, SIGMA, seed, 1000, None if grid is None else Sound(grid))
    [done] = stream(smoothing, [(0, image, 0)], plan, PlainBody(smoothing, NoiseSource(CPU, compiled=False, grid=grid)))
    return done.counts


class SeedReader(TraceReader):
    """A classifier made knowing a seed: it holds the exact noisy inputs a run with that seed feeds it at x0 and
    says class 0 on those, class 1 on everything else (so class 1 everywhere but on that one stream)."""

    def __init__(self, inputs: set[bytes]) -> None:
        super().__init__()
        self.inputs = inputs

    def classify(self, images: torch.Tensor) -> torch.Tensor:
        return torch.tensor([0 if row.numpy().tobytes() in self.inputs else 1 for row in images])

    @classmethod
    def made_for(cls, seed: int, x0: torch.Tensor, plan: SamplingPlan, grid: int | None) -> SeedReader:
        """The reader of the inputs that a run with ``seed`` draws at ``x0``, recorded by running it once."""
        seen: set[bytes] = set()

        class Recorder(TraceReader):
            def classify(self, images: torch.Tensor) -> torch.Tensor:
                seen.update(row.numpy().tobytes() for row in images)
                return torch.ones(len(images), dtype=torch.int64)

        _counts(Recorder(), x0, plan, grid, seed)
        return cls(seen)


def test_the_default_noise_certifies_a_false_radius_and_sound_noise_does_not():
    engine, x0 = TraceReader(), torch.zeros(1, 16, 16)
    counts = _counts(engine, x0, SamplingPlan.certify(100, 1000))
    certificate = certify_from_counts(counts[0], counts[1], 0.001, SIGMA)
    assert certificate.prediction == 0 and certificate.radius > 0.5
    # a point at distance 0.0016, far inside that radius, where every noisy sample says class 1
    adversarial = x0 + 1e-4
    assert float((adversarial - x0).norm()) < certificate.radius / 100
    assert _counts(engine, adversarial, SamplingPlan.predict(1000))[0].tolist() == [0, 1000]
    # --sound: the classifier sees the exact grid point (X + Z) / 255, which carries no trace of x0
    sound = _counts(engine, x0, SamplingPlan.certify(100, 1000), grid=255)
    assert certify_from_counts(sound[0], sound[1], 0.001, SIGMA).prediction != 0


def test_patch_rows_carry_the_same_sound_noise_as_images():
    layout = PatchLayout(3, 16, 4, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    clean = torch.randint(0, 256, (3, 3, 16, 16)).float() / 255
    rows = (torch.tensor([0, 1, 2, 0]), torch.tensor([5, 6, 7, 5]), torch.tensor([0, 1, 1, 2]),
            torch.tensor([0, 3, 4, 2**32 - 1]))
    images = NoiseSource(CPU, compiled=False, grid=255)(clean, rows[0], SIGMA, 2**40 + 5, *rows[1:])
    assert torch.equal(images * 255, torch.round(images * 255))  # grid points
    patches = NoiseSource(CPU, compiled=False, grid=255, layout=layout)(layout.arrange(clean), rows[0], SIGMA,
                                                                         2**40 + 5, *rows[1:])
    assert torch.allclose(patches, layout.inputs(images), rtol=0, atol=1e-6)


def _demo(tmp_path, name, *extra):
    out = tmp_path / f"{name}.tsv"
    assert certify_main(["--data", "demo", "--seed", "0",
                         "--max", "6", "--n0", "20", "--n", "100", "--batch", "64", "--quiet",
                         "--device", "cpu", "--out", str(out), *extra]) == 0
    return out


def test_dmae_certify_sound_rows_and_record_say_so(tmp_path):
    plain = _demo(tmp_path, "plain", "--sound", "--body", "plain")
    reference = _demo(tmp_path, "reference", "--sound", "--body", "plain", "--noise", "reference")
    header, *rows = [line.split("\t") for line in plain.read_text().splitlines()]
    assert {row[header.index("procedure")] for row in rows} == {"cohen-fixed-n sound"}
    assert rows_without(plain) == rows_without(reference)  # the C kernel's sound noise is the reference's
    record = json.loads((tmp_path / "plain.tsv.json").read_text())
    sound = record["sound"]
    assert sound["grid"] == 16 and sound["elements"] == 192 and sound["samples_per_image"] == 120
    assert sound["tv_per_image"] >= sound["tv_per_element"] * 120 * 192 > 0
    assert sound["failure_probability"] >= 0.001 + sound["tv_per_image"]
    assert "sound noise (1/16 grid)" in record["engine"]
    default = _demo(tmp_path, "default", "--body", "plain")
    assert json.loads((tmp_path / "default.tsv.json").read_text())["sound"] is None
    assert read_results(default).extra["procedure"][0] == "cohen-fixed-n"
    sequential = _demo(tmp_path, "sequential", "--sound", "--sequential", "--body", "plain")
    assert all(name.endswith(" sound") for name in read_results(sequential).extra["procedure"])


def test_off_grid_images_are_refused_or_quantized_when_asked(tmp_path, capsys):
    data = tmp_path / "images"
    data.mkdir()
    for i in range(2):  # 16-bit grey: decoded at full precision, off the 8-bit grid
        values = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000 + 7 + i).astype(np.uint16)
        Image.fromarray(values).save(data / f"{i}.png")
    (tmp_path / "labels.txt").write_text("0.png 0\n1.png 1\n")
    args = ["--ckpt", "demo", "--data", str(data), "--labels", str(tmp_path / "labels.txt"), "--image-size", "8",
            "--n0", "10", "--n", "20", "--quiet", "--device", "cpu", "--body", "plain", "--workers", "0"]
    assert certify_main([*args, "--sound", "--out", str(tmp_path / "refused.tsv")]) == 2
    start, *error = capsys.readouterr().err.strip().splitlines()  # the start line, then one line
    assert len(error) == 1 and "image 0 of the data is not on the 1/255 grid" in error[0] and "--quantize" in error[0]
    assert certify_main([*args, "--sound", "--quantize", "--out", str(tmp_path / "q.tsv")]) == 0
    assert read_results(tmp_path / "q.tsv").idx.tolist() == [0, 1]
    assert certify_main([*args, "--quantize", "--out", str(tmp_path / "x.tsv")]) == 2
    assert "--quantize applies to --sound" in capsys.readouterr().err


def test_a_config_asks_for_sound_on_the_datas_grid():
    settings = dict(engine="m", data="demo", out="o.tsv", sigma=0.25, sound=True)
    config = CertifyConfig.from_settings(settings)
    assert config.sound == Sound(16) and config.procedure_spec().sound
    assert CertifyConfig.from_settings({**settings, "data": "/imagenet/val"}).sound == Sound(255)
    with pytest.raises(UserError, match="--quantize applies to --sound"):
        CertifyConfig.from_settings({**settings, "sound": False, "quantize": True})


def _request(server: Sound | None, images: list[torch.Tensor], **fields: object) -> ParsedRequest:
    body = json.dumps({"images": [{"array": image.tolist()} for image in images], **fields}).encode()
    return parse_request(CERTIFY, "application/json", body, [], (3, 8, 8), Limits(), Defaults(), SIGMA, server)


def test_a_sound_servers_requests_are_checked():
    on_grid = [torch.randint(0, 17, (3, 8, 8)).float() / 16]
    assert _request(Sound(16), on_grid).spec.sound and not _request(None, on_grid).spec.sound
    assert _request(Sound(16), on_grid, sound=True).spec.sound
    with pytest.raises(PayloadError, match="runs without --sound"):
        _request(None, on_grid, sound=True)
    with pytest.raises(PayloadError, match="every request with --sound"):
        _request(Sound(16), on_grid, sound=False)
    off = [(on_grid[0] + 0.01).clamp(max=1)]
    with pytest.raises(PayloadError, match="image 0 of the request is not on the 1/16 grid") as refused:
        _request(Sound(16), off)
    assert refused.value.status == 422 and "start dmae-serve with --quantize" in refused.value.message
    assert torch.equal(_request(Sound(16, quantize=True), off).images[0], on_grid[0])  # 0.01 < half a step


def test_a_sound_answer_replays_as_identical():
    config = ServeConfig(engine_path=str(DEMO_CHECKPOINT), seed=7, first_index=40, device="cpu", batch=256,
                         max_wait_ms=0)
    service = Service(dataclasses.replace(config, sound=Sound(16)))
    images = [demo_digits("test").images[i] for i in (0, 11)]
    service.start()
    try:
        spec = ProcedureSpec(CERTIFY, 100, 0.001, service.config.sigma, 20, sound=True)
        answer = json.loads(json.dumps(asyncio.run(service.answer(ParsedRequest(spec, images)))))
    finally:
        service.stop()
    assert answer["procedure"] == answer["receipt"]["procedure"] == "cohen-fixed-n sound"
    assert answer["receipt"]["sound_grid"] == 16 and service.model_info["sound"] == {"grid": 16, "quantize": False}
    assert replay_answer(answer, images, service.engine, batch=64).identical
    # the same counts under the default noise differ: the replay really re-ran the sound noise
    del answer["receipt"]["sound_grid"]
    answer["procedure"] = answer["receipt"]["procedure"] = "cohen-fixed-n"
    assert not replay_answer(answer, images, service.engine, batch=64).identical


def test_a_sound_run_resumes_as_sound_only(tmp_path, capsys):
    out = tmp_path / "r.tsv"
    args = ["--data", "demo", "--seed", "0", "--n0", "20", "--n", "100", "--batch", "64", "--quiet", "--device", "cpu",
            "--body", "plain", "--max", "3", "--out", str(out)]
    assert certify_main([*args, "--sound"]) == 0
    rows = out.read_text().splitlines()
    out.write_text("\n".join(rows[:-1]) + "\n")  # the last image lost, as by a crash
    assert certify_main([*args, "--resume"]) == 2  # the kept rows are sound ones: refused in one line
    assert "--resume: sound differs from the run recorded in" in capsys.readouterr().err
    assert certify_main([*args, "--sound", "--resume"]) == 0
    assert out.read_text().splitlines()[:-1] == rows[:-1] and read_results(out).idx.tolist() == [0, 1, 2]
    assert set(read_results(out).extra["procedure"]) == {"cohen-fixed-n sound"}


@pytest.mark.parametrize("grid", [None, 255], ids=["default-noise", "sound"])
def test_a_classifier_that_knows_a_seed_forges_only_runs_with_that_seed(tmp_path, grid):
    """The guarantee assumes a classifier fixed independently of the seed: one made with a run's seed forges a
    certificate, so a run not given --seed draws a fresh one, which the forger cannot have known."""
    x0, plan, public = torch.zeros(1, 16, 16), SamplingPlan.certify(100, 1000), 0
    forger = SeedReader.made_for(public, x0, plan, grid)
    forged = _counts(forger, x0, plan, grid, seed=public)
    assert forged.tolist() == [[100, 0], [1000, 0]]
    assert certify_from_counts(forged[0], forged[1], 0.001, SIGMA).radius > 0.6  # false: class 1 all around x0
    config = CertifyConfig.from_settings(dict(engine="m", data="demo", out=str(tmp_path / "r.tsv")))
    seeds = {run_seed(config, "new", parts=False) for _ in range(3)}
    assert len(seeds) == 3 and public not in seeds and all(0 <= s < 2**64 for s in seeds)
    for seed in seeds:
        counts = _counts(forger, x0, plan, grid, seed=seed)
        assert counts.tolist() == [[0, 100], [0, 1000]]  # the truth: class 1, never a class-0 certificate


TOO_WIDE = "too wide for --sound"
BIN = Path(sys.executable).parent


def _one_line(done: subprocess.CompletedProcess, prog: str, fragment: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), done.stderr
    assert fragment in lines[0], lines[0]


def test_the_bound_on_a_table_passes_every_use_and_is_k_max():
    """grid * sigma <= MAX_STEPS: K <= MAX_K (the truncation at the bound); sigma 1 on the 8-bit and the demo
    grids and the settings the tests use pass, one step beyond is refused at once."""
    assert rounded_gaussian._truncation(MAX_STEPS / 4096, 4096) == MAX_K
    for sigma, grid in [(1.0, 255), (1.0, 16), (0.12, 16), (0.02, 255), (1 / 1024, 16), (100.0, 16), (1.0, 4096)]:
        assert table_problem(sigma, grid) is None, (sigma, grid)
    for sigma, grid in [(1.0, 4097), (16.1, 255), (1.0, 65536), (1e308, 255), (0.25, 2**63), (5e-324, 10**400)]:
        assert TOO_WIDE in table_problem(sigma, grid)
        with patch.object(rounded_gaussian, "_table", side_effect=AssertionError("a table was computed")), \
                pytest.raises(UserError, match=TOO_WIDE):
            sound_table(sigma, grid)  # refused before any table is computed
    assert "below 1e-06" in table_problem(1e-300, 2**63)


@pytest.mark.parametrize("args", [["--sigma", "1e308"], ["--sigma", "1000000"],
                                  ["--sigma", "0.25", "--grid", "1000000000"],
                                  ["--sigma", "0.25", "--grid", "9223372036854775808"]])
def test_dmae_sound_table_refuses_a_table_beyond_the_bound_at_once(tmp_path, args):
    done = subprocess.run([str(BIN / "dmae-sound-table"), *args, "--out", str(tmp_path / "t.npy")],
                          capture_output=True, text=True, timeout=600)  # a hang guard
    _one_line(done, "dmae-sound-table", TOO_WIDE)
    assert not list(tmp_path.iterdir())


def test_a_server_a_run_and_a_replay_beyond_the_bound_are_refused_at_once():
    with pytest.raises(UserError, match=TOO_WIDE):
        ServeConfig(engine_path="demo", sigma=100.0, sound=Sound(65536)).validate()
    done = subprocess.run([str(BIN / "dmae-serve"), "--ckpt", "demo", "--sound", "--sound-grid", "65536", "--sigma",
                           "100", "--port", "0"], capture_output=True, text=True, timeout=600)
    _one_line(done, "dmae-serve", TOO_WIDE)
    with pytest.raises(UserError, match=TOO_WIDE):
        settings = dict(engine="m", data="/imagenet/val", out="o.tsv", sigma=100.0, sound=True)  # the 1/255 grid
        CertifyConfig.from_settings(settings).validate()
    receipt = {"procedure": "cohen-fixed-n sound", "phases": ["SELECTION", "ESTIMATION"], "sizes": [20, 100],
               "looks": [100], "n": 100, "n0": 20, "alpha": 0.001, "sigma": 100.0, "seed": 7, "model_sha256": None,
               "indices": [0], "sound_grid": 65520}
    answer = {"procedure": "cohen-fixed-n sound", "results": [{}], "receipt": receipt}
    with pytest.raises(UserError, match=f"the receipt's sigma 100.0 on the 1/65520 grid is {TOO_WIDE}"):
        read_answer(answer)
    receipt.update(sigma=0.25, sound_grid=16)  # within the bound the receipt passes: the results come next
    with pytest.raises(UserError, match="results"):
        read_answer(answer)


def test_the_documented_demo_cost_is_what_a_demo_run_records():
    """docs/sound.md's figures for the README's demo run (sigma 0.25 on the 1/16 grid, n0 100 + n 10,000 samples
    of 3x8x8 elements), as the run record computes them."""
    from dmae_fast.run.record import guarantee

    stated = guarantee(sound_table(SIGMA, 16), 10_100, 192, 0.001)
    docs = (Path(__file__).resolve().parents[1] / "docs" / "sound.md").read_text()
    assert f"`tv_per_element` {stated['tv_per_element']:.3g}" in docs
    assert f"`tv_per_image` {stated['tv_per_image']:.3g}" in docs and f"it adds {stated['tv_per_image']:.3g}" in docs
    assert f"`failure_probability` {stated['failure_probability']!r}" in docs
