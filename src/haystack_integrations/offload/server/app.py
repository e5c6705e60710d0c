"""
`create_app`: the reference server as an ASGI application (FastAPI), with its web page.

One process holds one root store (one client and connection pool), one Agent and one `ChatService`, and nothing about
any session: run as many workers and replicas as the load needs (``uvicorn --workers 4``, or
``offload-haystack serve --workers 4``), all pointed at the same store.
"""

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from haystack_integrations.offload.server._extra import SERVER_EXTRA_HINT

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, JSONResponse
    from fastapi.staticfiles import StaticFiles
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as import_error:  # pragma: no cover - depends on what is installed
    raise ImportError(SERVER_EXTRA_HINT) from import_error

from haystack_integrations.offload.errors import StorageError, StoragePermissionError
from haystack_integrations.offload.server.agent import build_agent
from haystack_integrations.offload.server.auth import TokenTable
from haystack_integrations.offload.server.errors import (
    AlreadyDecidedError,
    ApprovalExpiredConflict,
    ApprovalPendingConflict,
    InvalidDecisionError,
    InvalidMessageError,
    NotFoundError,
    NothingToResumeError,
    RunFailedError,
    SessionBusyError,
    TurnAbandonedError,
)
from haystack_integrations.offload.server.routes import HttpError, router
from haystack_integrations.offload.server.service import ChatService
from haystack_integrations.offload.server.settings import ServerSettings
from haystack_integrations.offload.server.views import approval_view
from haystack_integrations.offload.stores import FsspecToolResultStore

logger = logging.getLogger("haystack_integrations.offload.server")

# Beside this module, inside the package (wheels ship it): the page needs no build step and no CDN.
STATIC_DIR = Path(__file__).resolve().parent / "static"
NOT_FOUND_DETAIL = "Not found."
PAGE_SECURITY_HEADERS = {
    # The page renders model output with textContent only; the policy is the second line of defence.
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' blob:; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """
    Build the reference server: the HTTP API under ``/api`` and the web page at ``/``.

    ```python
    from fastapi.testclient import TestClient
    from haystack_integrations.offload.server import ServerSettings, create_app

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
    root = FsspecToolResultStore(settings.store, storage_options=settings.resolved_storage_options())
    agent = build_agent(
        settings.chat_generator(),
        offload_over_chars=settings.offload_over_chars,
        context_window=settings.resolved_context_window(),
    )
    service = ChatService(
        agent,
        approval_ttl=settings.approval_ttl,
        turn_lease=settings.turn_lease,
        system_prompt=settings.resolved_system_prompt(),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await root.warm_up_async()
        logger.info(
            "offload-haystack server %s: model: %s; store: %s; %d token(s) for %d tenant(s).",
            service.worker,
            settings.model_label(),
            _shown_store(settings.store),
            len(tokens),
            len(tokens.tenants()),
        )
        yield

    app = FastAPI(title="offload-haystack reference server", lifespan=lifespan, docs_url="/api/docs", redoc_url=None)
    app.state.root = root
    app.state.service = service
    app.state.tokens = tokens
    app.state.model_label = settings.model_label()
    app.state.scripted = settings.scripted
    app.include_router(router)
    _add_error_handlers(app)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=PAGE_SECURITY_HEADERS)

    return app


def app_from_environment() -> FastAPI:
    """
    The application factory for ``uvicorn --factory``: settings from ``OFFLOAD_SERVER_*`` variables.

    :returns: The ASGI application.
    """
    return create_app(ServerSettings())


def _shown_store(url: str) -> str:
    return url if "://" in url else str(Path(url).resolve())


def _body(code: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"error": code, "detail": detail, **extra}


def _add_error_handlers(app: FastAPI) -> None:
    simple: dict[type[Exception], tuple[int, str]] = {
        SessionBusyError: (409, "session_busy"),
        TurnAbandonedError: (409, "session_busy"),
        NothingToResumeError: (409, "nothing_to_resume"),
        AlreadyDecidedError: (409, "already_decided"),
        ApprovalExpiredConflict: (409, "approval_expired"),
        InvalidDecisionError: (422, "invalid_decision"),
        InvalidMessageError: (422, "invalid_message"),
        RunFailedError: (502, "run_failed"),
    }

    for error_type, (status, code) in simple.items():

        async def handle(request: Request, error: Exception, status: int = status, code: str = code) -> JSONResponse:
            return JSONResponse(_body(code, str(error)), status_code=status)

        app.add_exception_handler(error_type, handle)

    async def http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, HttpError)  # noqa: S101 - registered for HttpError only
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        return JSONResponse(_body(error.code, error.detail, **error.extra), status_code=error.status, headers=headers)

    async def not_found(request: Request, error: Exception) -> JSONResponse:
        # One body for every "not found": a missing result, another tenant's result and a bad path look the same.
        return JSONResponse(_body("not_found", NOT_FOUND_DETAIL), status_code=404)

    async def pending(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, ApprovalPendingConflict)  # noqa: S101 - registered for this type only
        views = [approval_view(item) for item in error.pending]
        return JSONResponse(_body("approval_pending", str(error), pending=views), status_code=409)

    async def storage(request: Request, error: Exception) -> JSONResponse:
        logger.error("Storage failed while serving %s %s", request.method, request.url.path, exc_info=error)
        return JSONResponse(_body("storage_unavailable", "The result store is unavailable."), status_code=503)

    async def invalid(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)  # noqa: S101 - registered for this type only
        problems = [f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors()]
        return JSONResponse(_body("invalid_request", "; ".join(problems)), status_code=422)

    async def starlette_http(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)  # noqa: S101 - registered for this type only
        if error.status_code == 404:
            return await not_found(request, error)
        return JSONResponse(_body("http_error", str(error.detail)), status_code=error.status_code)

    app.add_exception_handler(HttpError, http_error)
    app.add_exception_handler(NotFoundError, not_found)
    app.add_exception_handler(ApprovalPendingConflict, pending)
    app.add_exception_handler(StorageError, storage)
    app.add_exception_handler(StoragePermissionError, storage)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, starlette_http)
