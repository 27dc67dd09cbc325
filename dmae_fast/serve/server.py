"""Run a :class:`~dmae_fast.serve.service.Service` behind uvicorn until SIGTERM or SIGINT.

Connections that do not send a request in time are closed (:class:`ReadDeadline`), so slow clients cannot hold
the connection slots. On a signal, new requests get 503 and uvicorn waits for those in flight, which the scheduler
finishes (each within the per-request timeout): every admitted request is answered, with its result or an error."""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import socket
import sys
from dataclasses import dataclass

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from dmae_fast.base.errors import UserError
from dmae_fast.serve.app import build_app
from dmae_fast.serve.config import PROG, ServeConfig
from dmae_fast.serve.service import Service

BACKLOG = 2048
# ReadDeadline and _Server use uvicorn internals with no public equivalent; pyproject bounds uvicorn to these
UVICORN_VERIFIED = ((0, 29), (0, 55))  # [first, end): the minor releases they were verified on


def check_uvicorn(version: str = uvicorn.__version__) -> None:
    """Refuse (UserError) a uvicorn outside :data:`UVICORN_VERIFIED`: the read deadline relies on its internals."""
    (low, high), release = UVICORN_VERIFIED, tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if not low <= release < high:
        pin = f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
        raise UserError(f"uvicorn {version} is installed; dmae-serve's read deadline was verified on uvicorn {pin} "
                        f"(pip install 'uvicorn{pin}')")


class _Server(uvicorn.Server):
    """uvicorn's server, draining the service on the first signal and not re-raising it afterwards (a graceful
    stop ends with status 0). ``serve`` also captures the signals before the listening line, so one arriving
    before uvicorn's loop runs stops it as gracefully."""

    def __init__(self, config: uvicorn.Config, service: Service) -> None:
        super().__init__(config)
        self.service = service
        self.stopped_by: int | None = None

    def handle_exit(self, sig: int, frame) -> None:
        self.service.draining = True
        self.stopped_by = self.stopped_by or sig
        super().handle_exit(sig, frame)
        self._captured_signals.clear()  # what uvicorn's capture_signals would re-raise once it ends


class ReadDeadline(HttpToolsProtocol):
    """uvicorn's HTTP protocol with a deadline on receiving a request, and every unanswered request told
    when its client leaves (uvicorn itself times only idle keep-alive connections).

    A request's line and headers must arrive within ``read_timeout_s`` of connecting (keep-alive: of its first
    byte), else 408 and the connection is closed. Its body is the application's to time
    (:func:`dmae_fast.serve.app.read_body`); one answered without reading must still arrive by the deadline."""

    def __init__(self, *args, read_timeout_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout_s = read_timeout_s
        self.deadline: asyncio.TimerHandle | None = None
        self.unanswered: list[RequestResponseCycle] = []

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.deadline is None:
            self._arm()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.unanswered = [cycle for cycle in self.unanswered if not cycle.response_complete] + [self.cycle]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        for cycle in self.unanswered:  # uvicorn tells only the newest one (a request pipelined behind others)
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self.deadline = self.loop.call_later(self.read_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expired(self) -> None:
        self.deadline = None
        cycle = self.cycle
        if self.transport.is_closing():
            return
        if cycle is not None and cycle.scope is self.scope and not cycle.response_complete:
            self._arm()  # the application has the request and times its body (or will, once the one before is done)
            return
        if cycle is None or (cycle.response_complete and cycle.scope is not self.scope):  # nothing else to answer
            body = json.dumps({"error": f"the request line and headers did not arrive within "
                                        f"{self.read_timeout_s:g} s", "status": 408}).encode()
            self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        self.transport.close()


@dataclass(frozen=True)
class ServeResult:
    requests: int  # HTTP requests answered (any status)
    stopped_by: str | None  # the signal's name


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); UserError naming the problem."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        return socket.create_server((host, port), family=family, backlog=BACKLOG)
    except (OSError, UnicodeError) as error:
        raise UserError(f"cannot listen on {host}:{port}: {getattr(error, 'strerror', None) or error}") from None


def serve(config: ServeConfig) -> ServeResult:
    """Serve until a signal; returns what was done."""
    check_uvicorn()
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
            timeout_keep_alive=config.keep_alive_s, server_header=False, ws="none",
            http=functools.partial(ReadDeadline, read_timeout_s=config.read_timeout_s))
        server = _Server(uv_config, service)
        indices = "" if config.first_index is None else \
            f" (consecutive image indices from {config.first_index}: clients can predict their noise)"
        with server.capture_signals():  # from the listening line on, a signal is a graceful stop
            resolved = service.config
            print(f"{PROG}: {service.body.description} ({service.resolved}), sigma {resolved.sigma}, seed "
                  f"{resolved.seed}{indices}, batch {config.batch}, max wait {config.max_wait_ms:g} ms; listening on "
                  f"{address}", file=sys.stderr, flush=True)
            server.run(sockets=[sock])
    finally:
        sock.close()
        if service is not None and service.device_thread.alive:
            service.stop()
    answered = int(sum(sample.value for metric in service.metrics.requests.collect() for sample in metric.samples
                       if sample.name.endswith("_total")))
    name = signal.Signals(server.stopped_by).name if server.stopped_by else None
    return ServeResult(answered, name)
