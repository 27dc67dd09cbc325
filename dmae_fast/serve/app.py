"""The HTTP API (Starlette): /v1/predict, /v1/certify, /v1/model, /healthz, /metrics.

Every error is a JSON ``{"error": "...", "status": N}`` (the status codes: docs/serving.md, "Limits and errors");
a failure of the classifier or a bug is a 500, logged, and the server keeps serving."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import sys
import time
import traceback
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dmae_fast.base.errors import UserError
from dmae_fast.serve.device_thread import Closed, IndicesExhausted, QueueFull
from dmae_fast.serve.payloads import PayloadError, parse_request
from dmae_fast.serve.service import RequestTimeout, Service
from dmae_fast.stats.procedure import CERTIFY, PREDICT

Handler = Callable[[Request], Awaitable[Response]]


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status, headers=headers)


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body; 413 once it is known to exceed ``limit`` bytes, 408 if not all in within ``timeout_s``."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise PayloadError(400, "malformed Content-Length header")
        if int(declared) > limit:
            raise PayloadError(413, f"the body has {int(declared):,} bytes; the limit is {limit:,}")

    async def receive() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadError(413, f"the body exceeds the limit of {limit:,} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(receive(), timeout_s)
    except asyncio.TimeoutError:
        raise PayloadError(408, f"the body did not arrive within {timeout_s:g} s") from None


class ClientGone(Exception):
    """The client closed the connection before its answer was ready: its samples are dropped."""


async def until_disconnected(request: Request, work: Awaitable[dict]) -> dict:
    """``work``'s result, or :class:`ClientGone` (``work`` cancelled) if the client disconnects first (once the body
    is read, the server's next ASGI message for this request is the disconnect)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    answer, gone = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (answer, gone):
            if not task.done():
                task.cancel()
    if answer.done() and not answer.cancelled():
        return answer.result()
    with contextlib.suppress(asyncio.CancelledError):
        await answer  # let the cancellation drop the request's images
    raise ClientGone()


def build_app(service: Service) -> Starlette:
    """The application around a started :class:`Service`; its lifespan stops the service on shutdown."""
    limits = service.config.limits

    def authorize(request: Request) -> None:
        if service.token is None:
            return
        header = request.headers.get("authorization")
        if header is None:
            raise PayloadError(401, "missing bearer token: send 'Authorization: Bearer <token>'")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise PayloadError(401, "malformed Authorization header: expected 'Bearer <token>'")
        if not hmac.compare_digest(value.strip().encode("utf-8", "replace"), service.token.encode()):
            raise PayloadError(403, "wrong bearer token")

    def endpoint(name: str, handler: Handler, protected: bool = True) -> Handler:
        """Authentication, errors as JSON, and request metrics around one handler."""

        async def wrapped(request: Request) -> Response:
            start = time.perf_counter()
            try:
                if protected:
                    authorize(request)
                response = await handler(request)
            except PayloadError as problem:
                headers = {401: {"WWW-Authenticate": "Bearer"}, 408: {"Connection": "close"}}.get(problem.status)
                response = error(problem.status, problem.message, headers)
            except QueueFull as full:
                response = error(429, str(full), {"Retry-After": "1"})
            except (Closed, IndicesExhausted) as unavailable:
                response = error(503, str(unavailable))
            except RequestTimeout as late:
                response = error(504, str(late))
            except (ClientDisconnect, ClientGone):  # nobody reads it; 499 in the metrics, as nginx counts it
                response = error(499, "the client disconnected")
            except UserError as failure:  # the classifier gave NaN/infinite logits for an image: nothing certified
                print(f"dmae-serve: {name}: {failure}", file=sys.stderr)
                response = error(500, " ".join(str(failure).split()))
            except Exception as failure:  # noqa: BLE001 (a bug or a classifier failure: log it, keep serving)
                print(f"dmae-serve: {name}: {type(failure).__name__}: {failure}", file=sys.stderr)
                traceback.print_exc(file=sys.stderr)
                response = error(500, f"internal error ({type(failure).__name__}): {' '.join(str(failure).split())}")
            service.metrics.requests.labels(name, str(response.status_code)).inc()
            service.metrics.latency.labels(name).observe(time.perf_counter() - start)
            return response

        return wrapped

    def smoothing(kind: str) -> Handler:
        async def handler(request: Request) -> Response:
            if service.draining:
                raise Closed("the server is shutting down")
            body = await read_body(request, limits.max_body_bytes, service.config.read_timeout_s)
            parsed = await run_in_threadpool(parse_request, kind, request.headers.get("content-type"), body,
                                             list(request.query_params.multi_items()), service.shape, limits,
                                             service.config.defaults, service.config.sigma, service.config.sound)
            return JSONResponse(await until_disconnected(request, service.answer(parsed)))

        return handler

    async def model(request: Request) -> Response:
        return JSONResponse(service.model_info)

    async def healthz(request: Request) -> Response:
        stats = service.device_thread.stats()
        status = "draining" if service.draining else "ok" if service.device_thread.alive else "scheduler stopped"
        return JSONResponse({"status": status, "queue_images": stats.admitted, "device_images": stats.on_device,
                             "next_index": stats.next_index}, status_code=200 if status == "ok" else 503)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def http_error(request: Request, problem: HTTPException) -> Response:
        message = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed on "
                   f"{request.url.path}"}.get(problem.status_code, problem.detail)
        service.metrics.requests.labels("other", str(problem.status_code)).inc()
        return error(problem.status_code, message, dict(problem.headers or {}))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        await run_in_threadpool(service.stop)

    routes = [
        Route("/v1/predict", endpoint(PREDICT, smoothing(PREDICT)), methods=["POST"]),
        Route("/v1/certify", endpoint(CERTIFY, smoothing(CERTIFY)), methods=["POST"]),
        Route("/v1/model", endpoint("model", model), methods=["GET"]),
        Route("/healthz", endpoint("healthz", healthz, protected=False), methods=["GET"]),
        Route("/metrics", endpoint("metrics", metrics), methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
