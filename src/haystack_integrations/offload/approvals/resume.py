"""
Resuming a held step after its decisions: re-enter the Agent's step at ``before_tool``, run what may run exactly once.

`resume` and `resume_async` claim the step, run each pending call once with its idempotency key
(`current_idempotency_key`), record what ran and continue the conversation, on any worker.
"""

import asyncio
import contextlib
import contextvars
import logging
import os
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from haystack.components.agents import Agent
from haystack.components.agents.state.state import State
from haystack.dataclasses import ChatMessage, ToolCall

from haystack_integrations.offload.approvals.agent_step import (
    after_tool_async,
    before_tool_async,
    continuing_agent,
    execute_async,
    exit_condition,
    resumed_state,
    run_tools,
)
from haystack_integrations.offload.approvals.approval_records import (
    MAY_HAVE_RUN_GUARD,
    ApprovalRequest,
    AuditEvent,
    CallOutcome,
    CallRecord,
    ExecutionClaim,
    HeldCall,
    HeldStep,
    StepClaim,
    StepDone,
    arguments_digest,
)
from haystack_integrations.offload.approvals.audit import (
    append_audit_async,
    append_missing_async,
    executed_event,
    may_have_run_event,
    new_event,
    outcome_event,
)
from haystack_integrations.offload.approvals.audit_repair import mark_audited, owes_audit_check
from haystack_integrations.offload.approvals.channels import APPROVAL_REQUIRED, DurableApprovals
from haystack_integrations.offload.approvals.errors import (
    ApprovalClaimedError,
    ApprovalNotFoundError,
    ResumeConversationError,
    ResumeInterruptedError,
)
from haystack_integrations.offload.approvals.ledger import (
    ApprovalLedger,
    ApprovalListing,
    ApprovalSnapshot,
    call_key,
    idempotency_key,
    now,
    request_id,
)
from haystack_integrations.offload.approvals.outcomes import (
    APPROVAL_REQUIRED_META_KEY,
    RESULT_FORMATS,
    ResultFormat,
    approval_notice,
    denial_result,
)
from haystack_integrations.offload.approvals.rulings import Ruling, Rulings, read_rulings
from haystack_integrations.offload.approvals.step_outcomes import step_outcomes
from haystack_integrations.offload.context import RESUMING_KEY, resume_context
from haystack_integrations.offload.errors import OffloadError, StorageError
from haystack_integrations.offload.leases import renewing
from haystack_integrations.offload.metrics import approval
from haystack_integrations.offload.sync_calls import sync_twin
from haystack_integrations.offload.types import SessionDocumentSource

logger = logging.getLogger(__name__)

OUTCOMES_KEY = "approval_outcomes"
"""The key under which `resume` adds one `CallOutcome` per call of the held step to the Agent's result."""

DEFAULT_RESUME_LEASE = 120.0
"""Seconds a resuming worker's claim lasts without renewal; it renews every third of that while it works."""

MAY_HAVE_RUN_TTL = 7 * 24 * 3600.0
"""Seconds a "may have run" request can be decided."""

_IDEMPOTENCY_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("offload_idempotency_key", default=None)


def current_idempotency_key() -> str | None:
    """
    The idempotency key of the approved call running now, for tools with side effects to pass on.

    ```python
    def send_invoice(customer: str, amount: int) -> str:
        key = current_idempotency_key()          # the same on every try of this call
        return payments.charge(customer, amount, idempotency_key=key)
    ```

    :returns: The key while `resume` runs an approved call (the same for a retry of a call that may have run), else
        None.
    """
    return _IDEMPOTENCY_KEY.get()


def default_worker() -> str:
    """This process's name in claims and the audit: ``<host>:<pid>``."""
    return f"{socket.gethostname()}:{os.getpid()}"


