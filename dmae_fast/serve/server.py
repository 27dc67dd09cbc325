"""Run a :class:`~dmae_fast.serve.service.Service` behind uvicorn until SIGTERM or SIGINT.

Start: open the classifier, run the warm-up batch, bind the socket (``port`` 0 picks a free
one), print one line naming the address, serve. Stop (SIGTERM/SIGINT): new requests get 503,
uvicorn stops accepting connections and waits for the requests in flight, which the scheduler
finishes (each within the per-request timeout); then the device thread stops. No answered
request is dropped: a request is either answered with its result or with an error status.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
import threading
from dataclasses import dataclass

import uvicorn

from dmae_fast.errors import UserError
from dmae_fast.serve.app import build_app
from dmae_fast.serve.config import ServeConfig
from dmae_fast.serve.service import Service

PROG = "dmae-serve"
BACKLOG = 2048


class _Server(uvicorn.Server):
    """uvicorn's server, draining the service on the first signal and not re-raising it afterwards
    (the command ends with one line and status 0 after a graceful stop)."""

    def __init__(self, config: uvicorn.Config, service: Service) -> None:
        super().__init__(config)
        self.service = service
        self.stopped_by: int | None = None

    def handle_exit(self, sig: int, frame) -> None:
        self.service.draining = True
        self.stopped_by = self.stopped_by or sig
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


@dataclass(frozen=True)
class ServeResult:
    address: str
    requests: int  # HTTP requests answered (any status)
    stopped_by: str | None  # the signal's name


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); UserError naming the problem."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        return socket.create_server((host, port), family=family, backlog=BACKLOG)
    except (OSError, UnicodeError) as error:
        raise UserError(f"cannot listen on {host}:{port}: {getattr(error, 'strerror', None) or error}") from None


def serve(config: ServeConfig, announce=lambda line: print(line, file=sys.stderr, flush=True)) -> ServeResult:
    """Serve until a signal; returns what was done."""
    sock = bind(config.host, config.port)  # a taken port fails before the classifier is loaded
    service = None
    try:
        service = Service(config)
        service.start()
        host, port = sock.getsockname()[:2]
        address = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        uv_config = uvicorn.Config(
            build_app(service), log_level="warning", access_log=config.access_log, lifespan="on",
            limit_concurrency=config.max_connections, timeout_graceful_shutdown=config.limits.timeout_s + 5,
            timeout_keep_alive=config.keep_alive_s, server_header=False)
        server = _Server(uv_config, service)
        indices = "" if config.first_index is None else \
            f" (consecutive image indices from {config.first_index}: clients can predict their noise)"
        announce(f"{PROG}: {service.body.description}, sigma {service.sigma}, seed {service.seed}{indices}, batch "
                 f"{config.batch}, max wait {config.max_wait_ms:g} ms; listening on {address}")
        server.run(sockets=[sock])
    finally:
        sock.close()
        if service is not None and service.scheduler.alive:
            service.stop()
    answered = int(sum(sample.value for metric in service.metrics.requests.collect() for sample in metric.samples
                       if sample.name.endswith("_total")))
    name = signal.Signals(server.stopped_by).name if server.stopped_by else None
    return ServeResult(address, answered, name)
