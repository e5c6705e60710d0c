"""
Repairing a session's audit: the events a step owes, restated from its records when the append that wrote them failed.

A request that reads the session's newest step repairs it (once per process and step); `repair_audit` repairs every
step of a session, for an operator.
"""

import asyncio
import logging
import threading
from collections import OrderedDict
from datetime import UTC, datetime, timedelta

from haystack.dataclasses import ChatMessage

from haystack_integrations.offload.approvals.approval_records import MAY_HAVE_RUN_GUARD, AuditEvent, HeldStep, StepDone
from haystack_integrations.offload.approvals.audit import (
    RecordedEvent,
    append_missing_async,
    audit_documents,
    decided_event,
    event_exists_async,
    event_name,
    executed_event,
    may_have_run_event,
    outcome_event,
    put_events_async,
    requested_event,
)
from haystack_integrations.offload.approvals.ledger import (
    ApprovalLedger,
    ApprovalSnapshot,
    call_key,
    idempotency_key,
    sequence_of,
)
from haystack_integrations.offload.approvals.step_outcomes import ANOTHER_HOOK, step_outcomes
from haystack_integrations.offload.errors import OffloadError
from haystack_integrations.offload.sync_calls import sync_twin
from haystack_integrations.offload.types import SessionDocumentSource

logger = logging.getLogger(__name__)

# How long after its record an event written before events had fixed names may carry its time stamp (the append after
# a step finished, retries included): a restated event with no twin in this window is missing.
_OLD_NAMES_WINDOW = timedelta(minutes=10)

# The steps whose audit this process holds complete (appended here, or checked): each is checked once per process,
# so the requests that read a step cost no more after the first. Bounded: a forgotten one is checked again (a few
# reads), never audited twice (the events' names are fixed).
_AUDITED: "OrderedDict[tuple[str, str, str, str], None]" = OrderedDict()
_AUDITED_LOCK = threading.Lock()
_AUDITED_MAX = 4096


def _audited_key(
    ledger: ApprovalLedger, step: HeldStep, done: StepDone | None, decided: int
) -> tuple[str, str, str, str]:
    # A held step is checked again once more of its requests are decided (their decisions' events may be missing).
    return (ledger.tenant, ledger.session, step.step_id, done.finished_at.isoformat() if done else f"held-{decided}")


def mark_audited(ledger: ApprovalLedger, step: HeldStep, done: StepDone | None, *, decided: int = 0) -> None:
    """
    Note that a step's audit is complete (its events were appended), so the repair skips it in this process.

    :param ledger: The session's ledger.
    :param step: The step.
    :param done: Its done record; None while it is held.
    :param decided: While it is held, how many of its requests are decided.
    """
    with _AUDITED_LOCK:
        _AUDITED[_audited_key(ledger, step, done, decided)] = None
        while len(_AUDITED) > _AUDITED_MAX:
            _AUDITED.popitem(last=False)


def owes_audit_check(ledger: ApprovalLedger, snapshot: ApprovalSnapshot) -> bool:
    """
    :param ledger: The session's ledger.
    :param snapshot: What a request read of the newest step.
    :returns: Whether the session has a step and this process has not checked its audit yet.
    """
    step = snapshot.step
    if step is None:
        return False
    with _AUDITED_LOCK:
        return _audited_key(ledger, step, snapshot.done, _decided(snapshot)) not in _AUDITED


def _decided(snapshot: ApprovalSnapshot) -> int:
    step = snapshot.step
    return sum(snapshot.listing.decided(r.request_id) for r in step.requests()) if step is not None else 0


async def repair_newest_async(ledger: ApprovalLedger, snapshot: ApprovalSnapshot) -> None:
    """
    Append the events the session's newest step owes, when the append that wrote them failed: for a finished step,
    ``approval.executed`` for each approved call whose result is recorded and the event of each call answered without
    running (denied, expired, held again, ...); for a held step, ``approval.requested`` for each request,
    ``approval.decided`` for each decided one, and ``approval.may_have_run`` for each call that may have run.

    Read by name: the step's chain, a GET per call record and per event, a write per missing event. Checked once per
    process and step. Never raises: a failure is logged and the next request tries again.

    :param ledger: The session's ledger.
    :param snapshot: What the request read of the newest step.
    """
    step = snapshot.step
    if step is None or not owes_audit_check(ledger, snapshot):
        return
    try:
        await _repair_async(ledger, step, snapshot.done)
    except OffloadError as error:
        logger.warning("Could not check the audit of held step %s: %s", step.step_id, error)
        return
    mark_audited(ledger, step, snapshot.done, decided=_decided(snapshot))


async def repair_audit_async(store: SessionDocumentSource) -> int:
    """
    Append every event a session's audit lacks that its records prove (see `repair_newest_async`), in every step: the
    operator's repair, where requests repair the newest step only. It reads every step, so it costs the history.

    ```python
    appended = repair_audit(results.for_session("acme", "chat-42"))
    ```

    :param store: The session's store.
    :returns: How many events were appended.
    :raises StorageError: If the backend fails.
    """
    ledger = ApprovalLedger(store)
    newest = await ledger.newest_async() or 0
    sequences = range(1, newest + 1)
    steps, dones = await asyncio.gather(
        asyncio.gather(*(ledger.step_async(sequence) for sequence in sequences)),
        asyncio.gather(*(ledger.done_async(sequence) for sequence in sequences)),
    )
    repairs = (_repair_async(ledger, step, done) for step, done in zip(steps, dones, strict=True))
    return sum(await asyncio.gather(*repairs))


