"""
The HTTP API: thin handlers that authenticate, scope the store to the caller's session, and call `ChatService`.

Every handler below ``/api/sessions/{session}`` receives exactly one store, ``root.for_session(caller.tenant,
session)``, from the `session_store` dependency: the tenant comes from the bearer token, never from the request, so a
handler cannot reach another tenant even by mistake, and another tenant's session, result or approval answers exactly
like one that does not exist (same status, same body). ``GET /api/sessions`` gets the caller's tenant's store,
``root.for_tenant(caller.tenant)``, from `tenant_store` in the same way, so it lists that tenant's sessions only.
"""

import json
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from haystack_integrations.offload import InvalidScopeIdError, OffloadError
from haystack_integrations.offload.sessions import (
    DEFAULT_PAGE_BYTES,
    MAX_PAGE_BYTES,
    ChatService,
    ResultPage,
    TurnProgress,
)
from haystack_integrations.offload.stores import FsspecToolResultStore
from offload_haystack_app.server.auth import Caller, TokenTable
from offload_haystack_app.server.events import (
    EVENT_STREAM,
    EVENT_STREAM_HEADERS,
    RunningTurns,
    turn_events,
    until_started,
    wants_event_stream,
)
from offload_haystack_app.server.views import (
    approval_view,
    audit_view,
    decision_outcome_view,
    result_view,
    session_view,
    transcript_view,
    turn_view,
)

# Raster images are shown inline; anything else binary is a download, so a stored HTML or SVG file can never run as a
# page of this origin (where the bearer token lives).
INLINE_MEDIA_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
# Edited tool arguments are stored in the approval record and passed to the tool: a person edits a few fields, so these
# bounds are far above real use and far below what would make records (and every later read of them) expensive.
MAX_ARGUMENTS_BYTES = 64 * 1024
MAX_ARGUMENTS_DEPTH = 32
MAX_ARGUMENTS_VALUES = 1000
DEFAULT_SESSIONS_LISTED = 100
MAX_SESSIONS_LISTED = 1000


class HttpError(OffloadError):
    """An error answered as ``{"error": code, "detail": ...}`` with `status`."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        """
        :param status: The HTTP status.
        :param code: A stable, machine-readable code.
        :param detail: A sentence for people.
        :param extra: More fields for the body.
        """
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.extra = extra


class MessageIn(BaseModel):
    """A user's message."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=20_000)


class DecisionIn(BaseModel):
    """A person's decision on one approval request."""

    model_config = ConfigDict(extra="forbid")

    approved: bool
    arguments: dict[str, Any] | None = Field(
        default=None,
        description=(
            f"Edited arguments (approvals only): at most {MAX_ARGUMENTS_BYTES} bytes as JSON, "
            f"{MAX_ARGUMENTS_DEPTH} levels deep and {MAX_ARGUMENTS_VALUES} keys and list items in all."
        ),
    )
    reason: str | None = Field(default=None, max_length=2000)

    @field_validator("arguments")
    @classmethod
    def _bounded_arguments(cls, arguments: dict[str, Any] | None) -> dict[str, Any] | None:
        if arguments is not None:
            check_arguments_bounds(arguments)
        return arguments


def check_arguments_bounds(arguments: dict[str, Any]) -> None:
    """
    Check edited tool arguments against `MAX_ARGUMENTS_DEPTH`, `MAX_ARGUMENTS_VALUES` and `MAX_ARGUMENTS_BYTES`.

    The walk is iterative and stops at the first bound passed, so a hostile document costs no more than the bounds.

    :param arguments: The arguments, as decoded from JSON.
    :raises ValueError: Naming the bound that was passed (the API answers 422 ``invalid_request``).
    """
    values = 0
    pending: list[tuple[Any, int]] = [(arguments, 1)]
    while pending:
        node, depth = pending.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        for child in children:
            values += 1
            if values > MAX_ARGUMENTS_VALUES:
                raise ValueError(f"arguments hold more than {MAX_ARGUMENTS_VALUES} keys and list items")
            if isinstance(child, dict | list):
                if depth + 1 > MAX_ARGUMENTS_DEPTH:
                    raise ValueError(f"arguments nest deeper than {MAX_ARGUMENTS_DEPTH} levels")
                pending.append((child, depth + 1))
    encoded = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), default=str)
    size = len(encoded.encode("utf-8", "surrogatepass"))  # JSON may carry lone surrogates ("\\ud800")
    if size > MAX_ARGUMENTS_BYTES:
        raise ValueError(f"arguments take {size} bytes as JSON, more than {MAX_ARGUMENTS_BYTES}")


def _service(request: Request) -> ChatService:
    service: ChatService = request.app.state.service
    return service