async def resume_async(
    agent: Agent,
    messages: Sequence[ChatMessage],
    store: SessionDocumentSource,
    *,
    hook_context: dict[str, Any] | None = None,
    worker: str | None = None,
    lease: float = DEFAULT_RESUME_LEASE,
    **run_kwargs: Any,
) -> dict[str, Any]:
    """
    Continue a conversation whose run stopped for approvals, once its requests are decided (or expired).

    ```python
    reply = agent.run(messages, hook_context=offload_context(store, approval_channel=DurableApprovals()))
    # ... later, in any worker, after decide(store, request_id, Decision.approve()):
    reply = resume(agent, reply["messages"], store)       # or: await resume_async(agent, history, store)
    print(reply["last_message"].text)
    ```

    The sync `resume` runs this coroutine on an event loop of its own (in a helper thread when called from a running
    loop), so the two cannot behave differently; hooks and tools with only sync methods run as Haystack runs them in
    async runs.

    :param agent: The Agent that held the step (same tools and hooks; any instance, in any process).
    :param messages: The conversation as the stopped run returned it (the held message is not in it).
    :param store: The session's store; the held step is the session's newest.
    :param hook_context: The resumed run's `hook_context`; by default ``offload_context(store,
        approval_channel=DurableApprovals())``, so a further call that needs approval holds again.
    :param worker: This worker's name for claims and the audit; by default ``<host>:<pid>``.
    :param lease: Seconds this worker's claim lasts without renewal (renewed while it works).
    :param run_kwargs: Passed to `Agent.run` (e.g. ``generation_kwargs``, state values).
    :returns: The Agent's result, plus ``approval_outcomes``: one `CallOutcome` per call of the step. If a call that
        ran is one of the Agent's exit conditions, the run ends there (as the Agent would) without a model call. If a
        hook held the step again (another guard, or a call that may have run), ``exit_reason`` is
        ``"approval_required"`` and the new requests are pending.
    :raises ApprovalNotFoundError: If the session has no held step.
    :raises ApprovalPendingError: If some requests are neither decided nor expired; nothing ran.
    :raises ApprovalClaimedError: If the step was resumed already, or another worker's lease on it is live.
    :raises ResumeConversationError: If `messages` already contains the held message.
    :raises ResumeInterruptedError: If the step ran but the Agent then failed to continue; the conversation with the
        step's results is on the error's ``messages``, so nothing is lost.
    :raises ValueError: If `lease` is not a positive number of seconds.
    """
    if not lease > 0:
        raise ValueError(f"lease must be a positive number of seconds, got {lease}.")
    return await resume_in_async(
        agent,
        messages,
        ApprovalLedger(store),
        None,
        hook_context=hook_context,
        worker=worker,
        lease=lease,
        **run_kwargs,
    )


resume = sync_twin(resume_async)


