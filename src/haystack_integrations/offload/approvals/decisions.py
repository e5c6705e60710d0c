"""
Listing and deciding a session's pending approvals: the two calls a server's "pending" and "decide" handlers make.

Both are stateless and take the session's store, so any worker can serve them. A decision is validated, then created
once: a second decision for the same request fails with `ApprovalAlreadyDecidedError`.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from haystack_integrations.offload.approvals.approval_records import (
    ApprovalDecision,
    ApprovalRequest,
    Decision,
    HeldStep,
    StepDone,
    approved_arguments,
    arguments_digest,
)
from haystack_integrations.offload.approvals.audit import append_audit_async, decided_event
from haystack_integrations.offload.approvals.audit_repair import repair_newest_async
from haystack_integrations.offload.approvals.errors import (
    ApprovalAlreadyDecidedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
)
from haystack_integrations.offload.approvals.ledger import (
    ApprovalLedger,
    ApprovalListing,
    ApprovalSnapshot,
    known_pending,
    now,
    parse_request_id,
    sequence_of,
)
from haystack_integrations.offload.approvals.rules import remembered_approval
from haystack_integrations.offload.metrics import approval
from haystack_integrations.offload.sync_calls import sync_twin
from haystack_integrations.offload.types import SessionDocumentSource

DEFAULT_DECISION_TTL = 3600.0
"""Seconds an approval stays usable by `resume` after it was made."""


async def pending_approvals_async(store: SessionDocumentSource) -> list[ApprovalRequest]:
    """
    The session's requests that wait for a decision: those of its open held step, not decided, not expired.

    :param store: The session's store (a `SessionDocumentSource`: `FsspecToolResultStore.for_session`).
    :returns: The requests, in the model's order; empty when nothing waits.
    :raises TypeError: If the store keeps no documents.
    :raises ValueError: If the store is not scoped to one session.
    """
    ledger = ApprovalLedger(store)
    return await pending_in_async(ledger, await ledger.snapshot_async())


pending_approvals = sync_twin(pending_approvals_async)


async def pending_in_async(ledger: ApprovalLedger, snapshot: ApprovalSnapshot) -> list[ApprovalRequest]:
    """
    `pending_approvals_async` from what a request already read of the newest step (nothing of it is read again).

    :param ledger: The session's ledger, for this request.
    :param snapshot: Its snapshot of the newest step.
    :returns: The requests that wait, in the model's order.
    """
    await repair_newest_async(ledger, snapshot)  # the newest step's audit, if an append failed
    return ledger.saw_waiting(_waiting_in(snapshot))


async def decide_async(
    store: SessionDocumentSource, request_id: str, decision: Decision, *, ttl: float = DEFAULT_DECISION_TTL
) -> ApprovalDecision:
    """
    Record a person's decision on one request of this session.

    ```python
    decide(store, request.request_id, Decision.approve(by="alice"))
    decide(store, request.request_id, Decision.approve({"amount": 50}, by="alice"))   # edited, re-validated
    await decide_async(store, request.request_id, Decision.deny("Over budget.", by="alice"))
    ```

    :param store: The session's store.
    :param request_id: The request, from `pending_approvals` (a client's input: it is parsed, never trusted).
    :param decision: The decision.
    :param ttl: Seconds the approval stays usable by `resume`.
    :returns: The recorded decision.
    :raises ApprovalNotFoundError: If this session has no such request.
    :raises ApprovalExpiredError: If the request has expired.
    :raises InvalidApprovalEditError: If the decision names another tool, or its edited arguments are invalid.
    :raises ApprovalAlreadyDecidedError: If the request already has a decision (its ``repeated`` says whether this
        one was the same: same verdict, same final arguments).
    """
    return await decide_in_async(ApprovalLedger(store), request_id, decision, ttl=ttl)


decide = sync_twin(decide_async)


async def decide_in_async(
    ledger: ApprovalLedger, request_id: str, decision: Decision, *, ttl: float = DEFAULT_DECISION_TTL
) -> ApprovalDecision:
    """
    `decide_async` through a request's own ledger, which keeps the step and the decision for what the request does
    next (its snapshot of the newest step reads neither again).

    :param ledger: The session's ledger, for this request.
    :param request_id: The request, as a client sent it.
    :param decision: The decision.
    :param ttl: Seconds the approval stays usable by `resume`.
    :returns: The recorded decision.
    :raises ApprovalNotFoundError: If this session has no such request.
    :raises ApprovalExpiredError: If the request has expired.
    :raises InvalidApprovalEditError: If the decision names another tool, or its edited arguments are invalid.
    :raises ApprovalAlreadyDecidedError: If the request already has a decision.
    """
    store = ledger.store
    step_id, position = parse_request_id(request_id)
    request = _request(await ledger.step_async(sequence_of(step_id)), position, request_id)
    at = now()
    record = _decision_record(request, decision, at=at, ttl=ttl)
    try:
        await ledger.create_decision_async(record)
    except ApprovalAlreadyDecidedError as error:
        _compare(error, record, await ledger.decision_async(record.request_id))
        raise
    if record.approved and not record.edited and request.remember is not None:
        await ledger.remember_async(*remembered_approval(request, decision.decided_by, at))
    await append_audit_async(store, decided_event(request, record))
    return record


async def open_step_async(store: SessionDocumentSource) -> "OpenStep | None":
    """
    The session's held step that is not finished yet, and where it stands: the server's check before a new message.

    :param store: The session's store.
    :returns: None when no step is open; otherwise its number, its requests still waiting, and whether a worker's
        live lease is resuming it now.
    """
    ledger = ApprovalLedger(store)
    return await open_step_in_async(ledger, await ledger.snapshot_async())


async def open_step_in_async(ledger: ApprovalLedger, snapshot: ApprovalSnapshot) -> "OpenStep | None":
    """
    `open_step_async` from what a request already read of the newest step (nothing of it is read again).

    :param ledger: The session's ledger, for this request.
    :param snapshot: Its snapshot of the newest step.
    :returns: The open step and where it stands, or None.
    """
    step, listing = snapshot.step, snapshot.listing
    await repair_newest_async(ledger, snapshot)  # the newest step's audit, if an append failed
    if step is None or snapshot.done is not None:
        ledger.saw_waiting([])
        return None
    at = now()
    waiting = ledger.saw_waiting(_waiting(step, listing, at))
    claim = await ledger.newest_claim_async(snapshot)
    # The lease is judged when the claim was read, not later: a renewal since then would not be seen.
    live = claim is not None and snapshot.read_at < claim.lease_until
    return OpenStep(
        sequence=step.sequence,
        waiting=waiting,
        resuming_until=claim.lease_until if claim is not None and live else None,
        decided=any(listing.decided(request.request_id) for request in step.requests()),
    )


async def newest_done_async(store: SessionDocumentSource) -> StepDone | None:
    """
    What the session's newest finished step added to the conversation, or None.

    :param store: The session's store.
    :returns: The done record of the newest step that has one.
    """
    return await ApprovalLedger(store).newest_done_async()


async def newest_done_in_async(ledger: ApprovalLedger, snapshot: ApprovalSnapshot) -> StepDone | None:
    """
    `newest_done_async` from what a request already read of the newest step (its done record is not read again).

    :param ledger: The session's ledger, for this request.
    :param snapshot: Its snapshot of the newest step.
    :returns: The done record of the newest step that has one.
    """
    return await ledger.newest_done_async(snapshot)


@dataclass(frozen=True)
class OpenStep:
    """A held step not finished yet: waiting for decisions, ready to resume, or being resumed under a live lease."""

    sequence: int
    waiting: list[ApprovalRequest]
    resuming_until: datetime | None
    decided: bool = False
    """Whether any of its requests has a decision (else every one that does not wait expired)."""


def _waiting_in(snapshot: ApprovalSnapshot) -> list[ApprovalRequest]:
    """The requests of the session's open step that wait: neither decided nor expired (none when no step is open)."""
    if snapshot.step is None or snapshot.done is not None:
        return []
    return _waiting(snapshot.step, snapshot.listing, now())


def _waiting(step: HeldStep, listing: ApprovalListing, at: datetime) -> list[ApprovalRequest]:
    return [
        request for request in step.requests() if not listing.decided(request.request_id) and not request.expired(at)
    ]


def _request(step: HeldStep, position: int, request_id: str) -> ApprovalRequest:
    request = step.calls[position].request if position < len(step.calls) else None
    if request is None or request.request_id != request_id:
        raise ApprovalNotFoundError(f"No approval request {request_id!r} in this session.")
    return request


def _decision_record(request: ApprovalRequest, decision: Decision, *, at: datetime, ttl: float) -> ApprovalDecision:
    if ttl < 0:
        raise ValueError(f"ttl must be zero or more seconds, got {ttl}.")
    # A durable request always has its tenant, session and tool call id: the hook makes none without them.
    assert request.tenant is not None and request.session is not None and request.tool_call_id is not None  # noqa: S101
    if request.expired(at):
        # Seen expired: each decision refused so counts, and the resume that answers the request counts it again.
        approval("expired", tenant=request.tenant)
        known_pending.settle(request.tenant, request.session, request.request_id)
        raise ApprovalExpiredError(
            f"Request {request.request_id!r} expired at {request.expires.isoformat()}; it can no longer be decided."
        )
    arguments, edited = approved_arguments(request, decision)
    return ApprovalDecision(
        request_id=request.request_id,
        step_id=request.step_id,
        tenant=request.tenant,
        session=request.session,
        tool_call_id=request.tool_call_id,
        tool_name=request.tool_name,
        arguments_digest=request.arguments_digest,
        approved=decision.approved,
        arguments=arguments if decision.approved else None,
        final_arguments_digest=arguments_digest(arguments) if decision.approved else None,
        edited=edited and decision.approved,
        reason=decision.reason,
        decided_by=decision.decided_by,
        decided_at=at,
        expires=at + timedelta(seconds=ttl),
    )


def _compare(
    error: ApprovalAlreadyDecidedError, attempted: ApprovalDecision, recorded: ApprovalDecision | None
) -> None:
    # The verdict and the arguments that would run are what a repeat must match; who decided, when, and a denial's
    # reason may differ (a client retrying after a failed answer), and the recorded ones stand.
    error.recorded = recorded
    error.repeated = (
        recorded is not None
        and recorded.approved == attempted.approved
        and recorded.final_arguments_digest == attempted.final_arguments_digest
    )
