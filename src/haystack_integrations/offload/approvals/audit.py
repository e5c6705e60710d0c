"""
The session's audit record: one small document per event in ``.audit/``, named so that names sort in time order.
"""

import asyncio
import itertools
import secrets
import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from haystack.dataclasses import ChatMessage

from haystack_integrations.offload.approvals.approval_records import (
    ApprovalDecision,
    ApprovalRequest,
    AuditEvent,
    CallOutcome,
    CallRecord,
    HeldStep,
    StepDone,
    arguments_digest,
)
from haystack_integrations.offload.approvals.ledger import session_scope
from haystack_integrations.offload.errors import ResultNotFoundError
from haystack_integrations.offload.sync_calls import sync_twin
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


def executed_event(
    record: CallRecord, *, tenant: str, session: str, step_id: str, request_id: str, idempotency: str
) -> RecordedEvent:
    """
    The ``approval.executed`` event of an approved call that ran, restating its record: whoever writes it (the worker
    that ran the call, a takeover reusing its result, a repair) writes the same document.

    :param record: The call's record.
    :param tenant: The session's tenant.
    :param session: The session.
    :param step_id: The step that ran (or reused) the call.
    :param request_id: The newest request about the call that was decided.
    :param idempotency: The call's idempotency key.
    :returns: The event.
    """
    result = ChatMessage.from_dict(record.result).tool_call_result
    call = result.origin if result is not None else None
    return RecordedEvent(
        at=record.recorded_at,
        event="approval.executed",
        actor=record.recorded_by,
        tenant=tenant,
        session=session,
        step_id=step_id,
        detail={
            "error": bool(result is not None and result.error),
            "attempt": record.attempt,
            "idempotency_key": idempotency,
        },
        request_id=request_id,
        tool_call_id=call.id if call is not None else None,
        tool_name=call.tool_name if call is not None else None,
        arguments_digest=arguments_digest(call.arguments) if call is not None else None,
    )


def outcome_event(step: HeldStep, done: StepDone, outcome: CallOutcome) -> RecordedEvent:
    """
    The event of a call of a finished step that did not run there (denied, expired, held again, ...), restating the
    step's done record: whoever writes it (the worker that finished the step, a repair) writes the same document.

    :param step: The finished step.
    :param done: Its done record.
    :param outcome: The call's outcome; it must name its request.
    :returns: The event, at the step's end (plus the call's position in microseconds, to keep the calls' order).
    """
    return RecordedEvent(
        at=done.finished_at + timedelta(microseconds=outcome.position),
        event=f"approval.{outcome.outcome.replace('-', '_')}",
        actor=done.finished_by,
        tenant=step.tenant,
        session=step.session,
        step_id=step.step_id,
        request_id=outcome.request_id,
        tool_call_id=outcome.tool_call_id,
        tool_name=outcome.tool_name,
        detail={"reason": outcome.reason},
    )


def may_have_run_event(step_id: str, request: ApprovalRequest, idempotency: str) -> RecordedEvent:
    """
    The ``approval.may_have_run`` event of a call whose worker stopped mid-call, restating the request that holds it.

    :param step_id: The step whose resume found the call claimed and not recorded.
    :param request: The "may have run" request holding the call again.
    :param idempotency: The call's idempotency key.
    :returns: The event, at the request's creation (plus its position in microseconds).
    """
    return RecordedEvent(
        at=request.created + timedelta(microseconds=request.position),
        event="approval.may_have_run",
        actor=request.requested_by,
        tenant=request.tenant,
        session=request.session,
        step_id=step_id,
        request_id=request.request_id,
        tool_call_id=request.tool_call_id,
        tool_name=request.tool_name,
        arguments_digest=request.arguments_digest,
        detail={"held_as": request.request_id, "idempotency_key": idempotency},
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


def event_name(event: AuditEvent) -> str:
    """
    :param event: An event.
    :returns: Its document's name: its time first, then its request and kind (a `RecordedEvent`), else a nonce.
    """
    stamp = f"{event.at.strftime('%Y%m%dT%H%M%S%f')}Z"
    if isinstance(event, RecordedEvent):
        return f"{stamp}-{event.request_id}.{event.event.removeprefix('approval.')}.json"
    return f"{stamp}-{next(_counter):012d}-{secrets.token_hex(4)}.json"


def audit_documents(store: SessionDocumentSource) -> Documents:
    """
    :param store: The session's store.
    :returns: Its audit namespace.
    :raises TypeError: If the store keeps no documents.
    :raises ValueError: If the store is not scoped to one session.
    """
    session_scope(store)  # the same checks, and errors, as the approval ledger's
    return store.documents(NAMESPACE)


async def append_audit_async(store: SessionDocumentSource, *events: AuditEvent) -> None:
    """
    Append events to the session's audit record. They are written concurrently (their names already fix their order),
    and each is written even if another fails (`put_events_async`).

    :param store: The session's store.
    :param events: The events, in order.
    :raises StorageError: If the backend fails.
    """
    await put_events_async(audit_documents(store), events)


append_audit = sync_twin(append_audit_async)


async def append_missing_async(store: SessionDocumentSource, events: list[RecordedEvent]) -> int:
    """
    Append the recorded events the session's audit does not hold yet: a read per event (their names are known, so
    the audit, which only grows, is never listed), and a write per missing event.

    :param store: The session's store.
    :param events: Events restating the session's records.
    :returns: How many were missing (and appended).
    :raises StorageError: If the backend fails.
    """
    documents = audit_documents(store)
    present = await asyncio.gather(*(event_exists_async(documents, event_name(event)) for event in events))
    missing = [event for event, found in zip(events, present, strict=True) if not found]
    await put_events_async(documents, missing)
    return len(missing)


async def put_events_async(documents: Documents, events: Sequence[AuditEvent]) -> None:
    """
    Write events concurrently; every write ends before this does, failed or not (a write left running would land
    after the caller has been told the append failed, beside the repair that follows).

    :param documents: The audit namespace.
    :param events: The events.
    :raises StorageError: The first write's failure, once all have ended.
    """
    writes = (documents.put_async(event_name(event), event.model_dump_json().encode()) for event in events)
    outcomes = await asyncio.gather(*writes, return_exceptions=True)
    failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if failures:
        raise failures[0]


async def event_exists_async(documents: Documents, name: str) -> bool:
    """
    :param documents: The audit namespace.
    :param name: An event's document name.
    :returns: Whether it is there (one GET).
    """
    try:
        await documents.get_async(name)
    except ResultNotFoundError:
        return False
    return True


async def read_audit_async(store: SessionDocumentSource) -> list[AuditEvent]:
    """
    Read a session's audit record, oldest first (one LIST, then the documents concurrently).

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
    documents = audit_documents(store)
    names = await documents.list_async()
    contents = await asyncio.gather(*(documents.get_async(name) for name in names))
    return _parsed(list(zip(names, contents, strict=True)))


read_audit = sync_twin(read_audit_async)


def _parsed(documents: list[tuple[str, bytes]]) -> list[AuditEvent]:
    events = []
    for _, data in sorted(documents):
        try:
            event = AuditEvent.model_validate_json(data)
        except ValueError:
            continue  # another feature's audit document: not ours to interpret
        events.append(event)
    return events
