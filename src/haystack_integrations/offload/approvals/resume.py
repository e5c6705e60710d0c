"""
Resuming a held step after its decisions: run what may run exactly once, answer the rest, continue the conversation.

Design: the held step's calls are run *by resume*, through the Agent's own tool executor (see `execution`), and their
results are fed back with the held message; then the Agent continues from the next model call. The alternative, asking
the model to re-issue the call and matching it by arguments digest, costs a model call, depends on the model repeating
itself exactly, and cannot keep the other calls of the step in place. Running them here keeps the conversation exactly
as it would have been without the pause:

    messages given to resume             (the stopped run's messages: the held message was taken out)
    + user note per edited call          (Haystack's modification wording, so the model does not retry)
    + the held assistant message         (edited arguments in place; text, reasoning and meta kept)
    + one tool result per call           (in the model's order: real results, or approval-denied / -expired /
                                          -invalid error results)
    -> agent.run_async(...)              (the next model call sees everything; the run can hold again)

Exactly once across workers: before anything runs, the worker creates ``resume.<step>.json`` with a conditional
create (S3 ``If-None-Match: *``), then one ``claim.<call>.json`` per call it runs. Two workers resuming the same step
get one winner; the loser raises `ApprovalClaimedError` having run nothing. The trade-off is at-most-once: a worker
that dies between its claims and the calls leaves that step unresumable (the claim documents name the worker and the
time; the audit has no execution for them), which is the right failure for tools with side effects. The audit events
of a resume (``approval.resumed`` and one per call) are written together once the calls have run.

Every decision is checked again when it is used (tenant, session, request, tool call id, tool, arguments digest,
expiry: see `binding`), and approved arguments are re-validated against the live tool's schema.
"""

import asyncio
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.hooks.tool_result_offloading import RESULT_STORE_CONTEXT_KEY
from haystack.tools.tool import Tool

from haystack_integrations.offload.approvals.audit import append_audit, append_audit_async, new_event
from haystack_integrations.offload.approvals.binding import arguments_digest, binding_problem
from haystack_integrations.offload.approvals.channels import APPROVAL_CHANNEL_KEY, DurableApprovals
from haystack_integrations.offload.approvals.errors import (
    ApprovalClaimedError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    InvalidApprovalEditError,
    ResumeConversationError,
    ResumeInterruptedError,
)
from haystack_integrations.offload.approvals.execution import (
    after_tool,
    after_tool_async,
    execute,
    execute_async,
    resumed_state,
    run_tools,
)
from haystack_integrations.offload.approvals.ledger import ApprovalLedger, ApprovalListing, now
from haystack_integrations.offload.approvals.outcomes import denial_result, denied_by_person, expired, resumed_shape
from haystack_integrations.offload.approvals.records import (
    APPROVAL_INVALID,
    ApprovalDecision,
    AuditEvent,
    CallOutcome,
    Denial,
    ErrorKind,
    ExecutionClaim,
    HeldStep,
    StepClaim,
)
from haystack_integrations.offload.approvals.validation import validated_arguments

OUTCOMES_KEY = "approval_outcomes"
"""The key under which `resume` adds one `CallOutcome` per call of the held step to the Agent's result."""

_OUTCOME_OF_KIND: dict[ErrorKind, Literal["denied", "expired", "invalid"]] = {
    "approval-denied": "denied",
    "approval-expired": "expired",
    "approval-invalid": "invalid",
}


