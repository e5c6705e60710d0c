"""
`ApprovalHook`: a ``before_tool`` hook that asks a person before chosen tool calls run, through the run's channel.

It follows Haystack's `ConfirmationHook` contract (rules keyed by tool name, tuple or ``"*"``; Haystack's
`ConfirmationPolicy` objects as rules; request-scoped resources from ``hook_context``), with what a multi-user server
adds: the channel comes per run, "ask once" is remembered per session in the store, and the durable channel stops the
run with its requests recorded so that a decision made later, in any worker, can resume it exactly once.
"""

import contextlib
import hashlib
import json
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from haystack.components.agents.state.state import State
from haystack.components.agents.state.state_utils import replace_values
from haystack.core.serialization import default_from_dict, default_to_dict, generate_qualified_class_name
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.hooks.human_in_the_loop.types import ConfirmationStrategy
from haystack.tools.tool import Tool
from haystack.tracing.tracer import tracer

from haystack_integrations.offload.approvals.approval_records import (
    APPROVAL_DENIED,
    APPROVAL_INVALID,
    ApprovalRequest,
    AuditEvent,
    Decision,
    Denial,
    HeldCall,
    HeldStep,
    RememberApproval,
    RememberedApproval,
    approved_arguments,
    arguments_digest,
    validated_arguments,
    verdict_for,
)
from haystack_integrations.offload.approvals.audit import (
    append_audit_async,
    new_event,
    request_event,
    requested_event,
)
from haystack_integrations.offload.approvals.audit_repair import mark_audited
from haystack_integrations.offload.approvals.channels import (
    APPROVAL_REQUIRED,
    ApprovalChannel,
    CallbackApprovals,
    DurableApprovals,
    StrategyApprovals,
    channel_from,
    strategy_input,
)
from haystack_integrations.offload.approvals.errors import InvalidApprovalEditError
from haystack_integrations.offload.approvals.ledger import ApprovalLedger, now, request_id
from haystack_integrations.offload.approvals.outcomes import (
    RESULT_FORMATS,
    ResultFormat,
    approval_notice,
    denied_by_person,
    expired,
    in_process_shape,
)
from haystack_integrations.offload.approvals.rules import (
    AskOncePerSession,
    Rule,
    RuleKey,
    SessionPolicies,
    checked_rules,
    deserialize_rules,
    is_strategy,
    load_policies_async,
    memory_key,
    remembered_approval,
    rule_for,
    rule_key_for,
    save_policies_async,
    serialize_rules,
)
from haystack_integrations.offload.approvals.rulings import Ruling, Rulings
from haystack_integrations.offload.context import RESULT_STORE_CONTEXT_KEY, RESUMING_KEY, context_store, hook_context_of
from haystack_integrations.offload.metrics import approval
from haystack_integrations.offload.sync_calls import run_blocking
from haystack_integrations.offload.types import SessionDocumentSource

_STRATEGY_SPAN = "haystack.agent.hook.human_in_the_loop.strategy"

# Keys of the Agent's own bookkeeping in State; everything else is the run's own state, kept with a held step.
_AGENT_STATE_KEYS = [
    "messages",
    "step_count",
    "token_usage",
    "tool_call_counts",
    "exit_reason",
    "continue_run",
    "stop_run",
    "tools",
    "hook_context",
    "context_tokens",
]

HELD_STEPS_KEY = "offload.held_steps"
"""
The `hook_context` key of a list a run's caller may put there: each step the run holds is appended to it once its
requests are recorded and audited, so the caller knows what waits without reading back what the run just wrote
(`ChatService` does; a run without the key is unchanged).
"""

UNBOUND_CALL = Denial(
    kind=APPROVAL_DENIED,
    reason="This call needs approval but has no tool-call id, so no decision could be bound to it; it was not run.",
)


@dataclass
class _Screened:
    """One pending call and whether it needs asking."""

    position: int
    call: ToolCall
    tool: Tool | None
    rule: Rule | None
    ask: bool
    digest: str
    memory: str | None = None
    remember: RememberApproval | None = None


