"""
`create_app`: the reference server as an ASGI application (FastAPI), with its web page.

One process holds one root store (one client and connection pool), one Agent and one `ChatService`, and nothing about
any session: run as many workers and replicas as the load needs (``uvicorn --workers 4``, or
``offload-haystack serve --workers 4``), all pointed at the same store.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from haystack_integrations.offload import OffloadError, StorageError, StoragePermissionError
from haystack_integrations.offload.sessions import ApprovalPendingConflict, ChatService, NotFoundError
from haystack_integrations.offload.stores import ExclusiveCreateCheck, FsspecToolResultStore
from offload_haystack_app.server.agent import build_agent
from offload_haystack_app.server.auth import TokenTable
from offload_haystack_app.server.errors import ERROR_STATUSES, NOT_FOUND_DETAIL, error_status
from offload_haystack_app.server.events import RunningTurns
from offload_haystack_app.server.metrics_endpoint import metrics_served
from offload_haystack_app.server.readiness import DrainingMiddleware, Readiness
from offload_haystack_app.server.routes import HttpError, router
from offload_haystack_app.server.settings import ServerSettings
from offload_haystack_app.server.startup import (
    check_once,
    check_until_known,
    refuse_a_store_that_cannot_coordinate,
    require_exclusive_creates_async,
)
from offload_haystack_app.server.views import approval_view

logger = logging.getLogger("offload_haystack_app.server")

# Beside this module, inside the package (wheels ship it): the page needs no build step and no CDN.
STATIC_DIR = Path(__file__).resolve().parent / "static"
PAGE_SECURITY_HEADERS = {
    # The page renders model output with textContent only; the policy is the second line of defence. It has no inline
    # script or style; images are results shown from blob: URLs; its one form is sent by script, so a form submission
    # (which would put the token in a URL) is never needed; no other site may frame it (clickjacking).
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' blob:; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Frame-Options": "DENY",  # for browsers that predate frame-ancestors
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """
    Build the reference server: the HTTP API under ``/api`` and the web page at ``/``.

    ```python
    from fastapi.testclient import TestClient
    from offload_haystack_app.server import ServerSettings, create_app

    app = create_app(ServerSettings(store="memory://example", tokens={"a-long-random-token-for-acme": "acme"}))
    with TestClient(app) as client:
        headers = {"Authorization": "Bearer a-long-random-token-for-acme"}
        reply = client.post("/api/sessions/chat-1/messages", json={"text": "Chart revenue"}, headers=headers)
    ```

    :param settings: The configuration; by default read from ``OFFLOAD_SERVER_*`` environment variables.
    :returns: The ASGI application.
    :raises ValueError: If no bearer token is configured.
    """
    settings = settings if settings is not None else ServerSettings()
    tokens = TokenTable(settings.tokens)
    if not len(tokens):
        raise ValueError(
            'No bearer tokens are configured: set OFFLOAD_SERVER_TOKENS=\'{"<token>": "<tenant>"}\' or '
            "OFFLOAD_SERVER_TOKENS_FILE (offload-haystack serve makes demo tokens when none are given)."
        )
    root = settings.results_store()
    agent = build_agent(
        settings.chat_generator(),
        offload_over_chars=settings.offload_over_chars,
        context_window=settings.resolved_context_window(),
        tool_delay=settings.scripted_tool_delay if settings.scripted else 0.0,
    )
    service = ChatService(
        agent,
        approval_ttl=settings.approval_ttl,
        turn_lease=settings.turn_lease,
        resume_lease=settings.resume_lease,
        system_prompt=settings.resolved_system_prompt(),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await root.warm_up_async()
        # Before the first request: on a store that ignores conditional writes no turn or approval could be made
        # exactly once. Free when this process checked already (`app_from_environment`, `serve`): verdicts are cached.
        # A store that does not answer yet (S3 starting beside this container) is no reason to exit: the worker
        # serves 503 not_ready, refuses new work, and checks again with backoff until the store answers.
        first = await check_once(root)
        checking: asyncio.Task[ExclusiveCreateCheck] | None = None
        if first.verdict == "unknown":
            readiness.exclusive_creates = first.verdict  # before the first request: new work is refused until known
            checking = asyncio.create_task(check_until_known(root, readiness, first=first))
        else:
            readiness.exclusive_creates = (await require_exclusive_creates_async(root)).verdict
        # From the first stop signal on: not ready, new work refused (DrainingMiddleware); the server is told to stop
        # (and closes its socket) once the requests in flight and the streamed turns running on have ended.
        readiness.watch_signals(other_work=lambda: len(app.state.turns))
        logger.info(
            "offload-haystack server %s: model: %s; store: %s; %d token(s) for %d tenant(s).",
            service.worker,
            settings.model_label(),
            _shown_store(settings.store),
            len(tokens),
            len(tokens.tenants()),
        )
        # Once per worker process: its own MeterProvider and its own port (with metrics_port set).
        try:
            with metrics_served(settings, worker=service.worker):
                yield
                readiness.drain()  # a shutdown without a signal (an embedding application's) drains too
                # Streamed turns whose clients left still run, and write-behind uploads may be in flight: both get
                # what is left of the drain time (the server's own wait for running requests took the rest).
                await app.state.turns.drain(readiness.remaining())
                await _settled_writes(root, readiness.remaining())
        finally:
            readiness.stop_watching()
            if checking is not None and not checking.done():
                checking.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await checking

    app = FastAPI(title="offload-haystack reference server", lifespan=lifespan, docs_url="/api/docs", redoc_url=None)
    app.state.root = root
    app.state.service = service
    app.state.turns = RunningTurns()
    app.state.readiness = readiness = Readiness(settings.drain_seconds)
    app.state.tokens = tokens
    app.state.model_label = settings.model_label()
    app.state.scripted = settings.scripted
    app.include_router(router)
    _add_error_handlers(app)
    # Outside everything but Starlette's error handler: an oversized body is refused before routing, auth or parsing.
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=settings.max_body_bytes)
    # Added last, so it runs first: a draining worker reads no body of a request it refuses.
    app.add_middleware(DrainingMiddleware, readiness=readiness)
    app.mount("/static", PageFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=PAGE_SECURITY_HEADERS)

    return app


class BodyLimitMiddleware:
    """
    Refuse request bodies over `max_body_bytes` with 413 ``body_too_large``, without reading them.

    A ``Content-Length`` over the limit is refused before the application runs and before a byte of the body is read.
    A body without one (chunked) is counted as it streams in: the chunk that passes the limit is never handed to the
    application, and the 413 goes out at once, so a worker never holds more than the limit of one request's body.
    This runs before routing and authentication (FastAPI reads a body before it resolves the token), so an
    unauthenticated client cannot make a worker buffer more than that either.

    A pure ASGI middleware (not ``BaseHTTPMiddleware``): it wraps ``receive`` and ``send`` and buffers nothing itself.

    ```python
    from fastapi import FastAPI
    from offload_haystack_app.server.app import BodyLimitMiddleware

    api = FastAPI()
    api.add_middleware(BodyLimitMiddleware, max_body_bytes=64 * 1024)  # added last: runs first
    ```
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        """
        :param app: The application behind the limit.
        :param max_body_bytes: The largest body passed on, in bytes.
        """
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request (or pass other connection types through untouched)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0
        started = False
        refused = False

        async def limited_receive() -> Message:
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    if not started:
                        refused = True
                        await self._refuse(scope, receive, send)
                    raise BodyTooLargeError(self.max_body_bytes)
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 is the answer; whatever the application makes of the error is dropped
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except BodyTooLargeError:
            if not refused:
                raise  # a response had started: nothing can be answered, let the server close the connection

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"The request body is larger than the server's limit of {self.max_body_bytes} bytes."
        # Connection: close, since the rest of the body is never read: the server drops it with the connection.
        response = _error_response(413, "body_too_large", detail, {"Connection": "close"})
        await response(scope, receive, send)


