"""``dmae-bench serve``: the server against the offline streamer, over loopback, in one run.

1. Offline: the library's :class:`~dmae_fast.batching.stream.StreamingCertifier` runs PREDICT
   (n samples per image) over demo digits in this process; its samples/s is the reference. It is
   measured before and after the server runs and the mean is used.
2. For each ``--max-wait-ms`` value a ``dmae-serve`` process is started on 127.0.0.1 (same
   classifier, batch size and body) and measured:

   * saturation: ``clients`` closed-loop clients (keep-alive connections, one request in flight
     each) send PREDICT requests back to back; samples answered per second after a warm-up,
     as a ratio of the offline rate;
   * latency at fractions (25%, 50%, 90%) of that saturation rate: open-loop Poisson arrivals
     (a request's latency runs from its scheduled arrival, so a slow server cannot slow the
     arrivals down), p50 and p99.

   The mean batch fill of each phase comes from the server's /metrics.

The clients run on the same machine as the server (on a 2-core CPU they compete for it); the
command is the same for a GPU (``--device cuda``).
"""

from __future__ import annotations

import http.client
import io
import json
import os
import platform
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from dmae_fast import __version__
from dmae_fast.base.errors import UserError
from dmae_fast.batching.bodies import BodyOptions, batch_body
from dmae_fast.batching.smoothing import Smoothing
from dmae_fast.batching.stream import SamplingPlan, StreamingCertifier
from dmae_fast.bench.config import ServeBenchConfig
from dmae_fast.data import demo_digits
from dmae_fast.engines.opening import EngineOptions, open_engine, resolve_device
from dmae_fast.run.host import device_name

SEED = 0


def _npy(image: torch.Tensor) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, image.numpy())
    return buffer.getvalue()


# --------------------------------------------------------------------------- offline reference