@dataclass
class _Step:
    """What one ``before_tool`` invocation works on: the pending message, the run's channel and ledger, rulings."""

    message: ChatMessage
    screened: list[_Screened]
    channel: ApprovalChannel
    ledger: ApprovalLedger | None
    created: datetime
    step_id: str
    resuming: Rulings | None = None
    result_format: ResultFormat = "haystack"
    policies: SessionPolicies = field(default_factory=SessionPolicies)
    requests: dict[int, ApprovalRequest] = field(default_factory=dict)
    denials: dict[int, tuple[Denial, str | None]] = field(default_factory=dict)
    edits: dict[int, dict[str, Any]] = field(default_factory=dict)
    memories: list[tuple[str, RememberedApproval]] = field(default_factory=list)
    events: list[AuditEvent] = field(default_factory=list)

    def memory_keys(self) -> list[str]:
        return [item.memory for item in self.screened if item.ask and item.memory is not None]

    def apply_memory(self, found: list[RememberedApproval | None]) -> None:
        remembered = iter(found)
        for item in self.screened:
            if item.ask and item.memory is not None:
                record = next(remembered)
                if record is not None and self.created < record.expires:
                    item.ask = False

    def asks(self) -> bool:
        return any(item.ask for item in self.screened)

    @property
    def tenant(self) -> str | None:
        return self.ledger.tenant if self.ledger is not None else None


