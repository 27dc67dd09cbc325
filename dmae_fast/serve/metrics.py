"""Prometheus metrics of one server (its own registry, served at /metrics)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dmae_fast.serve.device_thread import DeviceThreadStats

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
FILL_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.99, 1.0)
RATE_WINDOW_S = 10.0


class Metrics:
    """Requests, queue depth, batch fill, samples/s and latency histograms."""

    def __init__(self, stats: Callable[[], DeviceThreadStats], batch: int) -> None:
        self.batch = batch
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("dmae_serve_requests", "HTTP requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=registry)
        self.latency = Histogram("dmae_serve_request_seconds", "Time from receiving a request to its answer",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=registry)
        self.images = Counter("dmae_serve_images", "Images answered, by procedure", ["procedure"], registry=registry)
        self.samples = Counter("dmae_serve_samples", "Noisy samples classified", registry=registry)
        self.batches = Counter("dmae_serve_batches", "Batches run on the device", registry=registry)
        self.fill = Histogram("dmae_serve_batch_fill_ratio", "Rows of a batch / the batch size",
                              buckets=FILL_BUCKETS, registry=registry)
        self.batch_seconds = Histogram("dmae_serve_batch_seconds", "Host time to issue one batch (on a CPU: to run it)",
                                       buckets=LATENCY_BUCKETS, registry=registry)
        Gauge("dmae_serve_queue_images", "Images admitted and not yet answered",
              registry=registry).set_function(lambda: stats().admitted)
        Gauge("dmae_serve_device_images", "Images holding a slot on the device",
              registry=registry).set_function(lambda: stats().on_device)
        Gauge("dmae_serve_samples_per_second", f"Noisy samples/s over the last {RATE_WINDOW_S:g} s",
              registry=registry).set_function(self.samples_per_second)
        self._recent: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def on_batch(self, rows: int, seconds: float) -> None:
        """Called by the scheduler thread after each batch."""
        self.samples.inc(rows)
        self.batches.inc()
        self.fill.observe(rows / self.batch)
        self.batch_seconds.observe(seconds)
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, rows))
            self._forget(now)

    def samples_per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._forget(now)
            return sum(rows for _, rows in self._recent) / RATE_WINDOW_S

    def _forget(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
            self._recent.popleft()