repair_audit = sync_twin(repair_audit_async)


async def _repair_async(ledger: ApprovalLedger, step: HeldStep, done: StepDone | None) -> int:
    chain = [step]
    while chain[-1].continues is not None:
        chain.append(await ledger.step_async(sequence_of(str(chain[-1].continues))))
    first_step_id = chain[-1].step_id
    restated: list[RecordedEvent] = []
    if step.guard == MAY_HAVE_RUN_GUARD and step.continues is not None:
        restated += _may_have_run_events(ledger, first_step_id, step)
    if done is None:  # held: what it asks and what was decided (the rest is restated before any call runs)
        held_requests = step.requests()
        decisions = await asyncio.gather(*(ledger.decision_async(request.request_id) for request in held_requests))
        asked = [requested_event(request) for request in held_requests]
        decided = [decided_event(r, d) for r, d in zip(held_requests, decisions, strict=True) if d is not None]
        return await append_missing_async(ledger.store, [*asked, *decided]) + await _append_restated_async(
            ledger, restated
        )
    held = await ledger.step_async(sequence_of(done.held_again)) if done.held_again is not None else None
    keys = [call_key(first_step_id, call.id, position) for position, call in enumerate(step.chat_message().tool_calls)]
    records = await asyncio.gather(*(ledger.call_record_async(key) for key in keys))
    requests = _requests_named(chain)
    executed = []
    ran: dict[str, tuple[str, str, int]] = {}
    for key, call, record in zip(keys, step.chat_message().tool_calls, records, strict=True):
        if record is None or call.id is None:
            continue
        idempotency = idempotency_key(ledger.tenant, ledger.session, key)
        ran[call.id] = ("recorded", idempotency, record.attempt)
        if call.id in requests:
            executed.append(
                executed_event(
                    record,
                    tenant=ledger.tenant,
                    session=ledger.session,
                    step_id=step.step_id,
                    request_id=requests[call.id],
                    idempotency=idempotency,
                )
            )
    added = [ChatMessage.from_dict(message) for message in done.messages]
    restated += [
        outcome_event(step, done, outcome)
        for outcome in step_outcomes(step, added, ran, held)
        # A call answered by another hook may as well have run with its record lost: nothing proves which.
        if outcome.request_id is not None and outcome.outcome not in {"executed", "recorded"}
        if outcome.reason != ANOTHER_HOOK
    ]
    if held is not None and held.guard == MAY_HAVE_RUN_GUARD:
        restated += _may_have_run_events(ledger, first_step_id, held)
    appended = await append_missing_async(ledger.store, executed)
    return appended + await _append_restated_async(ledger, restated)


def _requests_named(chain: list[HeldStep]) -> dict[str, str]:
    # The request `resume` named each call's ``approval.executed`` after (`Rulings.request_of`): by guard and call,
    # later steps winning, in the order the guards first asked; then the last guard's.
    by_guard: dict[tuple[str, str], str] = {}
    for held in reversed(chain):
        for request in held.requests():
            if request.tool_call_id is not None:
                by_guard[(request.guard, request.tool_call_id)] = request.request_id
    return {call_id: request_id for (_, call_id), request_id in by_guard.items()}


def _may_have_run_events(ledger: ApprovalLedger, first_step_id: str, held: HeldStep) -> list[RecordedEvent]:
    def idempotency(tool_call_id: str | None, position: int) -> str:
        return idempotency_key(ledger.tenant, ledger.session, call_key(first_step_id, tool_call_id, position))

    return [
        may_have_run_event(str(held.continues), request, idempotency(request.tool_call_id, request.position))
        for request in held.requests()
        if request.guard == MAY_HAVE_RUN_GUARD
    ]


async def _append_restated_async(ledger: ApprovalLedger, events: list[RecordedEvent]) -> int:
    """
    Append the restated events the audit lacks. One whose fixed name is missing may still be there under the random
    name events had before they were restated (steps older than that, whose append went well): the audit's names are
    listed, and the events stamped near each missing one read, before it is written.
    """
    documents = audit_documents(ledger.store)
    present = await asyncio.gather(*(event_exists_async(documents, event_name(event)) for event in events))
    missing = [event for event, found in zip(events, present, strict=True) if not found]
    if not missing:
        return 0
    earliest = min(event.at for event in missing) - timedelta(seconds=1)
    latest = max(event.at for event in missing) + _OLD_NAMES_WINDOW
    listed = await documents.list_async()
    names = [name for name in listed if (stamp := _stamp(name)) is not None and earliest <= stamp <= latest]
    nearby = await asyncio.gather(*(documents.get_async(name) for name in names))
    seen = set()
    for data in nearby:
        try:
            event = AuditEvent.model_validate_json(data)
        except ValueError:
            continue
        seen.add((event.event, event.step_id, event.tool_call_id))
    missing = [event for event in missing if (event.event, event.step_id, event.tool_call_id) not in seen]
    await put_events_async(documents, missing)
    return len(missing)


def _stamp(name: str) -> datetime | None:
    # An event's name starts with its time (`audit.event_name`); other documents' names do not parse.
    try:
        return datetime.strptime(name[:22], "%Y%m%dT%H%M%S%fZ").replace(tzinfo=UTC)
    except ValueError:
        return None