async def resume_in_async(
    agent: Agent,
    messages: Sequence[ChatMessage],
    ledger: ApprovalLedger,
    snapshot: ApprovalSnapshot | None,
    *,
    hook_context: dict[str, Any] | None = None,
    worker: str | None = None,
    lease: float = DEFAULT_RESUME_LEASE,
    **run_kwargs: Any,
) -> dict[str, Any]:
    """
    `resume_async` through a request's own ledger, from what the request already read of the newest step: a server
    that decided, checked what waits and claimed its turn in the same request reads nothing of the step again.

    A snapshot read earlier in the request may be stale by now; every write it leads to says so: the step's resume
    claim is a conditional create (a claim made meanwhile refuses this one), each call's try is claimed the same way,
    and a lease is judged at the time its claim was read.

    :param agent: The Agent that held the step.
    :param messages: The conversation as the stopped run returned it.
    :param ledger: The session's ledger, for this request.
    :param snapshot: Its snapshot of the newest step; None reads one now.
    :param hook_context: As for `resume_async`.
    :param worker: As for `resume_async`.
    :param lease: As for `resume_async`.
    :param run_kwargs: As for `resume_async`.
    :returns: As `resume_async` returns.
    :raises ApprovalNotFoundError: If the session has no held step.
    :raises ApprovalPendingError: If some requests are neither decided nor expired; nothing ran.
    :raises ApprovalClaimedError: If the step was resumed already, or another worker's lease on it is live.
    :raises ResumeConversationError: If `messages` already contains the held message.
    :raises ResumeInterruptedError: If the step ran but the Agent then failed to continue.
    :raises ValueError: If `lease` is not a positive number of seconds.
    """
    if not lease > 0:
        raise ValueError(f"lease must be a positive number of seconds, got {lease}.")
    store = ledger.store
    worker = worker or default_worker()
    context = resume_context(store, hook_context, default_channel=DurableApprovals)
    messages = _without_notice(messages)
    # One look at the session's newest step serves the whole resume (no listing: its cost is the step's, not the
    # session's history), read here unless the request read it already.
    if snapshot is None:
        snapshot = await ledger.snapshot_async()
    at = now()
    step = _open_step(snapshot)
    listing = snapshot.listing
    attempt = await _next_attempt(ledger, snapshot, step)
    # What this resume adds starts where the given conversation ends: the answers that a lost turn of the resume that
    # held `step` again gave before holding (put back here) are recorded with it, so a lost turn of this one keeps them.
    added_from = len(messages)
    messages = _with_preceding(messages, step)
    rulings = await read_rulings(ledger, listing, step, at, before=added_from)
    _check_conversation(messages, step)
    # Before the step is claimed: what is recorded of its calls (as a listing would have told), and the audit of
    # every request and decision (one whose append failed is appended now, or nothing runs), read at once.
    keys = _call_keys(rulings.first_step_id, step)
    audited = rulings.audited
    if not owes_audit_check(ledger, snapshot):
        # This process found the step's own requests and decisions in the audit (or appended them) as the snapshot
        # stands: the request that read it, or an earlier one. The steps it continues are still checked.
        audited = [event for event in audited if event.step_id != step.step_id]
    recorded, _ = await asyncio.gather(ledger.call_names_async(keys), append_missing_async(store, audited))
    listing = listing.merged(recorded)
    claim = StepClaim(
        step_id=step.step_id,
        tenant=step.tenant,
        session=step.session,
        attempt=attempt,
        claimed_by=worker,
        claimed_at=at,
        lease_until=at + timedelta(seconds=lease),
    )
    try:
        await ledger.claim_step_async(claim)
    except ApprovalClaimedError:
        await append_audit_async(store, _event(step, "approval.claim_lost", worker, {"attempt": attempt}))
        raise
    events = [_event(step, "approval.resumed", worker, {"calls": len(step.calls), "attempt": attempt})]
    tools = run_tools(agent, run_kwargs.get("tools"))
    values = {**_restored_state(rulings.state), **run_kwargs}
    state = resumed_state(
        agent,
        [*messages, step.chat_message()],
        tools=tools,
        hook_context={**context, RESUMING_KEY: rulings},
        values=values,
    )

    async def renew() -> None:
        await ledger.renew_step_async(claim.model_copy(update={"lease_until": now() + timedelta(seconds=lease)}))

    # Leaving the block stops the renewals first, then (on a failure) releases the claim, so no renewal outruns it.
    async with (
        _released_on_failure(ledger, claim),
        renewing(lease, renew, what=f"the claim on held step {step.sequence}"),
    ):
        resumed = _Resumed(ledger, listing, step, rulings, worker, added_from, probed=set(keys))
        try:
            await before_tool_async(agent, state)
            pending = resumed.pending(state)
            if pending is not None:
                await resumed.run_once(agent, state, pending)
            if resumed.held is not None:
                reply = await resumed.held_again(state)
                await resumed.audit([*events, *resumed.events, *resumed.answered(reply[OUTCOMES_KEY])])
                return reply
            conversation = await after_tool_async(agent, state, [*state.data["messages"], *resumed.results])
            await resumed.finish(conversation, held_again=None)
        except Exception:
            # Still under this worker's claims: what ran keeps its result for the next attempt, which reuses it.
            await resumed.record_unrecorded()
            raise
    outcomes = resumed.outcomes(conversation)
    await resumed.audit([*events, *resumed.events, *resumed.answered(outcomes)])
    if state.data.get("stop_run") is not None:
        return _stopped(agent, state, conversation, str(state.data["stop_run"]), outcomes)
    exit_tool = exit_condition(agent, pending, resumed.results)
    if exit_tool is not None:
        return _stopped(agent, state, conversation, exit_tool, outcomes)
    continuing = {**run_kwargs, **_state_values(agent, state)}
    try:
        result = await continuing_agent(agent).run_async(messages=conversation, hook_context=context, **continuing)
    except Exception as error:
        raise _interrupted(error, conversation, outcomes) from error
    result[OUTCOMES_KEY] = outcomes
    return result


