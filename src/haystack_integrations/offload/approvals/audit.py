"""
The session's audit record: one small document per event in ``.audit/``, named so that names sort in time order.
"""

import asyncio
import itertools
import logging
import secrets
import threading
from collections import OrderedDict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from haystack.dataclasses import ChatMessage

from haystack_integrations.offload.approvals.approval_records import (
    ApprovalDecision,
    ApprovalRequest,
    AuditEvent,
    CallRecord,
    HeldStep,
    StepDone,
    arguments_digest,
)
from haystack_integrations.offload.approvals.blocking import run_blocking
from haystack_integrations.offload.approvals.ledger import (
    ApprovalLedger,
    ApprovalSnapshot,
    call_key,
    idempotency_key,
    sequence_of,
    session_scope,
)
from haystack_integrations.offload.errors import OffloadError, ResultNotFoundError
from haystack_integrations.offload.types import Documents, SessionDocumentSource

logger = logging.getLogger(__name__)

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


# The finished steps whose audit this process holds complete (appended here, or checked): each is checked once per
# process, so the requests that read a finished step cost no more after the first. Bounded: a forgotten one is checked
# again (a few reads), never audited twice (the events' names are fixed).
_AUDITED: "OrderedDict[tuple[str, str, str, str], None]" = OrderedDict()
_AUDITED_LOCK = threading.Lock()
_AUDITED_MAX = 4096


def _audited_key(tenant: str, session: str, done: StepDone) -> tuple[str, str, str, str]:
    return (tenant, session, done.step_id, done.finished_at.isoformat())


def mark_audited(tenant: str, session: str, done: StepDone) -> None:
    """
    Note that a finished step's audit is complete (its events were appended), so `repair_finished_async` skips it.

    :param tenant: The session's tenant.
    :param session: The session.
    :param done: The step's done record.
    """
    with _AUDITED_LOCK:
        _AUDITED[_audited_key(tenant, session, done)] = None
        while len(_AUDITED) > _AUDITED_MAX:
            _AUDITED.popitem(last=False)


def _was_audited(tenant: str, session: str, done: StepDone) -> bool:
    with _AUDITED_LOCK:
        return _audited_key(tenant, session, done) in _AUDITED


def owes_audit_check(ledger: ApprovalLedger, snapshot: ApprovalSnapshot) -> bool:
    """
    :param ledger: The session's ledger.
    :param snapshot: What a request read of the newest step.
    :returns: Whether the step is finished and this process has not checked its audit yet.
    """
    done = snapshot.done
    return done is not None and not _was_audited(ledger.tenant, ledger.session, done)


async def repair_finished_async(ledger: ApprovalLedger, snapshot: ApprovalSnapshot) -> None:
    """
    Append the ``approval.executed`` events the session's newest finished step owes: those of its approved calls whose
    result is recorded (they ran) though the append after the step finished failed.

    Read by name, no listing: the step's chain, a GET per call for its record and one per event; a write per missing
    event. Checked once per process and step. Never raises: a failure is logged and the next request tries again.

    :param ledger: The session's ledger.
    :param snapshot: What the request read of the newest step; nothing is done unless it is finished.
    """
    step, done = snapshot.step, snapshot.done
    if step is None or done is None or not owes_audit_check(ledger, snapshot):
        return
    try:
        await append_missing_async(ledger.store, await _executed_events_owed(ledger, step))
    except OffloadError as error:
        logger.warning("Could not check the audit of finished step %s: %s", step.step_id, error)
        return
    mark_audited(ledger.tenant, ledger.session, done)


async def repair_audit_async(store: SessionDocumentSource) -> int:
    """
    Append every ``approval.executed`` event a session's audit lacks for a call that ran, in every finished step (the
    operator's repair; requests repair the newest step only). A step read per held step, so it costs the history.

    :param store: The session's store.
    :returns: How many events were appended.
    :raises StorageError: If the backend fails.
    """
    ledger = ApprovalLedger(store)
    newest = await ledger.newest_async() or 0
    dones = await asyncio.gather(*(ledger.done_async(sequence) for sequence in range(1, newest + 1)))
    finished = [sequence for sequence, done in enumerate(dones, start=1) if done is not None]
    steps = await asyncio.gather(*(ledger.step_async(sequence) for sequence in finished))
    owed = await asyncio.gather(*(_executed_events_owed(ledger, step) for step in steps))
    return await append_missing_async(store, [event for events in owed for event in events])


def repair_audit(store: SessionDocumentSource) -> int:
    """
    Sync `repair_audit_async`.

    ```python
    appended = repair_audit(results.for_session("acme", "chat-42"))
    ```
    """
    return run_blocking(repair_audit_async(store))


async def _executed_events_owed(ledger: ApprovalLedger, step: HeldStep) -> list[RecordedEvent]:
    """The ``approval.executed`` events of `step`'s approved calls whose result is recorded."""
    chain = [step]
    while chain[-1].continues is not None:
        chain.append(await ledger.step_async(sequence_of(str(chain[-1].continues))))
    first_step_id = chain[-1].step_id
    # The request `resume` named each call's event after (`Rulings.request_of`): by guard and call, later steps
    # winning, in the order the guards first asked; then the last guard's.
    by_guard: dict[tuple[str, str], str] = {}
    for held in reversed(chain):
        for request in held.requests():
            if request.tool_call_id is not None:
                by_guard[(request.guard, request.tool_call_id)] = request.request_id
    requests = {call_id: request_id for (_, call_id), request_id in by_guard.items()}
    calls = [
        (call_key(first_step_id, call.id, position), requests[call.id])
        for position, call in enumerate(step.chat_message().tool_calls)
        if call.id is not None and call.id in requests
    ]
    records = await asyncio.gather(*(ledger.call_record_async(key) for key, _ in calls))
    return [
        executed_event(
            record,
            tenant=ledger.tenant,
            session=ledger.session,
            step_id=step.step_id,
            request_id=request,
            idempotency=idempotency_key(ledger.tenant, ledger.session, key),
        )
        for (key, request), record in zip(calls, records, strict=True)
        if record is not None
    ]


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
    await _put_all(_documents(store), events)


async def append_missing_async(store: SessionDocumentSource, events: list[RecordedEvent]) -> int:
    """
    Append the recorded events the session's audit does not hold yet: a read per event (their names are known, so
    the audit, which only grows, is never listed), and a write per missing event.

    :param store: The session's store.
    :param events: Events restating the session's records.
    :returns: How many were missing (and appended).
    :raises StorageError: If the backend fails.
    """
    documents = _documents(store)
    present = await asyncio.gather(*(_exists(documents, _name(event)) for event in events))
    missing = [event for event, found in zip(events, present, strict=True) if not found]
    await _put_all(documents, missing)
    return len(missing)


async def _put_all(documents: Documents, events: Sequence[AuditEvent]) -> None:
    # Concurrently, and every write ends before this does, failed or not: a write left running would land after the
    # caller has been told the append failed, beside the repair that follows.
    writes = (documents.put_async(_name(event), event.model_dump_json().encode()) for event in events)
    outcomes = await asyncio.gather(*writes, return_exceptions=True)
    failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if failures:
        raise failures[0]


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