def default_worker() -> str:
    """This process's name in claims and the audit: ``<host>:<pid>``."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class _Plan:
    """What resuming a step does with each of its calls, decided before anything runs."""

    step: HeldStep
    calls: list[ToolCall]
    denials: dict[int, tuple[Denial, str | None]] = field(default_factory=dict)
    edits: dict[int, dict[str, Any]] = field(default_factory=dict)

    def to_run(self) -> list[int]:
        return [position for position in range(len(self.calls)) if position not in self.denials]


def resume(
    agent: Agent,
    messages: Sequence[ChatMessage],
    store: object,
    *,
    hook_context: dict[str, Any] | None = None,
    worker: str | None = None,
    **run_kwargs: Any,
) -> dict[str, Any]:
    """
    Continue a conversation whose run stopped for approvals, once its requests are decided (or expired).

    ```python
    reply = agent.run(messages, hook_context=offload_context(store, approval_channel=DurableApprovals()))
    # ... later, in any worker, after decide(store, request_id, Decision.approve()):
    reply = resume(agent, reply["messages"], store)
    print(reply["last_message"].text)
    ```

    :param agent: The Agent that held the step (same tools and hooks; any instance, in any process).
    :param messages: The conversation as the stopped run returned it (the held message is not in it).
    :param store: The session's store; the held step is the session's newest.
    :param hook_context: The resumed run's `hook_context`; by default ``offload_context(store,
        approval_channel=DurableApprovals())``, so a further call that needs approval holds again.
    :param worker: This worker's name for claims and the audit; by default ``<host>:<pid>``.
    :param run_kwargs: Passed to `Agent.run` (e.g. ``generation_kwargs``, state values).
    :returns: The Agent's result, plus ``approval_outcomes``: one `CallOutcome` per call of the step. If a call that
        ran is one of the Agent's exit conditions, the run ends there (as the Agent would) without a model call.
    :raises ApprovalNotFoundError: If the session has no held step.
    :raises ApprovalPendingError: If some requests are neither decided nor expired; nothing ran.
    :raises ApprovalClaimedError: If another worker already resumed the step (or is resuming it); nothing ran here.
    :raises ResumeConversationError: If `messages` already contains the held message.
    :raises ResumeInterruptedError: If the step ran but the Agent then failed to continue; the conversation with the
        step's results is on the error's ``messages``, so nothing is lost.
    """
    ledger = ApprovalLedger(store)
    worker = worker or default_worker()
    context = _resume_context(store, hook_context)
    listing = ledger.listing()
    step_id = _step_to_resume(listing)
    step = ledger.step(step_id)
    decisions = {request: ledger.decision(request) for request in listing.decisions_of(step_id)}
    tools = run_tools(agent, run_kwargs.get("tools"))
    plan = _plan(step, decisions, tools, at=now())
    _check_conversation(messages, step)
    try:
        ledger.claim_step(_step_claim(step, worker))
        for claim in _call_claims(plan, worker):
            ledger.claim_call(claim)
    except ApprovalClaimedError:
        append_audit(store, _claim_lost(step, worker))
        raise
    resumed_event = _resumed(step, worker)
    state = resumed_state(agent, list(messages), tools=tools, hook_context=context, values=run_kwargs)
    ran = execute(agent, [plan.calls[position] for position in plan.to_run()], state)
    results, outcomes, events = _results(plan, ran, worker)
    shaped, assistant = resumed_shape(step.chat_message(), plan.calls, results, plan.edits)
    append_audit(store, resumed_event, *events)
    conversation = after_tool(agent, state, [*messages, *shaped])
    exit_tool = _exit_condition(agent, assistant, results)
    if exit_tool is not None:
        return _finished(agent, state, conversation, exit_tool, outcomes)
    run_kwargs.update(_state_values(agent, state))
    try:
        result = _continuing(agent).run(messages=conversation, hook_context=context, **run_kwargs)
    except Exception as error:
        raise _interrupted(error, conversation, outcomes) from error
    result[OUTCOMES_KEY] = outcomes
    return result


async def resume_async(
    agent: Agent,
    messages: Sequence[ChatMessage],
    store: object,
    *,
    hook_context: dict[str, Any] | None = None,
    worker: str | None = None,
    **run_kwargs: Any,
) -> dict[str, Any]:
    """
    Async `resume`: continue a conversation whose run stopped for approvals.

    ```python
    reply = await resume_async(agent, history, results.for_session(tenant, chat_id))
    ```

    Parameters, result and errors are those of `resume`.
    """
    ledger = ApprovalLedger(store)
    worker = worker or default_worker()
    context = _resume_context(store, hook_context)
    listing = await ledger.listing_async()
    step_id = _step_to_resume(listing)
    # The listing already names the step's decisions, so they are read alongside the step, not after it.
    decided = listing.decisions_of(step_id)
    step, found = await asyncio.gather(
        ledger.step_async(step_id), asyncio.gather(*(ledger.decision_async(request) for request in decided))
    )
    decisions = dict(zip(decided, found, strict=True))
    tools = run_tools(agent, run_kwargs.get("tools"))
    plan = _plan(step, decisions, tools, at=now())
    _check_conversation(messages, step)
    try:
        await ledger.claim_step_async(_step_claim(step, worker))
        await asyncio.gather(*(ledger.claim_call_async(claim) for claim in _call_claims(plan, worker)))
    except ApprovalClaimedError:
        await append_audit_async(store, _claim_lost(step, worker))
        raise
    resumed_event = _resumed(step, worker)
    state = resumed_state(agent, list(messages), tools=tools, hook_context=context, values=run_kwargs)
    ran = await execute_async(agent, [plan.calls[position] for position in plan.to_run()], state)
    results, outcomes, events = _results(plan, ran, worker)
    shaped, assistant = resumed_shape(step.chat_message(), plan.calls, results, plan.edits)
    await append_audit_async(store, resumed_event, *events)
    conversation = await after_tool_async(agent, state, [*messages, *shaped])
    exit_tool = _exit_condition(agent, assistant, results)
    if exit_tool is not None:
        return _finished(agent, state, conversation, exit_tool, outcomes)
    run_kwargs.update(_state_values(agent, state))
    try:
        result = await _continuing(agent).run_async(messages=conversation, hook_context=context, **run_kwargs)
    except Exception as error:
        raise _interrupted(error, conversation, outcomes) from error
    result[OUTCOMES_KEY] = outcomes
    return result


# Planning: pure functions of what was read.


def _step_to_resume(listing: ApprovalListing) -> str:
    step_id = listing.newest_step_id()
    if step_id is None:
        raise ApprovalNotFoundError("This session has no held step to resume.")
    if listing.resumed(step_id):
        raise ApprovalClaimedError(f"Held step {step_id!r} was already resumed; its decisions cannot be used again.")
    return step_id


def _plan(step: HeldStep, decisions: dict[str, ApprovalDecision | None], tools: list[Tool], *, at: datetime) -> _Plan:
    message = step.chat_message()
    plan = _Plan(step=step, calls=list(message.tool_calls))
    by_name = {tool.name: tool for tool in tools}
    waiting = []
    for held in step.calls:
        position = held.position
        if held.denial is not None:
            plan.denials[position] = (held.denial, None)
            continue
        request = held.request
        if request is None:
            continue  # no approval needed: runs as the model asked
        decision = decisions.get(request.request_id)
        if decision is None:
            if request.expired(at):
                plan.denials[position] = (expired("nobody decided before the request expired."), request.request_id)
            else:
                waiting.append(request.request_id)
            continue
        problem = binding_problem(decision, request, tenant=step.tenant, session=step.session, now=at)
        if problem is not None:
            plan.denials[position] = (problem, request.request_id)
            continue
        if not decision.approved:
            plan.denials[position] = (denied_by_person(decision.reason), request.request_id)
            continue
        arguments = dict(decision.arguments or {})
        tool = by_name.get(request.tool_name)
        if tool is not None:
            try:
                arguments = validated_arguments(request.tool_name, tool.parameters, arguments)
            except InvalidApprovalEditError as error:  # the tool changed since the decision was validated
                plan.denials[position] = (Denial(kind=APPROVAL_INVALID, reason=str(error)), request.request_id)
                continue
        if decision.edited:
            plan.edits[position] = arguments
            plan.calls[position] = replace(plan.calls[position], arguments=arguments)
    if waiting:
        raise ApprovalPendingError(
            f"{len(waiting)} approval request(s) of this step still wait for a decision: {', '.join(waiting)}.",
            waiting,
        )
    return plan


def _check_conversation(messages: Sequence[ChatMessage], step: HeldStep) -> None:
    held = [(call.id, call.tool_name, call.arguments) for call in step.chat_message().tool_calls]
    for message in messages:
        if message.tool_calls and [(call.id, call.tool_name, call.arguments) for call in message.tool_calls] == held:
            raise ResumeConversationError(
                "The messages already contain the held step's tool calls: pass the conversation the stopped run "
                "returned (resume adds the held message and its results)."
            )


def _resume_context(store: object, hook_context: dict[str, Any] | None) -> dict[str, Any]:
    if hook_context is None:
        return {RESULT_STORE_CONTEXT_KEY: store, APPROVAL_CHANNEL_KEY: DurableApprovals()}
    if not isinstance(hook_context, dict):
        raise TypeError(f"hook_context must be a dictionary, got {type(hook_context).__name__}.")
    context = dict(hook_context)
    given = context.setdefault(RESULT_STORE_CONTEXT_KEY, store)
    if getattr(given, "scope", None) != getattr(store, "scope", None):
        raise ValueError("hook_context carries the store of another scope than the one being resumed.")
    return context


# Records


def _step_claim(step: HeldStep, worker: str) -> StepClaim:
    return StepClaim(
        step_id=step.step_id, tenant=step.tenant, session=step.session, claimed_by=worker, claimed_at=now()
    )


def _call_claims(plan: _Plan, worker: str) -> list[ExecutionClaim]:
    claims = []
    for position in plan.to_run():
        held = plan.step.calls[position]
        call = plan.calls[position]
        claims.append(
            ExecutionClaim(
                call_key=plan.step.call_key_of(held),
                step_id=plan.step.step_id,
                tenant=plan.step.tenant,
                session=plan.step.session,
                tool_call_id=call.id,
                tool_name=call.tool_name,
                arguments_digest=arguments_digest(call.arguments),
                request_id=held.request.request_id if held.request is not None else None,
                claimed_by=worker,
                claimed_at=now(),
            )
        )
    return claims


def _results(
    plan: _Plan, ran: list[ChatMessage], worker: str
) -> tuple[list[ChatMessage], list[CallOutcome], list[AuditEvent]]:
    """Merge the run calls' results with the denials, in the model's order, with an outcome and an event for each."""
    executed = dict(zip(plan.to_run(), ran, strict=True))
    results: list[ChatMessage] = []
    outcomes: list[CallOutcome] = []
    events: list[AuditEvent] = []
    step = plan.step
    for held, call in zip(step.calls, plan.calls, strict=True):
        request_id = held.request.request_id if held.request is not None else None
        ids: dict[str, Any] = {"tool_call_id": call.id, "tool_name": call.tool_name, "request_id": request_id}
        if held.position in executed:
            message = executed[held.position]
            digest = arguments_digest(call.arguments)
            results.append(message)
            outcomes.append(
                CallOutcome(
                    position=held.position,
                    tool_call_id=call.id,
                    tool_name=call.tool_name,
                    request_id=request_id,
                    outcome="executed",
                    arguments_digest=digest,
                )
            )
            error = bool(message.tool_call_result is not None and message.tool_call_result.error)
            events.append(_event(step, "approval.executed", worker, digest, {"error": error}, **ids))
            continue
        denial, _ = plan.denials[held.position]
        results.append(denial_result(call, denial, request_id=request_id))
        outcome = _OUTCOME_OF_KIND[denial.kind]
        outcomes.append(
            CallOutcome(
                position=held.position,
                tool_call_id=call.id,
                tool_name=call.tool_name,
                request_id=request_id,
                outcome=outcome,
                reason=denial.reason,
            )
        )
        detail = {"kind": denial.kind, "reason": denial.reason}
        events.append(_event(step, f"approval.{outcome}", worker, held.arguments_digest, detail, **ids))
    return results, outcomes, events


def _event(
    step: HeldStep, event: str, actor: str, digest: str | None, detail: dict[str, Any], **ids: Any
) -> AuditEvent:
    return new_event(
        event=event,
        actor=actor,
        tenant=step.tenant,
        session=step.session,
        step_id=step.step_id,
        arguments_digest=digest,
        detail=detail,
        **ids,
    )


def _resumed(step: HeldStep, worker: str) -> AuditEvent:
    return _event(step, "approval.resumed", worker, None, {"calls": len(step.calls)})


def _claim_lost(step: HeldStep, worker: str) -> AuditEvent:
    return _event(step, "approval.claim_lost", worker, None, {})


# Continuing like the Agent would


def _exit_condition(agent: Agent, assistant: ChatMessage, results: list[ChatMessage]) -> str | None:
    """The Agent's own rule: an exit-condition tool that ran without error ends the run (any errored one cancels)."""
    if agent.exit_conditions == ["text"]:
        return None
    errored = {
        message.tool_call_result.origin.tool_name
        for message in results
        if message.tool_call_result is not None and message.tool_call_result.error
    }
    found = None
    for call in assistant.tool_calls:
        if call.tool_name in agent.exit_conditions:
            if call.tool_name in errored:
                return None
            found = found or call.tool_name
    return found