@dataclass
class _Resumed:
    """One resumption's work on the calls still pending after the ``before_tool`` chain."""

    ledger: ApprovalLedger
    listing: ApprovalListing
    """The listing read before the step was claimed: a call claimed since then was claimed under a lapsed lease of
    ours, and its conditional create refuses us."""
    step: HeldStep
    rulings: Rulings
    worker: str
    before: int
    """How many messages came before what this step adds (answers put back from a lost turn, the held message, ...)."""
    results: list[ChatMessage] = field(default_factory=list)
    ran: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    """tool call id -> (outcome, idempotency key, try) of the calls that ran or whose recorded result was used."""
    events: list[AuditEvent] = field(default_factory=list)
    held: HeldStep | None = None
    probed: set[str] = field(default_factory=set)
    """The calls whose documents `listing` holds (the held message's); a call the hooks brought in is read when met."""
    done: StepDone | None = None
    """The step's done record, once `finish` wrote it."""
    unrecorded: list[CallRecord] = field(default_factory=list)
    """The results of calls that ran here whose record could not be written (the conversation carries them)."""

    def pending(self, state: State) -> ChatMessage | None:
        """The message whose calls the Agent would run now, as the hooks left it (None: nothing runs)."""
        messages = state.data.get("messages") or []
        if len(messages) <= self.before or not messages[-1].tool_calls:
            return None
        return messages[-1]  # type: ignore[no-any-return]

    async def run_once(self, agent: Agent, state: State, message: ChatMessage) -> None:
        """Run each pending call once: reuse recorded results, hold calls that may have run, run the others."""
        keys = [
            call_key(self.rulings.first_step_id, call.id, position) for position, call in enumerate(message.tool_calls)
        ]
        unknown = [key for key in keys if key not in self.probed]
        if unknown:
            self.listing = self.listing.merged(await self.ledger.call_names_async(unknown))
            self.probed.update(unknown)
        plan = [await self._plan(self.listing, position, call) for position, call in enumerate(message.tool_calls)]
        uncertain = [item for item in plan if item.uncertain]
        if uncertain:
            self.held = await self._hold_may_have_run(message, plan, self.rulings.preceding(state.data["messages"]))
            return
        for item in plan:
            self.results.append(await self._one(agent, state, item))

    async def _plan(self, listing: ApprovalListing, position: int, call: ToolCall) -> "_Call":
        key = call_key(self.rulings.first_step_id, call.id, position)
        item = _Call(position, call, key, idempotency_key(self.step.tenant, self.step.session, key))
        tries = listing.call_tries(key)
        if listing.has_outcome(key):
            item.recorded = True
        elif tries:
            retry = self.rulings.ruling(MAY_HAVE_RUN_GUARD, call)
            if retry is None:
                item.uncertain = not await self._not_run(listing, key, tries[-1])
            elif retry.denial is not None:
                item.denial = retry
            item.attempt = tries[-1] + 1
        return item

    async def _not_run(self, listing: ApprovalListing, key: str, attempt: int) -> bool:
        """Whether the try's claim is one whose create failed, so the call never ran under it."""
        if not listing.unrun(key, attempt):
            return False
        # The note names its claim: a claim that did not land leaves the try's number to another worker's claim.
        claim, note = await asyncio.gather(
            self.ledger.call_claim_async(key, attempt), self.ledger.unrun_async(key, attempt)
        )
        return note is not None and note.token == claim.token

    async def _one(self, agent: Agent, state: State, item: "_Call") -> ChatMessage:
        call = item.call
        if item.recorded:
            record = await self.ledger.call_record_async(item.key)
            if record is not None:
                self.ran[str(call.id)] = ("recorded", item.idempotency, record.attempt)
                reused = ChatMessage.from_dict(record.result)
                # Restated: the worker that ran it may have died before its audit append (the same document if not).
                self.events.append(self._executed_event(item, reused, record))
                return reused
        if item.denial is not None and item.denial.denial is not None:
            request = item.denial.request
            return denial_result(
                call, item.denial.denial, request_id=request.request_id, result_format=_result_format(agent)
            )
        claim = ExecutionClaim(
            call_key=item.key,
            step_id=self.step.step_id,
            tenant=self.step.tenant,
            session=self.step.session,
            tool_call_id=call.id,
            tool_name=call.tool_name,
            arguments_digest=arguments_digest(call.arguments),
            attempt=item.attempt,
            idempotency_key=item.idempotency,
            claimed_by=self.worker,
            claimed_at=now(),
        )
        try:
            await self.ledger.claim_call_async(claim)
        except StorageError:
            # Landed or not, the claim was not used: say so, or a retry would ask whether the call ran.
            try:
                await self.ledger.note_unrun_async(claim)
            except StorageError as error:
                logger.warning("Could not note that call %s did not run: %s", item.key, error)
            raise
        token = _IDEMPOTENCY_KEY.set(item.idempotency)
        try:
            [result] = await execute_async(agent, [call], state)
        finally:
            _IDEMPOTENCY_KEY.reset(token)
        record = CallRecord(
            call_key=item.key,
            step_id=self.step.step_id,
            attempt=item.attempt,
            result=result.to_dict(),
            recorded_by=self.worker,
            recorded_at=now(),
        )
        try:
            await self.ledger.record_call_async(record)
        except Exception:  # the result is in the conversation this returns; a takeover would ask, never re-run
            logger.warning("Could not record the result of call %s; it stays in the conversation.", item.key)
            self.unrecorded.append(record)
        self.ran[str(call.id)] = ("executed", item.idempotency, item.attempt)
        if self.rulings.request_of(call) is not None:  # calls that need no approval run here too: not counted
            approval("executed", tenant=self.step.tenant)
        self.events.append(self._executed_event(item, result, record))
        return result

    def _executed_event(self, item: "_Call", result: ChatMessage, record: CallRecord) -> AuditEvent:
        """
        The audit of a call that ran. For an approved call it restates the call's record (`RecordedEvent`): the
        worker that ran it and a takeover reusing its result write the same document, so it is there once.
        """
        call = item.call
        request = self.rulings.request_of(call)
        error = bool(result.tool_call_result is not None and result.tool_call_result.error)
        detail = {"error": error, "attempt": record.attempt, "idempotency_key": item.idempotency}
        ids = {
            "request_id": request,
            "tool_call_id": call.id,
            "tool_name": call.tool_name,
            "arguments_digest": arguments_digest(call.arguments),
        }
        if request is None:  # no request to name the document after
            return _event(self.step, "approval.executed", self.worker, detail, **ids)
        return executed_event(
            record,
            tenant=self.step.tenant,
            session=self.step.session,
            step_id=self.step.step_id,
            request_id=request,
            idempotency=item.idempotency,
        )

    async def record_unrecorded(self) -> None:
        """
        Write again the records of calls that ran here whose first write failed, before this resume gives up: its
        conversation is lost with it, and without its record a later attempt could only ask a person whether the call
        may have run. A write that fails again is logged; that call is then asked about.
        """
        if not self.unrecorded:
            return
        written = await asyncio.gather(
            *(self.ledger.record_call_async(record) for record in self.unrecorded), return_exceptions=True
        )
        for record, outcome in zip(self.unrecorded, written, strict=True):
            if isinstance(outcome, BaseException):
                logger.warning("Could not record the result of call %s: %s", record.call_key, outcome)
        self.unrecorded = [
            r for r, outcome in zip(self.unrecorded, written, strict=True) if isinstance(outcome, BaseException)
        ]

    async def _hold_may_have_run(
        self, message: ChatMessage, plan: "list[_Call]", preceding: list[dict[str, Any]]
    ) -> HeldStep:
        created = now()

        def calls(step_id: str) -> list[HeldCall]:
            return [self._held_call(step_id, item, created) for item in plan]

        held = await self.ledger.hold_async(
            message,
            calls,
            after=self.step.sequence,
            tenant=self.step.tenant,
            session=self.step.session,
            guard=MAY_HAVE_RUN_GUARD,
            created=created,
            requested_by=self.worker,
            continues=self.step.step_id,
            state=self.rulings.state,
            preceding=preceding,
        )
        approval("may_have_run", len(held.requests()), tenant=self.step.tenant)
        keys = {item.call.id: item.idempotency for item in plan}
        for request in held.requests():
            self.events.append(may_have_run_event(self.step.step_id, request, keys[request.tool_call_id]))
        return held

    def _held_call(self, step_id: str, item: "_Call", created: datetime) -> HeldCall:
        """The held record of a pending call: asked about again if it may have run, else run."""
        digest = arguments_digest(item.call.arguments)
        if not item.uncertain:
            return HeldCall.of(item.position, item.call, digest, request=None)
        request = ApprovalRequest(
            request_id=request_id(step_id, item.position),
            step_id=step_id,
            guard=MAY_HAVE_RUN_GUARD,
            tenant=self.step.tenant,
            session=self.step.session,
            position=item.position,
            tool_call_id=item.call.id,
            tool_name=item.call.tool_name,
            tool_description=(
                "This call's worker stopped while running it, so it may or may not have taken effect. "
                "Approve to run it again with the same idempotency key; deny to tell the model it may "
                "have run."
            ),
            arguments=dict(item.call.arguments),
            arguments_digest=digest,
            parameters={},
            rule="MayHaveRun",
            requested_by=self.worker,
            created=created,
            expires=created + timedelta(seconds=MAY_HAVE_RUN_TTL),
        )
        return HeldCall.of(item.position, item.call, digest, request)

    async def held_again(self, state: State) -> dict[str, Any]:
        """Stop as a held run does: the pending message out of the conversation, its step recorded."""
        messages = list(state.data["messages"])
        if self.held is not None and messages and messages[-1].tool_calls:  # held here: a call may have run
            messages = [*messages[:-1], approval_notice(self.held)]
        await self.finish(messages, held_again=self.held.step_id if self.held is not None else None)
        return _reply(state, messages, APPROVAL_REQUIRED, self.outcomes(messages), steps=0)

    async def finish(self, conversation: list[ChatMessage], *, held_again: str | None) -> None:
        """Record what this step added; from then on the step is closed."""
        done = StepDone(
            step_id=self.step.step_id,
            messages=[message.to_dict() for message in conversation[self.before :]],
            held_again=held_again,
            finished_by=self.worker,
            finished_at=now(),
        )
        await self.ledger.finish_step_async(self.step.sequence, done)
        self.done = done

    async def audit(self, events: list[AuditEvent]) -> None:
        """
        Append the finished step's audit. The step is closed and its calls ran, whatever this append does: a failure
        is logged, not raised (the caller hears what ran), and the next request that reads the step appends the
        events its records prove (`audit_repair.repair_newest_async`).
        """
        store = self.ledger.store
        try:
            await append_audit_async(store, *events)
        except OffloadError as error:
            logger.warning(
                "Held step %s ran, but its audit append failed (repaired at the next request that reads it): %s",
                self.step.step_id,
                error,
            )
            return
        if self.done is not None:
            mark_audited(self.ledger, self.step, self.done)
        if self.held is not None and self.held.guard == MAY_HAVE_RUN_GUARD:
            mark_audited(self.ledger, self.held, None)

    def outcomes(self, conversation: list[ChatMessage]) -> list[CallOutcome]:
        """One outcome per call of the held step, read from what the step added to the conversation."""
        return step_outcomes(self.step, conversation[self.before :], self.ran, self.held)

    def answered(self, outcomes: list[CallOutcome]) -> list[AuditEvent]:
        """
        One audit event per call that did not run here (ran calls have theirs): denied, expired, held, ...

        The expired ones are counted here, where the step that answered them is finished: once per step.
        """
        expired = sum(outcome.outcome == "expired" for outcome in outcomes)
        if expired:
            approval("expired", expired, tenant=self.step.tenant)
        return [
            # Restated from the done record where the call has a request to name the event after, so a repair can
            # write the same document if this append fails.
            outcome_event(self.step, self.done, outcome)
            if outcome.request_id is not None and self.done is not None
            else _event(
                self.step,
                f"approval.{outcome.outcome.replace('-', '_')}",
                self.worker,
                {"reason": outcome.reason},
                request_id=outcome.request_id,
                tool_call_id=outcome.tool_call_id,
                tool_name=outcome.tool_name,
            )
            for outcome in outcomes
            if outcome.outcome not in {"executed", "recorded"}
        ]