class ApprovalHook:
    """
    Ask a person before chosen tool calls run; the channel that asks comes with each run.

    ```python
    from haystack.components.agents import Agent
    from haystack.hooks.human_in_the_loop import AlwaysAskPolicy
    from haystack_integrations.offload import ApprovalHook, AskOncePerSession, DurableApprovals, offload_context

    agent = Agent(
        chat_generator=...,
        tools=[send_invoice, send_email, web_search],
        hooks={"before_tool": [ApprovalHook({
            "send_invoice": AlwaysAskPolicy(),
            "send_email": AskOncePerSession(ttl=3600),
        })]},
    )

    # per request: the run stops with exit_reason "approval_required" and its requests stored in the session
    store = results.for_session(tenant=user.org_id, session=chat_id)
    reply = await agent.run_async(messages, hook_context=offload_context(store, approval_channel=DurableApprovals()))
    ```

    Then, from any worker: `pending_approvals(store)`, `decide(store, request_id, Decision.approve())`, and
    `resume_async(agent, reply["messages"], store)`.

    Rules are keyed like Haystack's `ConfirmationHook`: a tool name, a tuple of names, or ``"*"``; a tool without a
    rule runs without asking, and a call to an unknown tool passes through so the Agent reports it as usual.

    Channels (``hook_context["approval_channel"]``):

    - `CallbackApprovals`: asks in process and waits (a timeout denies). The Agent runs the approved calls, with
      edited arguments if any; denied ones get an error result, in Haystack's `ConfirmationHook` message shape;
    - `DurableApprovals`: records the step (the assistant message, one request per call that needs approval) in the
      session's store, takes the message out of the run's conversation (resume puts it back with its results) and
      stops the run with exit reason ``"approval_required"``. Every call of the step waits, including those that
      need no approval, so the step runs together and its results keep the model's order. (If that step was the
      run's last allowed one, the Agent reports ``"max_agent_steps"`` instead: `pending_approvals(store)` is the
      reliable check. The stopping step runs no tool, but ``after_tool`` hooks still run, as after any step, so they
      must tolerate seeing the previous step's results again, as Haystack's offload hook does.)

    Multi-user use: the hook holds only its rules. The channel, the store (and with it the tenant and session), and
    the memory of `AskOncePerSession` belong to the run, so one hook serves every user, and `Agent.to_dict()` never
    meets a live channel.
    """

    allowed_hook_points = ("before_tool",)

    def __init__(
        self,
        rules: Mapping[RuleKey, Rule] | None = None,
        *,
        confirmation_strategies: Mapping[RuleKey, ConfirmationStrategy] | None = None,
        name: str | None = None,
        result_format: ResultFormat = "haystack",
    ) -> None:
        """
        :param rules: Tool name, tuple of tool names, or ``"*"`` -> a `ConfirmationPolicy` (Haystack's
            `AlwaysAskPolicy` / `NeverAskPolicy`, `AskOncePerSession`, `AskWhen`, or your own) or a Haystack
            `ConfirmationStrategy` (e.g. `BlockingConfirmationStrategy` with one of Haystack's UIs).
        :param confirmation_strategies: `ConfirmationHook`'s own argument, accepted as it is: strategies keyed the
            same way. Rules and strategies may be given together, for different keys.
        :param name: The hook's guard name, which binds its decisions to it when several approval hooks guard one
            Agent; by default a digest of its rules (two hooks with the same rules then share their decisions).
        :param result_format: How a call that did not run is worded for the model: ``"haystack"`` (the default,
            `ConfirmationHook`'s sentences) or ``"structured"`` (``{"error": {"kind": ..., ...}}``).
        :raises TypeError: If a key or rule is invalid, a key is given twice, or a rule is Haystack's process-wide
            `AskOncePolicy`.
        :raises ValueError: If `result_format` is unknown.
        """
        merged: dict[RuleKey, Rule] = dict(rules or {})
        for key, strategy in (confirmation_strategies or {}).items():
            if key in merged:
                raise TypeError(f"{key!r} has both a rule and a confirmation strategy: give one.")
            merged[key] = strategy
        if result_format not in RESULT_FORMATS:
            raise ValueError(f"result_format must be one of {RESULT_FORMATS}, got {result_format!r}.")
        self.rules = checked_rules(merged)
        self._name = name
        self.guard = name if name is not None else _default_guard(self.rules)
        self.result_format: ResultFormat = result_format

    # Hook protocol

    def run(self, state: State) -> None:
        """
        Ask about the pending tool calls and rewrite the conversation, or hold the step and stop the run.

        :param state: The Agent's live `State` (``messages``, ``tools`` and ``hook_context`` are read from
            `state.data`, never deep-copied).
        :raises ValueError: If a call needs approval and the run brought no channel, or the durable channel has no
            session-scoped store.
        :raises Exception: Whatever an in-process callback raised.
        """
        # `run_async` waited for, with one difference, kept from Haystack's `ConfirmationHook`: a sync run asks through
        # the channel's sync `ask` (a strategy's `run`, not its `run_async`), on the loop this call owns.
        run_blocking(self._guard_async, state, ask_sync=True)

    async def run_async(self, state: State) -> None:
        """Async `run`: store I/O and callbacks never block the event loop."""
        await self._guard_async(state, ask_sync=False)

    async def _guard_async(self, state: State, *, ask_sync: bool) -> None:
        ledger = _context_ledger(state)
        policies = await load_policies_async(self.rules, self.guard, ledger)
        await self._run_async(state, policies, ask_sync=ask_sync)
        await save_policies_async(policies, self.guard, ledger)

    async def _run_async(self, state: State, policies: SessionPolicies, *, ask_sync: bool) -> None:
        step = self._decided_step(state, policies)
        if step is None:
            return
        if step.ledger is not None:
            step.apply_memory([await step.ledger.remembered_async(key) for key in step.memory_keys()])
        held = None
        if isinstance(step.channel, DurableApprovals):
            if step.asks():
                held = await _durable_ledger(step).hold_async(step.message, **self._holding(step, state))
                _stop(state, step, held)
        else:
            for request in self._make_requests(step, step.step_id):  # none when no call asks
                with self._answering(step, request) as answer:
                    answer(step.channel.ask(request) if ask_sync else await step.channel.ask_async(request))
        if step.ledger is not None:
            for key, record in step.memories:
                await step.ledger.remember_async(key, record)
            await append_audit_async(step.ledger.store, *step.events)
            if held is not None:  # its requests are in the audit: this process need not check (`audit_repair`)
                mark_audited(step.ledger, held, None)
                _tell_held(state, held)
        _rewrite(state, step)

    # Serialization

    @property
    def confirmation_strategies(self) -> dict[RuleKey, Rule]:
        """`ConfirmationHook`'s attribute: the hook's rules, strategies and policies alike, by key."""
        return dict(self.rules)

    def to_dict(self) -> dict[str, Any]:
        """Serialize the hook: policies under ``rules``, strategies under ``confirmation_strategies`` (as Haystack)."""
        policies = {key: rule for key, rule in self.rules.items() if not is_strategy(rule)}
        strategies = {key: rule for key, rule in self.rules.items() if is_strategy(rule)}
        return default_to_dict(
            self,
            rules=serialize_rules(policies) if policies else None,
            confirmation_strategies=serialize_rules(strategies) if strategies else None,
            name=self._name,
            result_format=self.result_format,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ApprovalHook":
        """Deserialize the hook and its rules."""
        init = dict(data.get("init_parameters", {}))
        for key in ("rules", "confirmation_strategies"):
            if init.get(key) is not None:
                init[key] = deserialize_rules(init[key])
        return default_from_dict(cls, {**data, "init_parameters": init})

    # The steps of `_run_async` that do no I/O.

    def _decided_step(self, state: State, policies: SessionPolicies) -> _Step | None:
        """
        Begin the step, answering in place what needs no asking: decisions this guard already made (when resuming)
        and, on the durable channel, calls with no id (nothing to bind a decision to).

        Those answers rewrite the conversation (Haystack's shape) and the calls still running are screened again on the
        rewritten message, so what is held is exactly what still waits for this guard.
        """
        step = self._begin(state, policies)
        answered: list[AuditEvent] = []
        for _ in range(3):  # a later pass sees only approvals whose arguments are already the approved ones
            if step is None:
                return None
            step.events[:0] = answered
            if step.resuming is not None:
                self._apply_rulings(step)
            if not isinstance(step.channel, StrategyApprovals):
                _deny_unbound(step)
            if not step.denials and not step.edits:
                return step
            _rewrite(state, step)
            answered = list(step.events)
            step = self._begin(state, policies)
        return step

    def _begin(self, state: State, policies: SessionPolicies) -> _Step | None:
        messages = state.data.get("messages") or []
        if not messages or not messages[-1].tool_calls:
            return None
        message: ChatMessage = messages[-1]
        tools = {tool.name: tool for tool in state.data.get("tools") or []}
        screened = [self._screen(position, call, tools, policies) for position, call in enumerate(message.tool_calls)]
        if not any(item.ask for item in screened):
            return None
        hook_context = hook_context_of(state)
        resuming = hook_context.get(RESUMING_KEY)
        channel = channel_from(hook_context)
        if channel is None and all(is_strategy(item.rule) for item in screened if item.ask):
            # No channel in the run: a hook built from Haystack strategies asks through them, like ConfirmationHook.
            channel = StrategyApprovals(self._strategy_for, hook_context)
        if channel is None:
            asked = sorted({item.call.tool_name for item in screened if item.ask})
            raise ValueError(
                f"Tool calls to {asked} need approval but this run has no approval channel: pass "
                "hook_context=offload_context(store, approval_channel=CallbackApprovals(...) or DurableApprovals())."
            )
        store = hook_context.get(RESULT_STORE_CONTEXT_KEY)
        if isinstance(channel, DurableApprovals):
            if store is None:
                raise ValueError(
                    "DurableApprovals records requests in the session's store: pass "
                    "hook_context=offload_context(results.for_session(tenant, session), approval_channel=...)."
                )
            ledger: ApprovalLedger | None = ApprovalLedger(store)
        else:
            ledger = _optional_ledger(store)
        created = now()
        # In-process requests are never stored as a step: sequence 0 marks them, the random part keeps them apart.
        step_id = f"{0:08d}-{secrets.token_hex(6)}"
        return _Step(
            message,
            screened,
            channel,
            ledger,
            created,
            step_id,
            resuming=resuming,
            result_format=self.result_format,
            policies=policies,
        )

    def _asker(self, channel: ApprovalChannel, request: ApprovalRequest) -> object:
        """What asks about `request`, for tracing: the Haystack strategy itself, or the run's channel."""
        return self._strategy_for(request.tool_name) if isinstance(channel, StrategyApprovals) else channel

    def _strategy_for(self, tool_name: str) -> Any:
        return rule_for(tool_name, self.rules)

    def _screen(self, position: int, call: ToolCall, tools: dict[str, Tool], policies: SessionPolicies) -> _Screened:
        tool = tools.get(call.tool_name)
        key = rule_key_for(call.tool_name, self.rules) if tool is not None else None
        rule = self.rules[key] if key is not None else None
        digest = arguments_digest(call.arguments)
        # An unknown tool passes through unasked, as in Haystack: the Agent reports it to the model.
        if tool is None or rule is None or key is None:
            return _Screened(position, call, tool, rule, ask=False, digest=digest)
        policy = policies.policy(key, rule)  # a strategy without a policy decides every call itself
        ask = policy is None or bool(policy.should_ask(call.tool_name, tool.description, dict(call.arguments)))
        screened = _Screened(position, call, tool, rule, ask=ask, digest=digest)
        if ask and isinstance(policy, AskOncePerSession):
            screened.remember = policy.remember()
            screened.memory = memory_key(call.tool_name, digest if policy.per_arguments else None)
        return screened

    def _apply_rulings(self, step: _Step) -> None:
        """Answer the calls this guard already decided on, from the resumed step's decisions."""
        resuming = step.resuming
        assert resuming is not None  # noqa: S101 - only called when resuming
        for item in step.screened:
            if not item.ask:
                continue
            ruling = resuming.ruling(self.guard, item.call)
            if ruling is None:
                continue
            item.ask = False
            self._apply_ruling(step, item, ruling)

    def _apply_ruling(self, step: _Step, item: _Screened, ruling: Ruling) -> None:
        request = ruling.request
        self._learn(step, request, ruling.decision())
        if ruling.denial is not None:
            step.denials[item.position] = (ruling.denial, request.request_id)
            return
        arguments = ruling.arguments or {}
        if arguments == dict(item.call.arguments):
            return
        try:  # the live tool may have changed since the decision was validated
            parameters = item.tool.parameters if item.tool is not None else request.parameters
            step.edits[item.position] = validated_arguments(request.tool_name, parameters, arguments)
        except InvalidApprovalEditError as error:
            step.denials[item.position] = (Denial(kind=APPROVAL_INVALID, reason=str(error)), request.request_id)

    def _make_requests(self, step: _Step, step_id: str) -> list[ApprovalRequest]:
        channel = step.channel
        ttl = channel.ttl if isinstance(channel, DurableApprovals) else channel.timeout
        tenant = step.ledger.tenant if step.ledger is not None else None
        session = step.ledger.session if step.ledger is not None else None
        step.requests.clear()
        for item in step.screened:
            if not item.ask or item.tool is None or item.rule is None:
                continue
            if item.call.id is None and not isinstance(channel, StrategyApprovals):
                continue  # nothing to bind a decision to: denied in place (_deny_unbound)
            step.requests[item.position] = ApprovalRequest(
                request_id=request_id(step_id, item.position),
                step_id=step_id,
                guard=self.guard,
                tenant=tenant,
                session=session,
                position=item.position,
                tool_call_id=item.call.id,
                tool_name=item.call.tool_name,
                tool_description=item.tool.description,
                arguments=dict(item.call.arguments),
                arguments_digest=item.digest,
                parameters=item.tool.parameters,
                rule=type(item.rule).__name__,
                requested_by=channel.actor,
                created=step.created,
                expires=step.created + timedelta(seconds=ttl),
                remember=item.remember,
            )
        return list(step.requests.values())

    def _holding(self, step: _Step, state: State) -> dict[str, Any]:
        """What `ApprovalLedger.hold` records with the message: its calls, who holds it, and the run's state."""
        ledger = _durable_ledger(step)
        resuming = step.resuming

        def calls(step_id: str) -> list[HeldCall]:
            self._make_requests(step, step_id)
            return [self._held_call(step, item) for item in step.screened]

        return {
            "calls": calls,
            # Holding again while resuming step n takes the next number after n without listing; a race moves it on.
            "after": resuming.step.sequence if resuming is not None else None,
            "tenant": ledger.tenant,
            "session": ledger.session,
            "guard": self.guard,
            "created": step.created,
            "requested_by": step.channel.actor,
            "continues": resuming.step.step_id if resuming is not None else None,
            "state": resuming.state if resuming is not None else _run_state(state),
            # Held again while resuming: what this resume added so far stays with the step, so losing its turn is safe.
            "preceding": resuming.preceding(state.data["messages"]) if resuming is not None else [],
        }

    @staticmethod
    def _held_call(step: _Step, item: _Screened) -> HeldCall:
        request = step.requests.get(item.position)
        denial = UNBOUND_CALL if request is None and item.ask else None
        return HeldCall.of(item.position, item.call, item.digest, request, denial)

    @contextlib.contextmanager
    def _answering(self, step: _Step, request: ApprovalRequest) -> Iterator[Callable[[Decision | None], None]]:
        """
        Ask about `request` inside its tracing span: the yielded function takes the channel's answer, which is then
        applied to the step; an answer the channel could not understand is refused.
        """
        step.events.append(request_event("approval.requested", request, actor=step.channel.actor))
        approval("requested", tenant=step.tenant)  # in process: a person is asked now (durable: `hold`)
        answers: list[Decision | None] = []
        with _asking(self._asker(step.channel, request), request) as traced:
            try:
                yield lambda decision: answers.append(traced(decision))
            except InvalidApprovalEditError as error:
                self._refuse(step, request, str(error), actor=None)
                return
        self._apply(step, request, answers[0])

    @staticmethod
    def _refuse(step: _Step, request: ApprovalRequest, reason: str, *, actor: str | None) -> None:
        step.denials[request.position] = (Denial(kind=APPROVAL_INVALID, reason=reason), request.request_id)
        step.events.append(request_event("approval.invalid", request, actor=actor, reason=reason))

    def _learn(self, step: _Step, request: ApprovalRequest, decision: Decision | None) -> None:
        key = rule_key_for(request.tool_name, self.rules)
        if key is not None:
            step.policies.learn(key, request, decision)

    def _apply(self, step: _Step, request: ApprovalRequest, decision: Decision | None) -> None:
        self._learn(step, request, decision)
        position = request.position
        if decision is None:
            timeout = step.channel.timeout if isinstance(step.channel, CallbackApprovals) else 0.0
            step.denials[position] = (expired(f"no answer within {timeout:g} seconds."), request.request_id)
            step.events.append(request_event("approval.expired", request, actor=None, reason="timeout"))
            approval("expired", tenant=step.tenant)
            return
        try:
            arguments, edited = approved_arguments(request, decision)
        except InvalidApprovalEditError as error:
            self._refuse(step, request, str(error), actor=decision.decided_by)
            return
        edited = edited and decision.approved
        approval("decided", verdict=verdict_for(decision.approved, edited), tenant=step.tenant)
        step.events.append(
            request_event(
                "approval.decided",
                request,
                actor=decision.decided_by,
                approved=decision.approved,
                edited=edited,
                reason=decision.reason,
                final_arguments_digest=arguments_digest(arguments) if decision.approved else None,
            )
        )
        if not decision.approved:
            step.denials[position] = (denied_by_person(decision.reason), request.request_id)
        elif edited:
            step.edits[position] = arguments
        elif request.remember is not None:
            step.memories.append(remembered_approval(request, decision.decided_by, now()))


@contextlib.contextmanager
def _asking(asker: object, request: ApprovalRequest) -> Iterator[Callable[[Decision | None], Decision | None]]:
    """
    One tracing span per call asked about, named and tagged as Haystack's `ConfirmationHook` tags its strategy runs.

    The call's id and tool are plain tags (its siblings stay apart with content tracing off); the arguments and the
    answer are content tags, recorded only where content tracing is on. The answer is recorded as the strategy's
    `ToolExecutionDecision` is, so a rejection's feedback is under ``feedback``.
    """
    tags = {
        "haystack.tool.name": request.tool_name,
        "haystack.tool.call.id": request.tool_call_id,
        "haystack.agent.hook.human_in_the_loop.strategy.type": generate_qualified_class_name(type(asker)),
    }
    with tracer.trace(_STRATEGY_SPAN, tags=tags, parent_span=tracer.current_span()) as span:
        span.set_content_tag(f"{_STRATEGY_SPAN}.input", strategy_input(request))

        def traced(decision: Decision | None) -> Decision | None:
            span.set_tag(f"{_STRATEGY_SPAN}.decision", _decision_kind(request, decision))
            span.set_content_tag(f"{_STRATEGY_SPAN}.output", _decision_output(request, decision))
            return decision

        yield traced


def _decision_output(request: ApprovalRequest, decision: Decision | None) -> dict[str, Any] | None:
    # `ToolExecutionDecision.to_dict()`'s keys (as `ConfirmationHook` records a strategy's answer) and who decided.
    if decision is None:
        return None
    arguments = request.arguments if decision.arguments is None else decision.arguments
    return {
        "tool_name": request.tool_name,
        "execute": decision.approved,
        "tool_call_id": request.tool_call_id,
        "feedback": decision.reason,
        "final_tool_params": arguments if decision.approved else None,
        "decided_by": decision.decided_by,
    }


def _decision_kind(request: ApprovalRequest, decision: Decision | None) -> str:
    # Haystack's three kinds; no answer in time is a rejection, as it is for the model.
    if decision is None or not decision.approved:
        return "reject"
    return "modify" if decision.arguments is not None and decision.arguments != request.arguments else "confirm"


def _default_guard(rules: Mapping[RuleKey, Rule]) -> str:
    try:
        canonical = json.dumps(serialize_rules(rules), sort_keys=True, default=str)
    except Exception:  # a rule that cannot serialize still guards: name it by its keys and classes
        described = sorted((repr(key), generate_qualified_class_name(type(rule))) for key, rule in rules.items())
        canonical = json.dumps(described)
    return "approval-" + hashlib.sha256(canonical.encode()).hexdigest()[:12]


def _durable_ledger(step: _Step) -> ApprovalLedger:
    assert step.ledger is not None  # noqa: S101 - DurableApprovals always has a ledger (checked in _begin)
    return step.ledger


def _run_state(state: State) -> dict[str, Any] | None:
    """The run's own state values (the Agent's `state_schema`), serialized as Haystack serializes State."""
    own = [key for key in state.data if key not in _AGENT_STATE_KEYS]
    if not own:
        return None
    return state.to_dict(skip_keys=_AGENT_STATE_KEYS)


def _deny_unbound(step: _Step) -> None:
    """
    A call with no id has nothing to bind a decision to: on a channel (in process or durable) it is denied, never
    asked or held. Strategies asked with no channel (ConfirmationHook's mode) decide it on the spot, as Haystack does.
    """
    for item in step.screened:
        if item.ask and item.call.id is None:
            item.ask = False
            step.denials[item.position] = (UNBOUND_CALL, None)
            step.events.append(
                new_event(
                    event="approval.denied",
                    actor=None,
                    tenant=step.tenant,
                    session=step.ledger.session if step.ledger is not None else None,
                    step_id=None,
                    tool_call_id=None,
                    tool_name=item.call.tool_name,
                    arguments_digest=item.digest,
                    detail={"kind": UNBOUND_CALL.kind, "reason": UNBOUND_CALL.reason},
                )
            )


def _stop(state: State, step: _Step, held: HeldStep) -> None:
    """Audit the held step's requests, take its message out of the run, leave a notice naming them, stop the run."""
    step.events.extend(requested_event(request) for request in held.requests())
    # The held message leaves this run's conversation (resume puts it back with its results), so the history the
    # run returns stays valid for any provider: no tool call without a result. The notice is what the run's caller
    # and a chat page show; resume takes it out again.
    messages = state.data["messages"]
    state.set("messages", [*messages[:-1], approval_notice(held)], handler_override=replace_values)
    state.set("stop_run", APPROVAL_REQUIRED)


def _tell_held(state: State, held: HeldStep) -> None:
    """Hand the held step to the run's caller, if it asked for it (`HELD_STEPS_KEY`)."""
    sink = hook_context_of(state).get(HELD_STEPS_KEY)
    if isinstance(sink, list):
        sink.append(held)


def _rewrite(state: State, step: _Step) -> None:
    if not step.denials and not step.edits:
        return
    messages = state.data["messages"]
    shaped = in_process_shape(step.message, step.denials, step.edits, step.result_format)
    state.set("messages", messages[:-1] + shaped, handler_override=replace_values)


def _context_ledger(state: State) -> ApprovalLedger | None:
    return _optional_ledger(context_store(state))


def _optional_ledger(store: object) -> ApprovalLedger | None:
    # The in-process channel works without a session store; with one, it gets the audit and AskOncePerSession memory.
    # `store` is whatever the run brought, unchecked: a plain Haystack store (no documents) or an unscoped one is fine.
    if not isinstance(store, SessionDocumentSource) or store.tenant is None or store.session is None:
        return None
    return ApprovalLedger(store)
