"""``dmae-serve`` over real HTTP: a server started on 127.0.0.1 with the demo model on the CPU.

Answers equal the offline streaming certifier's counts for the same seed and image index; hostile
and malformed requests get the right 4xx and the server keeps serving; a bounded concurrent load
loses, duplicates and mixes up no answer; timeouts, a full queue and SIGTERM behave as documented.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import io
import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import one_line_error, procedure_of, run_command, stream_counts
from PIL import Image

from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import ImageCounts
from dmae_fast.cli import serve as serve_cli
from dmae_fast.data import demo_digits
from dmae_fast.demo import DEMO_CHECKPOINT
from dmae_fast.engines.opening import EngineOptions, open_engine
from dmae_fast.run.record import result_row
from dmae_fast.serve.config import Limits
from dmae_fast.serve.payloads import decode_image
from dmae_fast.serve.receipt import plan_of, replay_answer
from dmae_fast.stats.rounded_gaussian import guarantee, sound_table

ROOT = Path(__file__).resolve().parents[1]
SEED, FIRST_INDEX, TOKEN = 12345, 1000, "s3cret-token"
MAIN_ARGS = ["--seed", str(SEED), "--first-index", str(FIRST_INDEX), "--batch", "256", "--max-wait-ms", "2",
             "--n0", "20", "--n", "100", "--max-n", "5000", "--max-images", "8", "--max-body-bytes", "65536",
             "--max-request-samples", "20000", "--timeout", "60", "--max-queue", "256", "--keep-alive", "120"]


# --------------------------------------------------------------------------- helpers


@dataclass
class Server:
    process: subprocess.Popen
    host: str
    port: int
    stderr: list[str]
    reader: threading.Thread | None = None  # reads stderr into ``stderr`` until the process closes it

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                token: str | None = TOKEN, timeout: float = 900) -> tuple[int, dict, object]:
        return request(self.host, self.port, method, path, body, headers, token, timeout)


def request(host, port, method, path, body=None, headers=None, token=TOKEN, timeout=900):
    """(status, headers, JSON or text) of one request on a fresh connection."""
    headers = dict(headers or {})
    if token is not None:
        headers.setdefault("Authorization", f"Bearer {token}")
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        try:
            payload = json.loads(data)
        except ValueError:
            payload = data.decode("utf-8", "replace")
        return response.status, dict(response.getheaders()), payload
    finally:
        connection.close()


def start_server(*args: str, timeout: float = 900) -> Server:
    process = subprocess.Popen([sys.executable, "-m", "dmae_fast.cli.serve", "--ckpt", "demo", "--port", "0", *args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in process.stderr:
            lines.append(line)
            if "listening on" in line:
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while not found.wait(0.2):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"dmae-serve did not start: {''.join(lines)}")
    host, port = re.search(r"listening on http://([0-9.]+):([0-9]+)", "".join(lines)).groups()
    return Server(process, host, int(port), lines, reader)


def stop_server(server: Server) -> None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(300)
        except subprocess.TimeoutExpired:
            server.process.kill()
    log = "".join(server.stderr)
    assert "Traceback" not in log and "never retrieved" not in log, log


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def picture_bytes(image: torch.Tensor, kind: str = "PNG", size: tuple[int, int] | None = None) -> bytes:
    pixels = (image[0].numpy() * 255).round().astype(np.uint8)
    picture = Image.fromarray(pixels).convert("RGB")
    if size is not None:
        picture = picture.resize(size)
    buffer = io.BytesIO()
    picture.save(buffer, kind)
    return buffer.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header claims width x height (a decompression bomb's header)."""
    buffer = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buffer, "PNG")
    data = bytearray(buffer.getvalue())
    struct.pack_into(">II", data, 16, width, height)
    struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def npy_claiming(shape: str, data: bytes) -> bytes:
    """A float32 .npy file whose header claims ``shape`` (numpy's header reader takes any tuple of ints)."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}".encode()
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


def requests_counted(server: Server, endpoint: str, status: int) -> float:
    """dmae_serve_requests_total{endpoint, status} from /metrics (0 if absent)."""
    metrics = server.request("GET", "/metrics")[2]
    found = re.search(rf'dmae_serve_requests_total{{endpoint="{endpoint}",status="{status}"}} ([0-9.]+)', metrics)
    return float(found.group(1)) if found else 0.0


def sent_before_closing(sock: socket.socket) -> bytes:
    """What the server sent on ``sock`` until it closed it (socket.timeout if it never does)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(4096):
            data += chunk
    return data


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def as_json(document) -> tuple[bytes, dict]:
    return json.dumps(document).encode(), {"Content-Type": "application/json"}


def sha(image: torch.Tensor) -> str:
    return hashlib.sha256(image.numpy().tobytes()).hexdigest()


def offline_counts(engine, receipt: dict, items: list[tuple[int, torch.Tensor]], batch: int = 97) -> dict:
    """Counts by image index from the library's streaming certifier (the offline re-run)."""
    procedure = procedure_of(receipt)
    assert procedure.plan == plan_of(receipt)
    smoothing = Smoothing(engine, receipt["sigma"], receipt["seed"], batch)
    return stream_counts(smoothing, [(i, image, 0) for i, image in items], procedure.plan, decide=procedure.decide)