@dataclass
class _Call:
    """What resuming does with one pending call."""

    position: int
    call: ToolCall
    key: str
    idempotency: str
    attempt: int = 1
    recorded: bool = False
    uncertain: bool = False
    denial: Ruling | None = None


# Reading the step and its decisions


def _open_step(snapshot: ApprovalSnapshot) -> HeldStep:
    step = snapshot.step
    if step is None:
        raise ApprovalNotFoundError("This session has no held step to resume.")
    if snapshot.done is not None:
        raise ApprovalClaimedError(
            f"Held step {step.sequence} was already resumed; its decisions cannot be used again."
        )
    return step


def _call_keys(first_step_id: str, step: HeldStep) -> list[str]:
    """The names of the held message's calls' claims and outcomes."""
    return [call_key(first_step_id, call.id, position) for position, call in enumerate(step.chat_message().tool_calls)]


@contextlib.asynccontextmanager
async def _released_on_failure(ledger: ApprovalLedger, claim: StepClaim) -> AsyncIterator[None]:
    """
    End this worker's lease on the step when its resumption fails, so a retry need not wait for the lease to lapse.

    As safe as a lapse: a later attempt reuses the calls' recorded results and holds a call claimed without one as
    "may have run"; the claim documents decide, never this worker. A cancellation keeps the lease (a tool may still be
    running in a thread). A release that fails still holds for this worker (`ReleasedClaims`); other workers see the
    lease lapse on its own, or the release once this worker writes it again.
    """
    try:
        yield
    except Exception:
        try:
            await ledger.release_step_async(claim)
        except Exception as error:
            logger.warning("Could not release the claim on held step %s: %s", claim.step_id, error)
        raise