def caller(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """
    The authenticated caller, from the bearer token.

    :raises HttpError: 401 when the token is missing or unknown.
    """
    table: TokenTable = request.app.state.tokens
    found = table.caller(authorization)
    if found is None:
        raise HttpError(401, "unauthorized", "A valid bearer token is required.")
    return found


def session_store(request: Request, session: str, who: Annotated[Caller, Depends(caller)]) -> FsspecToolResultStore:
    """
    The store of the caller's tenant and this session: the only store a session handler gets.

    :raises HttpError: 400 when the session id is not a safe single path segment.
    """
    return _scoped(request, lambda root: root.for_session(who.tenant, session))


def tenant_store(request: Request, who: Annotated[Caller, Depends(caller)]) -> FsspecToolResultStore:
    """
    The store of the caller's tenant: the only store the session list gets.

    :raises HttpError: 400 when the tenant id is not a safe single path segment.
    """
    return _scoped(request, lambda root: root.for_tenant(who.tenant))


def _scoped(request: Request, scope: Callable[[FsspecToolResultStore], FsspecToolResultStore]) -> FsspecToolResultStore:
    # Ids from the path or the token that are not safe single path segments are the client's error.
    root: FsspecToolResultStore = request.app.state.root
    try:
        return scope(root)
    except (InvalidScopeIdError, TypeError) as error:
        raise HttpError(400, "invalid_id", str(error)) from error


T = TypeVar("T")


async def answer_turn(
    request: Request,
    run: Callable[[TurnProgress | None], Coroutine[Any, Any, T]],
    view: Callable[[T], dict[str, Any]],
) -> dict[str, Any] | StreamingResponse:
    """
    Answer a request that runs a turn: its JSON, or, with ``Accept: text/event-stream``, its progress as it happens.

    The one way the message POST and a decision (which may resume the conversation) answer. Streamed, the work runs in
    a task of its own (`RunningTurns`: a client that leaves does not end it) with a `TurnProgress`; the request waits
    until the turn is claimed, so what fails before that (a busy session, a pending approval, an unknown or decided
    request) is the usual JSON answer with its status, and what follows is the stream, ending with ``done`` (`view`
    of the outcome, the same JSON as without a stream) or ``error``. Work that ends without claiming a turn (a
    decision that leaves others pending) streams ``done`` alone.

    :param request: The request (its ``Accept`` header, and the app's running turns).
    :param run: Does the work, given the publisher, or None for a JSON client (its run is exactly as without one).
    :param view: The JSON answer, from the work's outcome.
    :returns: The JSON answer, or the event stream.
    """
    if not wants_event_stream(request.headers.get("accept")):
        return view(await run(None))
    progress = TurnProgress()
    running: RunningTurns = request.app.state.turns
    turn = running.start(run(progress))
    await until_started(turn, progress)
    return StreamingResponse(turn_events(turn, progress, view), media_type=EVENT_STREAM, headers=EVENT_STREAM_HEADERS)


Service = Annotated[ChatService, Depends(_service)]
Who = Annotated[Caller, Depends(caller)]
Store = Annotated[FsspecToolResultStore, Depends(session_store)]
TenantStore = Annotated[FsspecToolResultStore, Depends(tenant_store)]

router = APIRouter(prefix="/api")
# What a route that runs a turn answers (`answer_turn`): its JSON, or its progress as server-sent events.
TURN_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/json": {}, EVENT_STREAM: {"schema": {"type": "string"}}}}
}


@router.get("/health", response_model=None)
async def health(request: Request) -> dict[str, Any] | JSONResponse:
    """
    Readiness (503 while the worker drains after a stop signal, or before its store's exclusive creates are known to
    hold), which model answers (the page shows it; a scripted model is labelled as such), and that check's verdict.

    Unauthenticated, so the check shows its verdict only: its store and detail name the bucket and the endpoint.
    """
    service = _service(request)
    readiness = request.app.state.readiness
    not_ready = readiness.not_ready_because()
    body = {
        "status": "ok" if not_ready is None else "draining" if readiness.draining else "not_ready",
        "model": request.app.state.model_label,
        "scripted": request.app.state.scripted,
        "worker": service.worker,
        "exclusive_creates": {"verdict": readiness.exclusive_creates},
    }
    if not_ready is not None:
        return JSONResponse({**body, "detail": f"Not taking new work: {not_ready}."}, status_code=503)
    return body


@router.get("/me")
async def me(who: Who) -> dict[str, str]:
    """The caller's tenant and actor label."""
    return {"tenant": who.tenant, "actor": who.actor}


@router.get("/sessions")
async def list_sessions(
    store: TenantStore,
    service: Service,
    limit: Annotated[int, Query(ge=1, le=MAX_SESSIONS_LISTED)] = DEFAULT_SESSIONS_LISTED,
) -> dict[str, Any]:
    """The caller's sessions, most recently active first (one LIST of the tenant's scope), and how many there are."""
    sessions = await service.sessions(store)
    return {"sessions": [session_view(summary) for summary in sessions[:limit]], "total": len(sessions)}