def served_counts(result: dict, receipt: dict) -> np.ndarray:
    return np.array([result["counts"][phase.lower()] for phase in receipt["phases"]])


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def digits():
    return demo_digits("test").images


@pytest.fixture(scope="module")
def labels():
    return demo_digits("test").labels.numpy()


@pytest.fixture(scope="module")
def engine():
    return open_engine(DEMO_CHECKPOINT, EngineOptions(device="cpu"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("serve") / "token"
    token_file.write_text(TOKEN + "\n")
    server = start_server(*MAIN_ARGS, "--token-file", str(token_file))
    yield server
    stop_server(server)


# --------------------------------------------------------------------------- answers


def test_model_health_and_metrics(server):
    status, _, model = server.request("GET", "/v1/model")
    assert status == 200
    assert model["sigma"] == 0.25 and model["input_shape"] == [3, 8, 8] and model["num_classes"] == 10
    assert model["seed"] == SEED and model["class_names"][3] == "3" and len(model["model_sha256"]) == 64
    assert model["engine"].startswith("torch eager fp32 on cpu")
    assert model["image_indices"] == f"consecutive from {FIRST_INDEX}"
    status, _, health = server.request("GET", "/healthz", token=None)
    assert status == 200 and health["status"] == "ok" and health["next_index"] >= FIRST_INDEX
    assert any(f"consecutive image indices from {FIRST_INDEX}: clients can predict" in line for line in server.stderr)
    assert model["body"] == {"name": "plain", "reason": "DMAE_FAST_BODY=plain"}  # the suite's default
    assert any("(plain body: DMAE_FAST_BODY=plain)" in line for line in server.stderr)  # the start line says it too
    status, _, metrics = server.request("GET", "/metrics")
    assert status == 200
    for name in ("dmae_serve_requests_total", "dmae_serve_queue_images", "dmae_serve_batch_fill_ratio_bucket",
                 "dmae_serve_samples_per_second", "dmae_serve_request_seconds_bucket", "dmae_serve_samples_total"):
        assert name in metrics


def test_answers_equal_the_offline_api_for_the_same_seed_and_index(server, engine, digits, labels, tmp_path, capsys):
    images = [digits[i] for i in (0, 1, 2)]
    body, headers = as_json({"images": [b64(npy_bytes(image.numpy())) for image in images], "n": 300,
                             "alpha": 0.01})
    status, _, predicted = server.request("POST", "/v1/predict", body, headers)
    assert status == 200, predicted
    receipt = predicted["receipt"]
    assert receipt["seed"] == SEED and receipt["phases"] == ["PREDICTION"] and receipt["sizes"] == [300]
    assert receipt["sigma"] == 0.25 and receipt["alpha"] == 0.01
    indices = [r["index"] for r in predicted["results"]]
    assert indices == receipt["indices"] and indices == list(range(indices[0], indices[0] + 3))
    assert indices[0] >= FIRST_INDEX
    offline = offline_counts(engine, receipt, list(zip(indices, images)))
    for result, image in zip(predicted["results"], images):
        assert np.array_equal(served_counts(result, receipt), offline[result["index"]])
        assert result["input_sha256"] == sha(image)
        assert sum(result["counts"]["prediction"]) == 300 and result["abstain"] == (result["prediction"] == -1)

    png = picture_bytes(digits[3])
    status, _, certified = server.request("POST", "/v1/certify?n0=30&n=400&alpha=0.001", png,
                                          {"Content-Type": "image/png"})
    assert status == 200, certified
    (result,) = certified["results"]
    receipt = certified["receipt"]
    assert certified["procedure"] == "cohen-fixed-n" and receipt["sizes"] == [30, 400]
    (image,) = decode_image(png, "png", (3, 8, 8), Limits())
    offline = offline_counts(engine, receipt, [(result["index"], image)], batch=1000)
    assert np.array_equal(served_counts(result, receipt), offline[result["index"]])
    assert result["n0"] == 30 and result["n"] == 400 and result["n_a"] <= 400 and 0 <= result["p_a_lower"] <= 1
    assert result["radius"] >= 0 and result["input_sha256"] == sha(image)

    # the library's replay helper and `dmae-serve replay` say the same; another image does not reproduce it
    assert replay_answer(certified, [image], engine, batch=33, model_file=DEMO_CHECKPOINT).identical
    (tmp_path / "answer.json").write_text(json.dumps(certified))
    (tmp_path / "digit.png").write_bytes(png)
    (tmp_path / "other.npy").write_bytes(npy_bytes(digits[int(np.argmax(labels != labels[3]))].numpy()))
    args = ["replay", str(tmp_path / "answer.json"), "--ckpt", "demo", "--batch", "50"]
    assert serve_cli.main(args[:2] + [str(tmp_path / "digit.png")] + args[2:]) == 0
    assert f"index {result['index']}: identical counts (same input)" in capsys.readouterr().out
    assert serve_cli.main(args[:2] + [str(tmp_path / "other.npy")] + args[2:]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT counts" in out and "input differs" in out


def test_sequential_certify_is_reproducible_and_stops_early(server, engine, digits):
    body, headers = as_json({"images": [{"array": digits[i].tolist()} for i in (4, 5)], "n0": 20, "n": 5000,
                             "sequential": True})
    status, _, answer = server.request("POST", "/v1/certify", body, headers)
    assert status == 200, answer
    receipt = answer["receipt"]
    assert answer["procedure"].startswith("group-sequential-exact-K") and receipt["looks"]
    offline = offline_counts(engine, receipt, [(r["index"], digits[i]) for r, i in zip(answer["results"], (4, 5))])
    for result in answer["results"]:
        assert np.array_equal(served_counts(result, receipt), offline[result["index"]])
        assert result["n"] == sum(result["counts"]["estimation"]) <= 5000
    assert min(r["n"] for r in answer["results"]) < 5000  # clean digits stop at an early look
    # what dmae-certify writes for the same seed and index: the same certificate, field for field
    procedure = procedure_of(receipt)
    for result, i in zip(answer["results"], (4, 5)):
        row = result_row(procedure, ImageCounts(result["index"], 0, offline[result["index"]]), 0.0)
        assert (row.predict, row.radius, row.n0, row.n, row.nA, row.pA_lower, row.procedure) == (
            result["prediction"], result["radius"], result["n0"], result["n"], result["n_a"], result["p_a_lower"],
            answer["procedure"])


def test_jpeg_and_a_batch_npy_are_accepted(server, digits):
    jpeg = picture_bytes(digits[6], "JPEG")
    status, _, answer = server.request("POST", "/v1/predict?n=50", jpeg, {"Content-Type": "image/jpeg"})
    assert status == 200 and answer["results"][0]["n"] == 50
    stack = npy_bytes(digits[7:10].numpy())
    status, _, answer = server.request("POST", "/v1/predict", stack, {"Content-Type": "application/x-npy"})
    assert status == 200 and [r["n"] for r in answer["results"]] == [100] * 3  # the server's default n


# --------------------------------------------------------------------------- hostile and malformed requests


def _cases(digit: torch.Tensor) -> list[tuple[str, str, str, bytes | None, dict, int, str, str | None]]:
    """(name, method, path, body, headers, status, fragment of the error, token)."""
    good = npy_bytes(digit.numpy())
    npy = {"Content-Type": "application/x-npy"}
    js = {"Content-Type": "application/json"}
    one = {"image": b64(good)}

    def document(**fields) -> bytes:
        return json.dumps({**one, **fields}).encode()

    truncated = good[:-10]
    object_array = npy_bytes(np.array([{"a": 1}, None], dtype=object))
    return [
        ("no token", "POST", "/v1/predict", good, npy, 401, "missing bearer token", None),
        ("wrong token", "POST", "/v1/predict", good, npy, 403, "wrong bearer token", "nope"),
        ("basic auth", "POST", "/v1/predict", good, {**npy, "Authorization": "Basic dXNlcjpwYXNz"}, 401,
         "malformed Authorization", None),
        ("metrics need the token", "GET", "/metrics", None, {}, 401, "missing bearer token", None),
        ("GET on predict", "GET", "/v1/predict", None, {}, 405, "not allowed", TOKEN),
        ("POST on healthz", "POST", "/healthz", b"", {}, 405, "not allowed", TOKEN),
        ("unknown route", "GET", "/v1/train", None, {}, 404, "no route", TOKEN),
        ("path traversal", "GET", "/../../etc/passwd", None, {}, 404, "no route", TOKEN),
        ("no content type", "POST", "/v1/predict", good, {}, 415, "missing Content-Type", TOKEN),
        ("text/plain", "POST", "/v1/predict", good, {"Content-Type": "text/plain"}, 415, "unsupported", TOKEN),
        ("not JSON", "POST", "/v1/predict", b"{'image': 1", js, 400, "not valid JSON", TOKEN),
        ("JSON list", "POST", "/v1/predict", b"[1, 2]", js, 400, "must be an object", TOKEN),
        ("JSON too deep", "POST", "/v1/predict", b"[" * 30000 + b"]" * 30000, js, 400, "JSON", TOKEN),
        ("unknown field", "POST", "/v1/predict", document(command="rm -rf /"), js, 400, "unknown field 'command'",
         TOKEN),
        ("both image and images", "POST", "/v1/predict", document(images=[b64(good)]), js, 400, "exactly one",
         TOKEN),
        ("no image", "POST", "/v1/predict", b'{"n": 10}', js, 400, "exactly one", TOKEN),
        ("empty images", "POST", "/v1/predict", b'{"images": []}', js, 400, "non-empty list", TOKEN),
        ("images not a list", "POST", "/v1/predict", b'{"images": "abc"}', js, 400, "non-empty list", TOKEN),
        ("bad base64", "POST", "/v1/predict", b'{"image": "not base64!!"}', js, 400, "not valid base64", TOKEN),
        ("image is a number", "POST", "/v1/predict", b'{"image": 42}', js, 400, "must be a base64 string", TOKEN),
        ("not an image file", "POST", "/v1/predict", json.dumps({"image": b64(b"#!/bin/sh\nreboot\n")}).encode(), js,
         415, "not a PNG, JPEG or .npy", TOKEN),
        ("GIF body", "POST", "/v1/predict", b"GIF89a" + bytes(30), npy, 415, "not a PNG, JPEG or .npy", TOKEN),
        ("truncated PNG", "POST", "/v1/predict", picture_bytes(digit)[:40], {"Content-Type": "image/png"}, 400,
         "cannot decode", TOKEN),
        ("PNG of the wrong size", "POST", "/v1/predict", picture_bytes(digit, size=(16, 16)),
         {"Content-Type": "image/png"}, 422, "is 16x16", TOKEN),
        ("PNG header of 5000x5000", "POST", "/v1/predict", png_claiming(5000, 5000), {"Content-Type": "image/png"},
         413, "pixels", TOKEN),
        ("decompression bomb", "POST", "/v1/predict", png_claiming(100000, 100000), {"Content-Type": "image/png"},
         413, "pixels", TOKEN),
        ("pickled npy", "POST", "/v1/predict", object_array, npy, 400, "dtype object", TOKEN),
        ("truncated npy", "POST", "/v1/predict", truncated, npy, 400, "bytes follow", TOKEN),
        ("npy wrong shape", "POST", "/v1/predict", npy_bytes(np.zeros((3, 16, 16), np.float32)), npy, 422,
         "shape [3, 16, 16]", TOKEN),
        ("npy 2-D", "POST", "/v1/predict", npy_bytes(np.zeros((8, 8), np.float32)), npy, 422, "shape", TOKEN),
        ("npy NaN", "POST", "/v1/predict", npy_bytes(np.full((3, 8, 8), np.nan, np.float32)), npy, 422,
         "NaN or infinite", TOKEN),
        ("npy out of range", "POST", "/v1/predict", npy_bytes(np.full((3, 8, 8), 2.0)), npy, 422, "[0, 1]", TOKEN),
        ("npy int64", "POST", "/v1/predict", npy_bytes(np.zeros((3, 8, 8), np.int64)), npy, 400, "dtype int64",
         TOKEN),
        ("npy bad header", "POST", "/v1/predict", b"\x93NUMPY\x01\x00\x10\x00{'descr': os.system}", npy, 400,
         "not a valid .npy", TOKEN),
        ("array of strings", "POST", "/v1/predict", b'{"image": {"array": [["a"]]}}', js, 400, "numbers only", TOKEN),
        ("ragged array", "POST", "/v1/predict", b'{"image": {"array": [[1], [1, 2]]}}', js, 400, "rectangular",
         TOKEN),
        ("n = 0", "POST", "/v1/predict", document(n=0), js, 400, "n must be in", TOKEN),
        ("n above the limit", "POST", "/v1/predict", document(n=5001), js, 400, "n must be in", TOKEN),
        ("n as a string", "POST", "/v1/predict", document(n="100"), js, 400, "whole number", TOKEN),
        ("n as a boolean", "POST", "/v1/predict", document(n=True), js, 400, "whole number", TOKEN),
        ("n fractional", "POST", "/v1/predict", document(n=1.5), js, 400, "whole number", TOKEN),
        ("n huge", "POST", "/v1/predict", document(n=10**30), js, 400, "n must be in", TOKEN),
        ("alpha = 0", "POST", "/v1/predict", document(alpha=0), js, 400, "alpha must be in", TOKEN),
        ("alpha NaN", "POST", "/v1/predict", json.dumps({**one, "alpha": float("nan")}).encode(), js, 400,
         "not valid JSON", TOKEN),
        ("alpha above the limit", "POST", "/v1/predict", document(alpha=0.9), js, 400, "alpha must be in", TOKEN),
        ("query n not a number", "POST", "/v1/predict?n=1e3", good, npy, 400, "whole number", TOKEN),
        ("query alpha inf", "POST", "/v1/predict?alpha=inf", good, npy, 400, "decimal number", TOKEN),
        ("unknown query parameter", "POST", "/v1/predict?exec=1", good, npy, 400, "unknown query parameter", TOKEN),
        ("duplicate query parameter", "POST", "/v1/predict?n=10&n=20", good, npy, 400, "twice", TOKEN),
        ("query with JSON", "POST", "/v1/predict?n=10", document(), js, 400, "not the query string", TOKEN),
        ("n0 on predict", "POST", "/v1/predict", document(n0=10), js, 400, "unknown field 'n0'", TOKEN),
        ("n0 above the limit", "POST", "/v1/certify", document(n0=10**6), js, 400, "n0 must be in", TOKEN),
        ("sequential not a boolean", "POST", "/v1/certify", document(sequential="yes"), js, 400, "true or false",
         TOKEN),
        ("too many images", "POST", "/v1/predict", json.dumps({"images": [b64(good)] * 9}).encode(), js, 413,
         "limit is 8", TOKEN),
        ("too many samples", "POST", "/v1/certify", json.dumps({"images": [b64(good)] * 8, "n": 5000}).encode(), js,
         413, "noisy samples", TOKEN),
        ("body too large", "POST", "/v1/predict", b"x" * 70000, js, 413, "limit is 65,536", TOKEN),
    ]


def test_hostile_and_malformed_requests_get_the_right_4xx_and_the_server_keeps_serving(server, digits):
    cases = _cases(digits[0])
    assert len(cases) >= 30
    failures = []
    for name, method, path, body, headers, status, fragment, token in cases:
        got, _, payload = server.request(method, path, body, headers, token=token)
        ok = got == status and isinstance(payload, dict) and payload.get("status") == status \
            and fragment in payload.get("error", "")
        if not ok:
            failures.append(f"{name}: expected {status} '{fragment}', got {got} {payload!r:.300}")
    assert not failures, "\n".join(failures)
    # raw garbage on the socket: answered by the HTTP layer, the server stays up
    with socket.create_connection((server.host, server.port), timeout=300) as raw:
        raw.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64) + b"\r\n\r\n")
        raw.recv(1024)
    status, _, answer = server.request("POST", "/v1/predict?n=20", npy_bytes(digits[1].numpy()),
                                       {"Content-Type": "application/x-npy"})
    assert status == 200 and answer["results"][0]["n"] == 20
    assert server.request("GET", "/healthz", token=None)[0] == 200
    assert server.process.poll() is None


def test_401_says_how_to_authenticate(server):
    status, headers, _ = server.request("GET", "/v1/model", token=None)
    assert status == 401 and headers.get("www-authenticate", headers.get("WWW-Authenticate")) == "Bearer"


def _refusals(server: Server, cases: list[tuple[str, bytes, dict, str]]) -> list[str]:
    """(path, body, headers, fragment) requests that must each get a one-line 400 naming the problem."""
    failures = []
    for path, body, headers, fragment in cases:
        status, _, payload = server.request("POST", path, body, headers)
        message = payload.get("error", "") if isinstance(payload, dict) else ""
        if status != 400 or fragment not in message or len(message) > 200:
            failures.append(f"{path} {body[:60]!r}: expected 400 '{fragment}', got {status} {payload!r:.300}")
    return failures


def test_numbers_too_large_for_a_float_and_impossible_npy_shapes_are_400s(server, digits):
    npy = {"Content-Type": "application/x-npy"}
    pixels = bytes(3 * 8 * 8 * 4)
    alpha, headers = as_json({"image": b64(npy_bytes(digits[0].numpy())), "alpha": 10**400})
    failures = _refusals(server, [
        ("/v1/predict", alpha, headers, "alpha must be in [1e-12, 0.5] on this server, got 1000000000"),
        ("/v1/predict", npy_claiming("(3, -8, -8)", pixels), npy, "shape (3, -8, -8) has a dimension"),
        ("/v1/predict", npy_claiming("(-1, -3, 8, 8)", pixels), npy, "shape (-1, -3, 8, 8) has a dimension"),
        ("/v1/predict", npy_claiming("(True, 3, 8, 8)", pixels), npy, "shape (True, 3, 8, 8) has a dimension"),
        ("/v1/predict", npy_claiming(f"(0, {2**70}, 8, 8)", b""), npy, "holds no image"),
    ])
    assert not failures, "\n".join(failures)
    assert server.request("GET", "/healthz", token=None)[0] == 200
    assert "Traceback" not in "".join(server.stderr)


def test_duplicate_json_keys_and_numbers_that_are_not_plain_decimals_are_400s(server, digits):
    good = npy_bytes(digits[0].numpy())
    npy = {"Content-Type": "application/x-npy"}
    js = {"Content-Type": "application/json"}
    image = json.dumps(b64(good)).encode()
    array = json.dumps(digits[0].tolist()).encode()
    failures = _refusals(server, [
        ("/v1/predict", b'{"image": ' + image + b', "n": 10, "n": 20}', js, 'the JSON body has the key "n" twice'),
        ("/v1/predict", b'{"image": {"array": ' + array + b', "array": ' + array + b'}}', js,
         'the JSON body has the key "array" twice'),
        ("/v1/predict?alpha=0.0_1", good, npy, "alpha must be a decimal number such as 0.001, got '0.0_1'"),
        ("/v1/predict?alpha=%D9%A0.%D9%A0%D9%A1", good, npy, "alpha must be a decimal number"),  # Arabic-Indic 0.01
        ("/v1/predict?alpha=nan", good, npy, "alpha must be a decimal number"),
    ])
    assert not failures, "\n".join(failures)
    status, _, answer = server.request("POST", "/v1/predict?alpha=1e-3&n=20", good, npy)
    assert status == 200 and answer["receipt"]["alpha"] == 0.001


# --------------------------------------------------------------------------- load


def test_concurrent_clients_lose_duplicate_and_mix_up_no_answer(server, engine, digits):
    clients, per_client = 16, 10
    answers: dict[tuple[int, int], dict] = {}
    errors: list[str] = []

    def client(c: int) -> None:
        connection = http.client.HTTPConnection(server.host, server.port, timeout=900)  # keep-alive
        for k in range(per_client):
            image = digits[40 + c * per_client + k]
            certify = (c + k) % 2 == 1
            path = "/v1/certify?n0=20&n=100" if certify else "/v1/predict?n=100"
            try:
                connection.request("POST", path, body=npy_bytes(image.numpy()),
                                   headers={"Content-Type": "application/x-npy", "Authorization": f"Bearer {TOKEN}"})
                response = connection.getresponse()
                payload = json.loads(response.read())
            except Exception as error:  # noqa: BLE001
                errors.append(f"client {c} request {k} at {time.monotonic() - start:.1f} s: {error!r}")
                return
            if response.status != 200:
                errors.append(f"client {c} request {k}: {response.status} {payload}")
            answers[(c, k)] = payload
        connection.close()

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(900)
    elapsed = time.monotonic() - start
    assert not errors, errors[:5]
    assert len(answers) == clients * per_client and elapsed < 180
    indices = [a["results"][0]["index"] for a in answers.values()]
    assert len(set(indices)) == len(indices)  # no index served twice
    by_plan: dict[str, tuple[dict, list]] = {}
    for (c, k), answer in answers.items():
        image = digits[40 + c * per_client + k]
        (result,) = answer["results"]
        assert result["input_sha256"] == sha(image), "an answer for another client's image"
        assert answer["receipt"]["indices"] == [result["index"]]
        by_plan.setdefault(answer["procedure"], (answer["receipt"], []))[1].append((result["index"], image, result))
    assert set(by_plan) == {"predict", "cohen-fixed-n"}
    for receipt, items in by_plan.values():
        offline = offline_counts(engine, receipt, [(index, image) for index, image, _ in items], batch=500)
        for index, _, result in items:
            assert np.array_equal(served_counts(result, receipt), offline[index]), index
    status, _, metrics = server.request("GET", "/metrics")
    fill = re.search(r"dmae_serve_batch_fill_ratio_count ([0-9.e+]+)", metrics)
    assert fill and float(fill.group(1)) > 0


# --------------------------------------------------------------------------- --sound


@pytest.fixture(scope="module")
def sound_server():
    server = start_server("--sound", "--seed", "3", "--batch", "256", "--n0", "20", "--n", "100", "--max-n", "5000")
    yield server
    stop_server(server)


def off_grid(image: torch.Tensor, steps: float) -> np.ndarray:
    """``image`` as float64 with its first pixel ``steps`` of a step off the demo's 1/16 grid."""
    array = image.numpy().astype(np.float64)
    array.flat[0] += steps / 16 if array.flat[0] < 1 else -steps / 16
    return array


@pytest.mark.parametrize("steps", [5e-4, 9e-4])
def test_a_sound_server_refuses_a_float64_image_just_off_its_grid_in_every_format(sound_server, digits, steps):
    """Was answered 200 ("cohen-fixed-n sound"): a certificate for the rounded image, while its input_sha256
    named the one sent."""
    array = off_grid(digits[3], steps)
    npy = {"Content-Type": "application/x-npy"}
    for path, body, headers in [("/v1/certify", npy_bytes(array), npy), ("/v1/predict", npy_bytes(array[None]), npy),
                                ("/v1/certify", *as_json({"image": b64(npy_bytes(array))})),
                                ("/v1/certify", *as_json({"images": [{"array": array.tolist()}]}))]:
        status, _, payload = sound_server.request("POST", path, body, headers, token=None)
        assert status == 422, payload
        assert "image 0 of the request is not on the 1/16 grid" in payload["error"] and "\n" not in payload["error"]
        assert "start dmae-serve with --quantize" in payload["error"]


def test_a_sound_answer_states_the_failure_probability_of_its_samples(sound_server, digits):
    elements = math.prod(sound_server.request("GET", "/v1/model", token=None)[2]["input_shape"])
    for fields in ({"n": 100}, {"n": 2000, "alpha": 0.01, "sequential": True}):
        body = {"images": [{"array": digits[i].double().tolist()} for i in (0, 11)], **fields}
        status, _, answer = sound_server.request("POST", "/v1/certify", *as_json(body), token=None)
        assert status == 200, answer
        receipt = answer["receipt"]
        assert answer["procedure"].endswith(" sound") and receipt["sound_grid"] == 16
        # the plan's total (n0 + n: a sequential answer's cap), whatever an image stopped at
        total = procedure_of(receipt).plan.total
        assert total == 20 + fields["n"]
        stated = guarantee(sound_table(receipt["sigma"], 16), total, elements, fields.get("alpha", 0.001))
        for where in (receipt, *answer["results"]):
            assert where["tv_per_image"] == stated["tv_per_image"] > 0
            assert where["failure_probability"] == stated["failure_probability"] > receipt["alpha"]
        assert receipt["sound_quantize"] is False and "certified_image" not in receipt


# --------------------------------------------------------------------------- timeouts, queue bound, SIGTERM


@pytest.fixture(scope="module")
def small_server():
    server = start_server("--seed", "5", "--batch", "500", "--max-queue", "4", "--timeout", "5", "--max-n", "100000",
                          "--noise", "reference")
    yield server
    stop_server(server)


def _in_thread(server: Server, path: str, body: bytes, out: list) -> threading.Thread:
    thread = threading.Thread(target=lambda: out.append(server.request("POST", path, body, {
        "Content-Type": "application/x-npy"}, token=None)))
    thread.start()
    return thread


def _wait_for_queue(server: Server, images: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.request("GET", "/healthz", token=None)[2]["queue_images"] >= images:
            return
        time.sleep(0.05)
    raise AssertionError("the requests were never admitted")


def test_by_default_no_client_can_know_its_next_index(small_server, digits):
    """Without --first-index the index (so the noise) is drawn at admission: nothing announces the
    next one, and one client's consecutive requests do not get consecutive indices."""
    status, _, model = small_server.request("GET", "/v1/model", token=None)
    assert status == 200 and model["image_indices"] == "random"
    status, _, health = small_server.request("GET", "/healthz", token=None)
    assert status == 200 and health["next_index"] is None
    indices = []
    for i in range(4):
        status, _, payload = small_server.request("POST", "/v1/predict?n=10", npy_bytes(digits[i].numpy()),
                                                  {"Content-Type": "application/x-npy"}, token=None)
        assert status == 200
        indices.append(payload["results"][0]["index"])
    assert all(0 <= i < 2**32 for i in indices)
    assert all(abs(b - a) > 1 for a, b in zip(indices, indices[1:])), indices  # by chance: 3 x 3 / 2**32
    assert not any("clients can predict" in line for line in small_server.stderr)


def test_timeout_answers_504_and_a_full_queue_429(small_server, digits):
    image = npy_bytes(digits[0].numpy())
    slow: list = []
    thread = _in_thread(small_server, "/v1/predict?n=100000", image, slow)  # ~15 s of work, timeout 5 s
    _wait_for_queue(small_server, 1)
    four = npy_bytes(digits[0:4].numpy())
    status, headers, payload = small_server.request("POST", "/v1/predict?n=10", four,
                                                    {"Content-Type": "application/x-npy"}, token=None)
    assert status == 429 and "queue is full" in payload["error"] and headers.get("retry-after") == "1"
    thread.join(600)
    ((status, _, payload),) = slow
    assert status == 504 and "timeout" in payload["error"]
    status, _, payload = small_server.request("POST", "/v1/predict?n=10", four, {"Content-Type": "application/x-npy"},
                                              token=None)
    assert status == 200 and len(payload["results"]) == 4  # the timed-out image's rows were dropped


def test_a_client_that_disconnects_frees_its_samples(small_server, digits):
    body = npy_bytes(digits[0].numpy())
    with socket.create_connection((small_server.host, small_server.port), timeout=300) as raw:
        raw.sendall(b"POST /v1/predict?n=100000 HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-npy\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        _wait_for_queue(small_server, 1)
    closed = time.monotonic()  # freed by the disconnect, not by the 5 s timeout: counted 499, not 504
    while small_server.request("GET", "/healthz", token=None)[2]["queue_images"]:
        assert time.monotonic() - closed < 600, "the abandoned request kept its place"  # a hang guard
        time.sleep(0.05)
    status, _, metrics = small_server.request("GET", "/metrics", token=None)
    assert 'dmae_serve_requests_total{endpoint="predict",status="499"} 1.0' in metrics


def test_a_client_that_leaves_with_a_request_pipelined_behind_counts_as_499(small_server, digits):
    """uvicorn tells only a connection's newest request that its client left; the one being answered
    must learn it too (before, it kept its samples until the timeout and was never counted 499)."""
    left_before = requests_counted(small_server, "predict", 499)
    body = npy_bytes(digits[0].numpy())
    with socket.create_connection((small_server.host, small_server.port), timeout=300) as raw:
        raw.sendall(b"POST /v1/predict?n=100000 HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-npy\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
                    + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # pipelined: uvicorn's newest request
        _wait_for_queue(small_server, 1)
    closed = time.monotonic()
    while small_server.request("GET", "/healthz", token=None)[2]["queue_images"]:
        assert time.monotonic() - closed < 600, "the abandoned request kept its place"  # a hang guard
        time.sleep(0.05)
    assert requests_counted(small_server, "predict", 499) == left_before + 1


def test_sigterm_finishes_the_requests_in_flight_then_stops(small_server, digits):
    """Every request admitted before SIGTERM is answered with its result. (Was: SIGTERM once two of three were
    admitted, the third allowed a 503; on a busy machine the third had not yet been accepted, and its connection
    was reset when the server stopped listening. What a request read after SIGTERM gets is the 503 "shutting
    down": test_device_thread.py::test_images_admitted_before_close_are_answered_and_later_ones_refused.)"""
    answers: list = []
    threads = [_in_thread(small_server, "/v1/predict?n=1000", npy_bytes(digits[i].numpy()), answers)
               for i in range(3)]
    _wait_for_queue(small_server, 3)
    small_server.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(600)
    assert [status for status, _, _ in answers] == [200] * 3, answers
    assert all(sum(payload["results"][0]["counts"]["prediction"]) == 1000 for _, _, payload in answers)
    assert small_server.process.wait(600) == 0
    assert any("stopped by SIGTERM after answering" in line for line in small_server.stderr)
    with pytest.raises(OSError):
        request(small_server.host, small_server.port, "GET", "/healthz", token=None, timeout=5)


# --------------------------------------------------------------------------- slow clients


def test_slow_clients_are_cut_off_and_cannot_lock_the_others_out():
    """More slow clients than --max-connections (request line and one header, then silence or a byte
    now and then) hold every slot only until --read-timeout: then they get 408 and are closed, and
    other clients are answered while the slow ones still have their sockets open."""
    server = start_server("--max-connections", "40", "--read-timeout", "3", "--noise", "reference")
    address = (server.host, server.port)
    sockets: list[socket.socket] = []
    try:
        def connect(data: bytes) -> socket.socket:
            sockets.append(socket.create_connection(address, timeout=300))
            sockets[-1].sendall(data)
            return sockets[-1]

        body_late = connect(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-npy\r\n"
                            b"Content-Length: 1000\r\n\r\n\x93NUMPY")
        answered_early = connect(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc")
        silent = [connect(b"GET /healthz HTTP/1.1\r\nHost: x\r\n") for _ in range(25)]
        trickling = [connect(b"GET /healthz HTTP/1.1\r\nHost: x\r\n") for _ in range(25)]
        assert request(*address, "GET", "/healthz", token=None)[0] == 503  # every slot is taken
        start, statuses = time.monotonic(), []
        while len(statuses) < 5 or statuses[-5:] != [200] * 5:
            assert time.monotonic() - start < 15, statuses
            for sock in trickling:
                with contextlib.suppress(OSError):
                    sock.send(b"X")
            statuses.append(request(*address, "GET", "/healthz", token=None)[0])
            time.sleep(0.25)
        assert set(statuses) == {503, 200}, statuses
        for sock in silent:
            answer = sent_before_closing(sock)
            assert answer.startswith(b"HTTP/1.1 408 ") and answer.endswith(
                b'{"error": "the request line and headers did not arrive within 3 s", "status": 408}'), answer
        for sock in trickling:
            sent_before_closing(sock)  # closed by the server (with or without the 408 it may have reset)
        answer = sent_before_closing(body_late)
        assert answer.startswith(b"HTTP/1.1 408 ") and b'"the body did not arrive within 3 s"' in answer
        assert sent_before_closing(answered_early).startswith(b"HTTP/1.1 200 ")  # then closed: the body never came
        assert requests_counted(server, "predict", 408) == 1
    finally:
        for sock in sockets:
            sock.close()
        stop_server(server)


# --------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("args, message", [
    (["--ckpt", "demo", "--batch", "0"], "--batch must be in"),
    (["--ckpt", "demo", "--port", "70000"], "--port must be in"),
    (["--ckpt", "demo", "--max-wait-ms", "-1"], "--max-wait-ms must be in"),
    (["--ckpt", "demo", "--seed", "-1"], "--seed must be in"),
    (["--ckpt", "demo", "--first-index", str(2**32)], "--first-index must be in"),
    (["--ckpt", "demo", "--max-alpha", "2"], "--min-alpha <= --max-alpha < 1"),
    (["--ckpt", "demo", "--min-alpha", "1e-301"], "--min-alpha must be >= 1e-300"),
    (["--ckpt", "demo", "--n", "0"], "--n must be in"),
    (["--ckpt", "demo", "--sigma", "0"], "sigma must be"),
    (["--ckpt", "demo", "--timeout", "nan"], "--timeout must be"),
    (["--ckpt", "demo", "--read-timeout", "0"], "--read-timeout must be in (0, 3600] seconds"),
    (["--port", "0"], "one of the arguments --ckpt --engine is required"),
    (["--ckpt", "demo", "--batch", "many"], "invalid int value"),
    (["--ckpt", "demo", "--port", "0", "--token-file", "/nonexistent/token"], "cannot read --token-file"),
    (["--ckpt", "/nonexistent/model.safetensors", "--port", "0"], "/nonexistent/model.safetensors"),
    (["--ckpt", "demo", "--host", "no-such-host.invalid"], "cannot listen on no-such-host.invalid"),
])
def test_bad_command_lines_are_one_line_errors(args, message, capsys):
    one_line_error(run_command(serve_cli.main, capsys, *args), "dmae-serve", message)


def test_a_taken_port_is_a_one_line_error(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        refused = run_command(serve_cli.main, capsys, "--ckpt", "demo", "--port", taken.getsockname()[1])
    one_line_error(refused, "dmae-serve", "cannot listen on 127.0.0.1:")


def test_help_shows_byte_limits_as_whole_numbers():
    text = " ".join(serve_cli.build_parser().format_help().split())
    assert "--max-body-bytes MAX_BODY_BYTES default 8,388,608" in text and "e+" not in text
    assert "--read-timeout READ_TIMEOUT seconds a client has" in text


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "dmae-serve"
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0 and "--max-wait-ms" in done.stdout


def test_uvicorn_is_bounded_to_the_releases_the_read_deadline_was_verified_on(capsys, monkeypatch):
    """ReadDeadline relies on uvicorn internals: pyproject admits only the verified releases, the
    installed one is among them and has what ReadDeadline uses, and another is refused in one line."""
    import inspect

    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    from dmae_fast.serve import server as server_module

    (low, high) = server_module.UVICORN_VERIFIED
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert re.findall(r'"(uvicorn[^"]*)"', pyproject) == [f"uvicorn>={low[0]}.{low[1]},<{high[0]}.{high[1]}"]
    server_module.check_uvicorn()  # the installed release is in the range
    for name in ("connection_made", "connection_lost", "on_message_begin", "on_headers_complete",
                 "on_message_complete"):
        assert callable(getattr(HttpToolsProtocol, name))
    cycle_init = inspect.getsource(RequestResponseCycle.__init__)
    assert all(f"self.{name} =" in cycle_init for name in ("disconnected", "message_event", "response_complete"))
    assert "self.cycle" in inspect.getsource(HttpToolsProtocol) and uvicorn.__version__
    assert "self._captured_signals.append(sig)" in inspect.getsource(uvicorn.Server.handle_exit)
    monkeypatch.setattr(server_module, "check_uvicorn",
                        lambda real=server_module.check_uvicorn: real(f"{high[0]}.{high[1]}.0"))
    refused = run_command(serve_cli.main, capsys, "--ckpt", "demo", "--port", "0")
    one_line_error(refused, "dmae-serve", f"uvicorn {high[0]}.{high[1]}.0 is installed")