async def _next_attempt(ledger: ApprovalLedger, snapshot: ApprovalSnapshot, step: HeldStep) -> int:
    """
    1 for a step nobody claimed; the next attempt when the last claim's lease has lapsed (its worker died), judged
    when the snapshot was read (the claim was read after that; a renewal since then it cannot see).
    """
    attempts = snapshot.listing.claims_of(step.sequence)
    if not attempts:
        return 1
    last = await ledger.newest_claim_async(snapshot)
    if last is None:  # listed, so read with the snapshot: only a snapshot made by hand lacks it
        last = await ledger.step_claim_async(step.sequence, attempts[-1])
    if snapshot.read_at < last.lease_until:
        raise ApprovalClaimedError(
            f"Held step {step.sequence} is being resumed by {last.claimed_by} (lease until "
            f"{last.lease_until.isoformat()}); if that worker died, it can be resumed once the lease has passed."
        )
    return attempts[-1] + 1


def _without_notice(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The conversation without the "approval required" notices a stop left at its end (resume answers them)."""
    kept = list(messages)
    while kept and APPROVAL_REQUIRED_META_KEY in kept[-1].meta:
        kept.pop()
    return kept


def _result_format(agent: Agent) -> ResultFormat:
    """How the Agent's approval hooks word a call that did not run (the first one's choice), for resume's own."""
    for hook in agent.hooks.get("before_tool", []):
        found = getattr(hook, "result_format", None)
        if found in RESULT_FORMATS:
            return found  # type: ignore[no-any-return]
    return "haystack"