def _interrupted(error: Exception, conversation: list[ChatMessage], outcomes: list[CallOutcome]) -> Exception:
    return ResumeInterruptedError(
        f"The held step ran, but continuing the conversation failed: {error}. The conversation with the step's "
        "results is on this error's .messages: persist it and continue with agent.run(messages).",
        conversation,
        outcomes,
    )


def _continuing(agent: Agent) -> Agent:
    """
    The Agent that continues the conversation: the same one, minus its prompts.

    An Agent renders its ``system_prompt`` before, and its ``user_prompt`` after, the messages of every run. The
    conversation resume hands over already starts with the system prompt and holds the user's turn, so rendering them
    again would duplicate both; a clone without prompts (same generator, tools and hooks) continues it as it is.
    """
    if agent.system_prompt is None and agent.user_prompt is None:
        return agent
    return agent.clone(system_prompt=None, user_prompt=None, required_variables=None)


def _state_values(agent: Agent, state: Any) -> dict[str, Any]:
    # Tools may have written state (outputs_to_state): hand it to the resumed run like the caller's own values.
    return {key: state.data[key] for key in agent.state_schema if key in state.data}


def _finished(
    agent: Agent, state: Any, conversation: list[ChatMessage], exit_tool: str, outcomes: list[CallOutcome]
) -> dict[str, Any]:
    return {
        **_state_values(agent, state),
        "messages": conversation,
        "last_message": conversation[-1],
        "step_count": 1,
        "token_usage": {},
        "tool_call_counts": dict(state.data.get("tool_call_counts") or {}),
        "exit_reason": exit_tool,
        OUTCOMES_KEY: outcomes,
    }