class BodyTooLargeError(OffloadError):
    """Raised to the application, from ``receive``, when a request body passes the server's limit."""

    def __init__(self, limit: int) -> None:
        """
        :param limit: The limit in bytes.
        """
        super().__init__(f"The request body is larger than {limit} bytes.")
        self.limit = limit


class PageFiles(StaticFiles):
    """The page's static files, served with the page's security headers (so none of them can be framed either)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        """
        One static file, with `PAGE_SECURITY_HEADERS`.

        :param path: The file's path below the static directory.
        :param scope: The request's ASGI scope.
        :returns: The response.
        """
        response = await super().get_response(path, scope)
        response.headers.update(PAGE_SECURITY_HEADERS)
        return response


def app_from_environment() -> FastAPI:
    """
    The application factory for ``uvicorn --factory``: settings from ``OFFLOAD_SERVER_*`` variables.

    The store's exclusive creates are checked here, before the app exists, so a store that cannot coordinate stops
    the worker with `ServerStartupError` in one line (uvicorn passes a factory's error on; a failed lifespan would be
    a traceback). A store that does not answer yet does not: the worker starts not ready (503 ``not_ready``) and
    checks again with backoff until it answers, as a container started before its S3 needs.

    :returns: The ASGI application.
    :raises ServerStartupError: If the store ignores or refuses exclusive creates.
    """
    settings = ServerSettings()
    refuse_a_store_that_cannot_coordinate(settings.results_store())
    return create_app(settings)


async def _settled_writes(root: FsspecToolResultStore, seconds: float) -> None:
    try:
        await asyncio.wait_for(root.settle_writes_async(), max(seconds, 0.1))
    except TimeoutError:
        logger.warning("Write-behind uploads still in flight at shutdown were left: their results stay inline.")


def _declared_length(scope: Scope) -> int | None:
    # An unreadable Content-Length is left to the server's parser; the count in `receive` still bounds the body.
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _shown_store(url: str) -> str:
    return url if "://" in url else str(Path(url).resolve())


def _error_response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail, **extra}, status_code=status, headers=headers)


def _add_error_handlers(app: FastAPI) -> None:
    async def refused(request: Request, error: Exception) -> JSONResponse:
        # The service's refusals, a missing result and storage failures: answered as `error_status` tells them.
        status, code, detail = error_status(error)
        if code == "storage_unavailable":
            where = getattr(error, "location", "") or "the store"
            logger.error(
                "Storage (%s) failed while serving %s %s", where, request.method, request.url.path, exc_info=error
            )
        return _error_response(status, code, detail)

    async def http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, HttpError)  # noqa: S101 - registered for HttpError only
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        return _error_response(error.status, error.code, error.detail, headers, **error.extra)

    async def pending(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, ApprovalPendingConflict)  # noqa: S101 - registered for this type only
        views = [approval_view(item) for item in error.pending]
        return _error_response(409, "approval_pending", str(error), pending=views)

    async def invalid(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)  # noqa: S101 - registered for this type only
        problems = [f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors()]
        return _error_response(422, "invalid_request", "; ".join(problems))

    async def starlette_http(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)  # noqa: S101 - registered for this type only
        if error.status_code == 404:
            # One body for every "not found": a missing result, another tenant's result and a bad path look the same.
            return _error_response(404, "not_found", NOT_FOUND_DETAIL)
        return _error_response(error.status_code, "http_error", str(error.detail))

    for error_type in (*ERROR_STATUSES, NotFoundError, StorageError, StoragePermissionError):
        app.add_exception_handler(error_type, refused)
    app.add_exception_handler(HttpError, http_error)
    app.add_exception_handler(ApprovalPendingConflict, pending)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, starlette_http)