def _with_preceding(messages: list[ChatMessage], step: HeldStep) -> list[ChatMessage]:
    """
    The conversation with what the resume that held `step` again added before it, if the turn that recorded those
    messages was lost (the worker died, or the turn's end could not be written): answers to other calls are kept.
    """
    preceding = [ChatMessage.from_dict(message) for message in step.preceding]
    answers = {message.tool_call_result.origin.id for message in preceding if message.tool_call_result is not None}
    seen = {message.tool_call_result.origin.id for message in messages if message.tool_call_result is not None}
    if not preceding or answers & seen:
        return messages
    return [*messages, *preceding]


def _check_conversation(messages: Sequence[ChatMessage], step: HeldStep) -> None:
    held = [(call.id, call.tool_name, call.arguments) for call in step.chat_message().tool_calls]
    for message in messages:
        if message.tool_calls and [(call.id, call.tool_name, call.arguments) for call in message.tool_calls] == held:
            raise ResumeConversationError(
                "The messages already contain the held step's tool calls: pass the conversation the stopped run "
                "returned (resume adds the held message and its results)."
            )


def _restored_state(serialized: dict[str, Any] | None) -> dict[str, Any]:
    if not serialized:
        return {}
    return dict(State.from_dict(serialized).data)


def _event(step: HeldStep, event: str, actor: str, detail: dict[str, Any], **ids: Any) -> AuditEvent:
    return new_event(
        event=event, actor=actor, tenant=step.tenant, session=step.session, step_id=step.step_id, detail=detail, **ids
    )


