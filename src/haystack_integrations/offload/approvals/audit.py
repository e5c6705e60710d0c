"""
The session's audit record: one small document per event in ``.audit/``, named so that names sort in time order.
"""

import asyncio
import itertools
import secrets
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from haystack_integrations.offload.approvals.approval_records import ApprovalDecision, ApprovalRequest, AuditEvent
from haystack_integrations.offload.approvals.ledger import session_scope
from haystack_integrations.offload.errors import ResultNotFoundError
from haystack_integrations.offload.types import Documents, SessionDocumentSource

NAMESPACE = "audit"
_counter = itertools.count(1)
_clock_lock = threading.Lock()
_last_stamp = datetime.min.replace(tzinfo=UTC)


def _next_time() -> datetime:
    # Two events of one process in the same microsecond would otherwise sort by their random nonce.
    global _last_stamp
    with _clock_lock:
        stamp = max(datetime.now(UTC), _last_stamp + timedelta(microseconds=1))
        _last_stamp = stamp
        return stamp


def new_event(**fields: Any) -> AuditEvent:
    """
    Build an audit event stamped now.

    :param fields: The `AuditEvent` fields other than ``at``.
    :returns: The event.
    """
    return AuditEvent(at=_next_time(), **fields)


def request_event(event: str, request: ApprovalRequest, *, actor: str | None, **detail: Any) -> AuditEvent:
    """
    Build an audit event about one approval request, stamped now.

    :param event: What happened, e.g. ``"approval.invalid"``.
    :param request: The request it happened to (its session, step, call and arguments digest are recorded).
    :param actor: Who did it.
    :param detail: The event's details.
    :returns: The event.
    """
    return new_event(event=event, actor=actor, **_about(request), detail=detail)


class RecordedEvent(AuditEvent):
    """
    An event that restates a durable record: a held request, or a stored decision.

    Its time and content come from the record alone and its name from the request, so writing it again writes the
    same document: whoever finds it missing (a resume, before any call runs) can append it without a duplicate.
    """


def requested_event(request: ApprovalRequest) -> RecordedEvent:
    """
    :param request: A held (durable) request.
    :returns: Its ``approval.requested`` event, at the time the request was made.
    """
    return RecordedEvent(at=request.created, event="approval.requested", actor=request.requested_by, **_about(request))


def decided_event(request: ApprovalRequest, record: ApprovalDecision) -> RecordedEvent:
    """
    :param request: A held request.
    :param record: Its stored decision.
    :returns: Its ``approval.decided`` event, at the time the decision was recorded.
    """
    return RecordedEvent(
        at=record.decided_at,
        event="approval.decided",
        actor=record.decided_by,
        **_about(request),
        detail={
            "approved": record.approved,
            "edited": record.edited,
            "reason": record.reason,
            "final_arguments_digest": record.final_arguments_digest,
            "expires": record.expires.isoformat(),
        },
    )


def _about(request: ApprovalRequest) -> dict[str, Any]:
    return {
        "tenant": request.tenant,
        "session": request.session,
        "step_id": request.step_id,
        "request_id": request.request_id,
        "tool_call_id": request.tool_call_id,
        "tool_name": request.tool_name,
        "arguments_digest": request.arguments_digest,
    }


def _name(event: AuditEvent) -> str:
    stamp = f"{event.at.strftime('%Y%m%dT%H%M%S%f')}Z"
    if isinstance(event, RecordedEvent):
        return f"{stamp}-{event.request_id}.{event.event.removeprefix('approval.')}.json"
    return f"{stamp}-{next(_counter):012d}-{secrets.token_hex(4)}.json"


def _documents(store: SessionDocumentSource) -> Documents:
    session_scope(store)  # the same checks, and errors, as the approval ledger's
    return store.documents(NAMESPACE)


def append_audit(store: SessionDocumentSource, *events: AuditEvent) -> None:
    """
    Append events to the session's audit record.

    :param store: The session's store.
    :param events: The events, in order.
    :raises StorageError: If the backend fails.
    """
    documents = _documents(store)
    for event in events:
        documents.put(_name(event), event.model_dump_json().encode())


async def append_audit_async(store: SessionDocumentSource, *events: AuditEvent) -> None:
    """Async `append_audit`; the events are written concurrently (their names already fix their order)."""
    documents = _documents(store)
    await asyncio.gather(*(documents.put_async(_name(event), event.model_dump_json().encode()) for event in events))


async def append_missing_async(store: SessionDocumentSource, events: list[RecordedEvent]) -> None:
    """
    Append the recorded events the session's audit does not hold yet: a read per event (their names are known, so
    the audit, which only grows, is never listed), and a write per missing event.

    :param store: The session's store.
    :param events: Events restating the session's records.
    :raises StorageError: If the backend fails.
    """
    documents = _documents(store)
    present = await asyncio.gather(*(_exists(documents, _name(event)) for event in events))
    missing = [event for event, found in zip(events, present, strict=True) if not found]
    await asyncio.gather(*(documents.put_async(_name(event), event.model_dump_json().encode()) for event in missing))


async def _exists(documents: Documents, name: str) -> bool:
    try:
        await documents.get_async(name)
    except ResultNotFoundError:
        return False
    return True


def read_audit(store: SessionDocumentSource) -> list[AuditEvent]:
    """
    Read a session's audit record, oldest first.

    ```python
    for event in read_audit(results.for_session("acme", "chat-42")):
        print(event.at, event.event, event.actor, event.tool_name)
    ```

    :param store: The session's store (a `SessionDocumentSource`: `FsspecToolResultStore.for_session`).
    :returns: Every event, in time order. Documents other writers put in the namespace that are not approval audit
        events are skipped.
    :raises TypeError: If the store keeps no documents.
    :raises ValueError: If the store is not scoped to one session.
    """
    documents = _documents(store)
    return _parsed([(name, documents.get(name)) for name in documents.list()])


async def read_audit_async(store: SessionDocumentSource) -> list[AuditEvent]:
    """Async `read_audit`; the documents are read concurrently."""
    documents = _documents(store)
    names = await documents.list_async()
    contents = await asyncio.gather(*(documents.get_async(name) for name in names))
    return _parsed(list(zip(names, contents, strict=True)))


def _parsed(documents: list[tuple[str, bytes]]) -> list[AuditEvent]:
    events = []
    for _, data in sorted(documents):
        try:
            event = AuditEvent.model_validate_json(data)
        except ValueError:
            continue  # another feature's audit document: not ours to interpret
        events.append(event)
    return events