def offline_rate(config: ServeBenchConfig) -> float:
    """Samples/s of the offline streamer on PREDICT with the server's n, batch and body (after a warm-up)."""
    engine = open_engine(config.checkpoint, EngineOptions(device=config.device))
    smoothing = Smoothing(engine, engine.spec.sigma or 0.25, SEED, config.batch)
    streamer = StreamingCertifier(smoothing, SamplingPlan.predict(config.n),
                                  batch_body(smoothing, BodyOptions(fast=config.fast)))
    digits = demo_digits("test").images
    items = [(i, digits[i % len(digits)], 0) for i in range(config.offline_images)]
    list(streamer.run(items[: config.batch // config.n + 1]))  # warm-up: compiles the noise
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    samples = sum(int(done.counts.sum()) for done in streamer.run(items))
    return samples / (time.perf_counter() - start)


class OfflineReference:
    """The offline rate, each measurement in a fresh process like each server: on a shared machine the same
    code runs at rates differing by 10-20% from one process to the next, so neither side keeps one process."""

    def __init__(self, config: ServeBenchConfig) -> None:
        self.config = config
        self.rates: list[float] = []

    def rate(self) -> float:
        done = subprocess.run([sys.executable, "-m", "dmae_fast.bench.serve", json.dumps(asdict(self.config))],
                              capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise UserError(f"the offline measurement failed: {done.stderr.strip().splitlines()[-1:]}")
        self.rates.append(float(done.stdout.split()[-1]))
        return self.rates[-1]


# --------------------------------------------------------------------------- the server under load


class ServerProcess:
    """``dmae-serve`` on 127.0.0.1, a free port, as a child process."""

    def __init__(self, config: ServeBenchConfig, max_wait_ms: float) -> None:
        args = [sys.executable, "-m", "dmae_fast.cli.serve", "--ckpt", config.checkpoint, "--port", "0",
                "--batch", str(config.batch), "--max-wait-ms", str(max_wait_ms), "--seed", str(SEED),
                "--device", config.device, "--max-queue", "100000", "--timeout", "600", "--max-connections", "4096",
                "--keep-alive", "600",
                "--max-n", str(max(config.n, 1000))] + (["--fast"] if config.fast else [])
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            for line in self.process.stderr:
                self.lines.append(line)
                if "listening on" in line:
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + 300
        while not ready.wait(0.2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise UserError(f"dmae-serve did not start: {''.join(self.lines).strip()}")
        self.host, port = re.search(r"listening on http://([0-9.]+):([0-9]+)", "".join(self.lines)).groups()
        self.port = int(port)

    def metrics(self) -> dict[str, float]:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
        connection.close()
        wanted = ("dmae_serve_batch_fill_ratio_sum", "dmae_serve_batch_fill_ratio_count", "dmae_serve_samples_total")
        return {name: float(re.search(rf"^{name} (\S+)$", text, re.M).group(1)) for name in wanted}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                self.process.kill()


class Clients:
    """Keep-alive HTTP clients sending one-image PREDICT requests; they record (scheduled, done) times."""

    def __init__(self, server: ServerProcess, bodies: list[bytes], n: int) -> None:
        self.server, self.bodies, self.path = server, bodies, f"/v1/predict?n={n}"
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def _connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.server.host, self.server.port, timeout=600)

    def _send(self, connection: http.client.HTTPConnection, k: int) -> bool:
        try:
            connection.request("POST", self.path, body=self.bodies[k % len(self.bodies)],
                               headers={"Content-Type": "application/x-npy"})
            response = connection.getresponse()
            payload = json.loads(response.read())
        except (OSError, http.client.HTTPException, ValueError) as error:  # counted, never retried
            with self._lock:
                self.errors.append(repr(error))
            connection.close()
            return False
        if response.status != 200:
            with self._lock:
                self.errors.append(f"{response.status}: {payload}")
            return False
        return True

    def closed_loop(self, clients: int, seconds: float) -> list[tuple[float, float]]:
        """``clients`` clients, each sending its next request when the last is answered."""
        stop_at = time.perf_counter() + seconds
        times: list[tuple[float, float]] = []

        def client(c: int) -> None:
            connection, k = self._connection(), c
            while time.perf_counter() < stop_at:
                start = time.perf_counter()
                if self._send(connection, k):
                    with self._lock:
                        times.append((start, time.perf_counter()))
                else:
                    connection = self._connection()
                k += clients
            connection.close()

        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return times

    def open_loop(self, rate: float, seconds: float, workers: int, seed: int) -> list[tuple[float, float]]:
        """Poisson arrivals at ``rate`` requests/s for ``seconds``; latency from each scheduled arrival."""
        rng = random.Random(seed)
        arrivals, t = [], 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            arrivals.append(t)
        work: queue.Queue = queue.Queue()
        times: list[tuple[float, float]] = []

        def worker() -> None:
            connection = self._connection()
            while (item := work.get()) is not None:
                k, scheduled = item
                if self._send(connection, k):
                    with self._lock:
                        times.append((scheduled, time.perf_counter()))
                else:
                    connection = self._connection()
            connection.close()

        threads = [threading.Thread(target=worker) for _ in range(workers)]
        for thread in threads:
            thread.start()
        origin = time.perf_counter() + 0.2
        for k, offset in enumerate(arrivals):
            delay = origin + offset - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            work.put((k, origin + offset))
        for _ in threads:
            work.put(None)
        for thread in threads:
            thread.join()
        return times


class ForeignLoad:
    """Cores used by processes other than this one and the servers during a measurement (Linux /proc):
    the machine is shared, and another job's load changes the offline and the server rates differently."""

    def __init__(self, server_pids: list[int]) -> None:
        self.pids = (os.getpid(), *server_pids)
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def _snapshot(self) -> tuple[float, float, float] | None:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
            busy = sum(int(v) for i, v in enumerate(fields) if i not in (3, 4))  # all but idle and iowait
            ours = sum(sum(int(v) for v in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:15])
                       for pid in self.pids)  # utime, stime, cutime, cstime
        except (OSError, ValueError, IndexError):
            return None
        return time.monotonic(), busy / self.tick, ours / self.tick

    def __enter__(self) -> ForeignLoad:
        self.start, self.cores = self._snapshot(), None
        return self

    def __exit__(self, *exc) -> None:
        end = self._snapshot()
        if self.start is not None and end is not None and end[0] > self.start[0]:
            self.cores = max(0.0, ((end[1] - self.start[1]) - (end[2] - self.start[2])) / (end[0] - self.start[0]))


def _fill(before: dict[str, float], after: dict[str, float]) -> float:
    count = after["dmae_serve_batch_fill_ratio_count"] - before["dmae_serve_batch_fill_ratio_count"]
    return (after["dmae_serve_batch_fill_ratio_sum"] - before["dmae_serve_batch_fill_ratio_sum"]) / max(count, 1)


def _saturation_round(clients: Clients, config: ServeBenchConfig) -> tuple[float, int]:
    times = clients.closed_loop(config.clients, config.saturation_s)
    span = max(done for _, done in times) - min(start for start, _ in times)
    return len(times) * config.n / span, len(times)


def _latency(server: ServerProcess, clients: Clients, config: ServeBenchConfig, fraction: float, saturation: float,
             seed: int) -> dict:
    rate = fraction * saturation / config.n
    before = server.metrics()
    with ForeignLoad([server.process.pid]) as foreign:
        times = clients.open_loop(rate, config.seconds, max(16, int(rate * 2) + 8), seed=seed)
    after = server.metrics()
    latencies = np.array([done - scheduled for scheduled, done in times]) * 1000
    return {"fraction": fraction, "offered_requests_per_s": rate, "requests": len(times),
            "p50_ms": float(np.percentile(latencies, 50)), "p99_ms": float(np.percentile(latencies, 99)),
            "mean_ms": float(latencies.mean()), "fill": _fill(before, after), "foreign_cores": foreign.cores}


def measure(config: ServeBenchConfig, bodies: list[bytes], offline: OfflineReference, log) -> dict:
    """One server per --max-wait-ms value, all started first. Saturation: ``rounds`` rounds, each the offline
    streamer then every server in turn (the others idle), so that drift of the machine's speed hits all alike;
    medians. Latency: each server at fractions of its own saturation rate (the median of its rounds): on a
    shared machine one process of the same code runs up to 30% faster than another, and a load taken from
    another process's rate would overload a slow one."""
    servers = {t: ServerProcess(config, t) for t in config.max_waits_ms}
    try:
        clients = {t: Clients(server, bodies, config.n) for t, server in servers.items()}
        for c in clients.values():
            c.closed_loop(config.clients, config.warmup_s)
        offline_rates: list[float] = []
        server_rates: dict[float, list[float]] = {t: [] for t in servers}
        requests = dict.fromkeys(servers, 0)
        before = {t: server.metrics() for t, server in servers.items()}
        with ForeignLoad([server.process.pid for server in servers.values()]) as foreign:
            for r in range(config.rounds):
                log(f"dmae-bench serve: saturation round {r + 1} of {config.rounds}")
                offline_rates.append(offline.rate())
                order = list(servers)
                for t in order[r % len(order):] + order[: r % len(order)]:  # rotate who goes first
                    rate, count = _saturation_round(clients[t], config)
                    server_rates[t].append(rate)
                    requests[t] += count
        after = {t: server.metrics() for t, server in servers.items()}
        reference = float(np.median(offline_rates))
        pooled = float(np.median([rate for rates in server_rates.values() for rate in rates]))
        paired = {t: [rate / offline_rates[r] for r, rate in enumerate(rates)] for t, rates in server_rates.items()}
        rows = []
        for k, (t, server) in enumerate(servers.items()):
            log(f"dmae-bench serve: latency, --max-wait-ms {t:g}")
            saturation = float(np.median(server_rates[t]))
            rows.append({
                "max_wait_ms": t, "server_samples_per_s": server_rates[t], "saturation_samples_per_s": saturation,
                "saturation_ratio": saturation / reference, "paired_ratios": paired[t],
                "median_paired_ratio": float(np.median(paired[t])), "saturation_requests": requests[t],
                "saturation_fill": _fill(before[t], after[t]),
                "loads": [_latency(server, clients[t], config, f, saturation, seed=10 * k + j)
                          for j, f in enumerate(config.loads)],
                "errors": clients[t].errors[:10]})
        foreign_cores = foreign.cores
        return {"offline_samples_per_s": offline_rates, "offline_median": reference,
                "pooled_saturation_samples_per_s": pooled, "pooled_ratio": pooled / reference,
                "median_paired_ratio": float(np.median([x for ratios in paired.values() for x in ratios])),
                "saturation_foreign_cores": foreign_cores, "servers": rows}
    finally:
        for server in servers.values():
            server.stop()


def run_serve_bench(config: ServeBenchConfig,
                    log=lambda message: print(message, file=sys.stderr)) -> tuple[dict, list[Path]]:
    config.validate()
    if config.quick:
        config = ServeBenchConfig(**{**asdict(config), "seconds": 2.0, "saturation_s": 1.0, "rounds": 1,
                                     "warmup_s": 0.5, "offline_images": 20,
                                     "max_waits_ms": config.max_waits_ms[:2], "loads": config.loads[:1]})
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    digits = demo_digits("test").images
    images = [digits[i] for i in range(len(digits))]
    bodies = [_npy(image) for image in images[:100]]
    offline = OfflineReference(config)
    log(f"dmae-bench serve: starting {len(config.max_waits_ms)} servers (--max-wait-ms "
        f"{' '.join(f'{t:g}' for t in config.max_waits_ms)})")
    record = {
        "device": device_name(resolve_device(config.device)),
        "versions": {"dmae_fast": __version__, "torch": torch.__version__, "python": platform.python_version()},
        "config": asdict(config),
        **measure(config, bodies, offline, log),
    }
    paths = [out / "serve-bench.json", out / "serve-bench.md"]
    paths[0].write_text(json.dumps(record, indent=2) + "\n")
    paths[1].write_text(markdown(record))
    return record, paths


def _cores(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def markdown(record: dict) -> str:
    config = record["config"]
    offline = ", ".join(f"{r:,.0f}" for r in record["offline_samples_per_s"])
    lines = [f"# dmae-bench serve: {record['device']}", "",
             f"torch {record['versions']['torch']}, Python {record['versions']['python']}; {config['ckpt']} model, "
             f"PREDICT n = {config['n']} per request (one image), batch {config['batch']}, "
             f"{'--fast body' if config['fast'] else 'plain body'}. One server per --max-wait-ms value, all "
             f"started first. Saturation: {config['rounds']} rounds, each the offline streamer (same n, batch and "
             f"body, {config['offline_images']} images, in a fresh process) then {config['saturation_s']:g} s of "
             f"each server in turn with {config['clients']} closed-loop clients (the other processes idle).", "",
             f"Offline streamer, samples/s by round: {offline} (median {record['offline_median']:,.0f}). Server / "
             f"offline of the same round, median over all rounds and servers: **{record['median_paired_ratio']:.3f}**; "
             f"all server rounds pooled: median {record['pooled_saturation_samples_per_s']:,.0f} samples/s, "
             f"{record['pooled_ratio']:.3f} of the offline median. Other processes on the machine used "
             f"{_cores(record['saturation_foreign_cores'])} cores meanwhile.", "",
             "| --max-wait-ms | server samples/s (rounds) | median | / offline, by round | median of those "
             "| mean batch fill |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in record["servers"]:
        served = ", ".join(f"{r:,.0f}" for r in row["server_samples_per_s"])
        ratios = ", ".join(f"{r:.2f}" for r in row["paired_ratios"])
        lines.append(f"| {row['max_wait_ms']:g} | {served} | {row['saturation_samples_per_s']:,.0f} | {ratios} | "
                     f"{row['median_paired_ratio']:.3f} | {row['saturation_fill']:.2f} |")
    lines += ["", f"Latency from each request's scheduled arrival (Poisson arrivals, {config['seconds']:g} s per row) "
              "at fractions of that server's saturation rate (its median above); \"other cores\": CPU used by other "
              "processes meanwhile:",
              "", "| --max-wait-ms | load | requests/s | requests | p50 ms | p99 ms | mean batch fill | other cores |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in record["servers"]:
        for load in row["loads"]:
            lines.append(f"| {row['max_wait_ms']:g} | {load['fraction']:.0%} | {load['offered_requests_per_s']:.1f} | "
                         f"{load['requests']} | {load['p50_ms']:.1f} | {load['p99_ms']:.1f} | {load['fill']:.2f} | "
                         f"{_cores(load['foreign_cores'])} |")
    errors = [e for row in record["servers"] for e in row["errors"]]
    if errors:
        lines += ["", f"Client errors (first {len(errors)}): " + "; ".join(errors)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # one offline measurement in a fresh process (OfflineReference)
    print(offline_rate(ServeBenchConfig(**json.loads(sys.argv[1]))))