# Continuing like the Agent would


def _interrupted(error: Exception, conversation: list[ChatMessage], outcomes: list[CallOutcome]) -> Exception:
    return ResumeInterruptedError(
        f"The held step ran, but continuing the conversation failed: {error}. The conversation with the step's "
        "results is on this error's .messages: persist it and continue with agent.run(messages).",
        conversation,
        outcomes,
    )


def _state_values(agent: Agent, state: State) -> dict[str, Any]:
    # Tools may have written state (outputs_to_state): hand it to the resumed run like the caller's own values.
    return {key: state.data[key] for key in agent.state_schema if key in state.data}


def _stopped(
    agent: Agent, state: State, conversation: list[ChatMessage], reason: str, outcomes: list[CallOutcome]
) -> dict[str, Any]:
    return {**_state_values(agent, state), **_reply(state, conversation, reason, outcomes, steps=1)}


def _reply(
    state: State, messages: list[ChatMessage], reason: str, outcomes: list[CallOutcome], *, steps: int
) -> dict[str, Any]:
    """The Agent's result for a resumed run that ends without calling the model again."""
    return {
        "messages": messages,
        "last_message": messages[-1] if messages else None,
        "step_count": steps,
        "token_usage": {},
        "tool_call_counts": dict(state.data.get("tool_call_counts") or {}),
        "exit_reason": reason,
        OUTCOMES_KEY: outcomes,
    }