@router.get("/sessions/{session}/messages")
async def read_messages(session: str, store: Store, service: Service) -> dict[str, Any]:
    """The session's conversation (an unknown session reads as an empty one)."""
    return transcript_view(session, await service.transcript(store))


@router.post("/sessions/{session}/messages", response_model=None, responses=TURN_RESPONSES)
async def send_message(
    request: Request, session: str, message: MessageIn, store: Store, service: Service, who: Who
) -> dict[str, Any] | StreamingResponse:
    """
    Answer a message: the reply, or the approvals the turn waits for.

    With ``Accept: text/event-stream`` the answer is a stream of server-sent events: the turn's progress as it happens
    (tool calls, results and offloads, approval requests, the model replying), then ``done`` with the same JSON as
    without a stream, or ``error``. Refusals before the turn starts are the usual JSON answers.
    """
    return await answer_turn(
        request,
        lambda progress: service.send_message(store, message.text, actor=who.actor, progress=progress),
        lambda outcome: turn_view(session, outcome),
    )


@router.post("/sessions/{session}/resume")
async def resume(session: str, store: Store, service: Service, who: Who) -> dict[str, Any]:
    """Continue a held conversation whose requests have all been decided or have expired."""
    return turn_view(session, await service.resume(store, actor=who.actor))


@router.get("/sessions/{session}/approvals")
async def list_approvals(session: str, store: Store, service: Service) -> dict[str, Any]:
    """The session's approval requests that wait for a decision."""
    return {"session": session, "pending": [approval_view(request) for request in await service.pending(store)]}


@router.post("/sessions/{session}/approvals/{request_id}", response_model=None, responses=TURN_RESPONSES)
async def decide(
    request: Request, session: str, request_id: str, decision: DecisionIn, store: Store, service: Service, who: Who
) -> dict[str, Any] | StreamingResponse:
    """
    Approve (optionally with edited arguments) or deny a request; the last decision resumes the conversation.

    With ``Accept: text/event-stream`` the resumed run streams as a message turn does (the approved call, its result
    and offload, the model replying, new approval requests), then ``done`` with the same JSON as without a stream, or
    ``error``. Refusals before the resume starts (an unknown, expired or decided request, an invalid edit, a busy
    session) are the usual JSON answers; a decision that leaves other requests pending streams ``done`` alone.
    """
    return await answer_turn(
        request,
        lambda progress: service.decide(
            store,
            request_id,
            approved=decision.approved,
            arguments=decision.arguments,
            reason=decision.reason,
            actor=who.actor,
            progress=progress,
        ),
        lambda outcome: decision_outcome_view(session, outcome),
    )


@router.get("/sessions/{session}/audit")
async def audit(session: str, store: Store, service: Service) -> dict[str, Any]:
    """The session's approval audit record, oldest first."""
    return {"session": session, "events": [audit_view(event) for event in await service.audit(store)]}


@router.get("/sessions/{session}/results")
async def list_results(session: str, store: Store, service: Service) -> dict[str, Any]:
    """The session's stored results, newest first."""
    return {"session": session, "results": [result_view(record) for record in await service.results(store)]}


@router.get("/sessions/{session}/results/{reference}")
async def fetch_result(
    reference: str,
    store: Store,
    service: Service,
    offset: Annotated[int | None, Query(ge=0)] = None,
    length: Annotated[int | None, Query(ge=1, le=MAX_PAGE_BYTES)] = None,
) -> Response:
    """
    One page of a result (``?offset=&length=``: one ranged read), or the whole result streamed in ranged chunks.

    Pages of text are cut on character boundaries; ``X-Next-Offset`` says where the next page starts.
    """
    if offset is None and length is None:
        first, chunks = await service.stream(store, reference)
        headers = _result_headers(first, paged=False)
        headers["Content-Length"] = str(first.total)
        return StreamingResponse(chunks, media_type=_served_type(first), headers=headers)
    page = await service.read_page(store, reference, offset=offset or 0, length=length or DEFAULT_PAGE_BYTES)
    return Response(content=page.data, media_type=_served_type(page), headers=_result_headers(page, paged=True))


def _served_type(page: ResultPage) -> str:
    if page.record.kind == "text" or page.media_type in INLINE_MEDIA_TYPES:
        return page.media_type
    return "application/octet-stream"


def _result_headers(page: ResultPage, *, paged: bool) -> dict[str, str]:
    headers = {
        "Cache-Control": "private, no-store",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'none'; sandbox",
        "X-Result-Kind": page.record.kind,
        "X-Result-Media-Type": page.media_type,
        "X-Result-Size": str(page.total),
    }
    if _served_type(page) == "application/octet-stream":
        headers["Content-Disposition"] = "attachment"
    if paged:
        headers["X-Result-Start"] = str(page.start)
        headers["X-Result-End"] = str(page.end)
        if page.next_offset is not None:
            headers["X-Next-Offset"] = str(page.next_offset)
    return headers
