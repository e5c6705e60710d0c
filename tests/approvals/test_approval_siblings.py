"""
`ApprovalHook` as a sibling of Haystack's `ConfirmationHook`: the same strategies, the same words for the model.

A team on `ConfirmationHook(confirmation_strategies=...)` switches by changing the class name; per-run channels
(`CallbackApprovals`, `DurableApprovals`) are what a multi-user server adds on top.
"""

import builtins
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from approval_scenario import ledger_lines, make_tools, plan, script
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.hooks.human_in_the_loop import (
    AlwaysAskPolicy,
    BlockingConfirmationStrategy,
    ConfirmationHook,
    SimpleConsoleUI,
    ToolExecutionDecision,
)

from haystack_integrations.offload import (
    ApprovalHook,
    CallbackApprovals,
    Decision,
    DurableApprovals,
    FsspecToolResultStore,
    offload_context,
    pending_approvals,
)

INVOICE = ("send_invoice", {"customer": "acme", "amount": 120}, "call_inv")


def agent_with(hook: Any) -> Agent:
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script), tools=make_tools(), hooks={"before_tool": [hook]}
    )
    agent.warm_up()
    return agent


def console() -> BlockingConfirmationStrategy:
    return BlockingConfirmationStrategy(confirmation_policy=AlwaysAskPolicy(), confirmation_ui=SimpleConsoleUI())


@pytest.fixture
def typed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What the person types at the console, answer by answer."""
    answers: list[str] = []
    monkeypatch.setattr(builtins, "input", lambda prompt="": answers.pop(0))
    yield answers
    assert answers == [], "the console asked fewer questions than expected"


def tool_results(reply: dict[str, Any]) -> list[tuple[str, bool]]:
    return [(str(m.tool_call_result.result), m.tool_call_result.error) for m in reply["messages"] if m.tool_call_result]


@pytest.mark.parametrize("answers", [["n", "over budget"], ["n", ""], ["y"]])
def test_a_console_strategy_without_a_channel_behaves_like_confirmation_hook(
    answers: list[str], typed: list[str], ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    typed.extend(answers)
    theirs = agent_with(ConfirmationHook(confirmation_strategies={"send_invoice": console()})).run([plan(INVOICE)])
    runs_theirs = len(ledger_lines(ledger))
    typed.extend(answers)
    ours = agent_with(ApprovalHook(confirmation_strategies={"send_invoice": console()})).run([plan(INVOICE)])

    # The model reads the same words, and the call ran (or not) the same way.
    assert tool_results(ours) == tool_results(theirs)
    assert len(ledger_lines(ledger)) == 2 * runs_theirs
    assert ours["last_message"].text == theirs["last_message"].text
    capsys.readouterr()


def test_a_strategy_receives_the_runs_hook_context(ledger: Path) -> None:
    seen: list[Any] = []

    class Recording:
        def run(self, **kwargs: Any) -> ToolExecutionDecision:
            seen.append(kwargs)
            return ToolExecutionDecision(
                tool_name=kwargs["tool_name"], execute=True, tool_call_id=kwargs["tool_call_id"]
            )

        def to_dict(self) -> dict[str, Any]:
            return {"type": "recording"}

    websocket = object()
    agent = agent_with(ApprovalHook(confirmation_strategies={"send_invoice": Recording()}))
    agent.run([plan(INVOICE)], hook_context={"websocket": websocket})
    [call] = seen
    assert call["confirmation_strategy_context"]["websocket"] is websocket
    assert (call["tool_name"], call["tool_call_id"], call["tool_params"]) == (
        "send_invoice",
        "call_inv",
        {"customer": "acme", "amount": 120},
    )
    assert len(ledger_lines(ledger)) == 1


def test_with_a_channel_the_strategys_policy_decides_and_the_channel_asks(
    store: FsspecToolResultStore, typed: list[str], ledger: Path
) -> None:
    # The console is never used on a server: the run's durable channel holds the call for a person elsewhere.
    session = store.for_session("acme", "chat-1")
    agent = agent_with(ApprovalHook(confirmation_strategies={"send_invoice": console()}))
    reply = agent.run([plan(INVOICE)], hook_context=offload_context(session, approval_channel=DurableApprovals()))
    assert reply["exit_reason"] == "approval_required"
    assert [r.tool_call_id for r in pending_approvals(session)] == ["call_inv"]
    assert ledger_lines(ledger) == []


def test_the_structured_format_is_machine_readable(ledger: Path) -> None:
    hook = ApprovalHook({"send_invoice": AlwaysAskPolicy()}, result_format="structured")
    context = {"approval_channel": CallbackApprovals(lambda request: Decision.deny("no", by="alice"))}
    reply = agent_with(hook).run([plan(INVOICE)], hook_context=context)
    [(text, error)] = tool_results(reply)
    payload = json.loads(text)["error"]
    assert error and payload["kind"] == "approval-denied" and payload["tool"] == "send_invoice"
    assert "no" in payload["message"] and payload["request_id"]


def test_haystack_wording_is_the_default(ledger: Path) -> None:
    context = {"approval_channel": CallbackApprovals(lambda request: Decision.deny("over budget"))}
    reply = agent_with(ApprovalHook({"send_invoice": AlwaysAskPolicy()})).run([plan(INVOICE)], hook_context=context)
    [(text, error)] = tool_results(reply)
    assert (
        error and text == "Tool execution for 'send_invoice' was rejected by the user. With user feedback: over budget"
    )


@pytest.mark.parametrize("channel", ["callback", "durable"])
def test_a_call_without_an_id_is_denied_on_every_channel(
    channel: str, store: FsspecToolResultStore, ledger: Path
) -> None:
    asked: list[Any] = []

    def ask(request: Any) -> Decision:
        asked.append(request)
        return Decision.approve()

    session = store.for_session("acme", "chat-1")
    chosen = CallbackApprovals(ask) if channel == "callback" else DurableApprovals()
    context = offload_context(session, approval_channel=chosen)
    hook = ApprovalHook({"send_invoice": AlwaysAskPolicy()})
    reply = agent_with(hook).run([plan(("send_invoice", {"customer": "a", "amount": 1}, None))], hook_context=context)
    assert asked == [] and ledger_lines(ledger) == [] and pending_approvals(session) == []
    [(text, error)] = tool_results(reply)
    assert error and "no tool-call id" in text


def test_without_a_channel_strategies_decide_calls_without_an_id_as_confirmation_hook_does(
    typed: list[str], ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call = ("send_invoice", {"customer": "a", "amount": 1}, None)
    typed.append("y")
    theirs = agent_with(ConfirmationHook(confirmation_strategies={"send_invoice": console()})).run([plan(call)])
    typed.append("y")
    ours = agent_with(ApprovalHook(confirmation_strategies={"send_invoice": console()})).run([plan(call)])
    assert tool_results(ours) == tool_results(theirs)
    assert len(ledger_lines(ledger)) == 2
    capsys.readouterr()


def test_a_plain_policy_without_a_channel_is_a_clear_error() -> None:
    agent = agent_with(ApprovalHook({"send_invoice": AlwaysAskPolicy()}))
    with pytest.raises(ValueError, match="no approval channel"):
        agent.run([plan(INVOICE)])


def test_strategies_round_trip_with_the_agent() -> None:
    hook = ApprovalHook(
        {"web_search": AlwaysAskPolicy()},
        confirmation_strategies={("send_invoice",): console()},
        name="billing",
        result_format="structured",
    )
    again = ApprovalHook.from_dict(hook.to_dict())
    assert (again.guard, again.result_format) == ("billing", "structured")
    assert isinstance(again.rules[("send_invoice",)], BlockingConfirmationStrategy)
    assert isinstance(again.rules["web_search"], AlwaysAskPolicy)
    with pytest.raises(TypeError, match="both"):
        ApprovalHook({"x": AlwaysAskPolicy()}, confirmation_strategies={"x": console()})


class TrustAfterApproval:
    """A custom learning policy: asks until a person has approved the tool once, then trusts it."""

    def __init__(self, trusted: list[str] | None = None) -> None:
        self.trusted = list(trusted or [])

    def should_ask(self, tool_name: str, tool_description: str, tool_params: dict[str, Any]) -> bool:
        return tool_name not in self.trusted

    def update_after_confirmation(
        self, tool_name: str, tool_description: str, tool_params: dict[str, Any], confirmation_result: Any
    ) -> None:
        if confirmation_result.action == "confirm" and tool_name not in self.trusted:
            self.trusted.append(tool_name)

    def to_dict(self) -> dict[str, Any]:
        return {"type": f"{__name__}.TrustAfterApproval", "init_parameters": {"trusted": self.trusted}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrustAfterApproval":
        return cls(**data["init_parameters"])


@pytest.mark.parametrize("channel", ["callback", "durable"])
def test_a_learning_policy_learns_per_session_never_across_users(
    channel: str, store: FsspecToolResultStore, ledger: Path
) -> None:
    from haystack_integrations.offload import decide, resume

    policy = TrustAfterApproval()
    agent = agent_with(ApprovalHook({"send_invoice": policy}))
    asked: list[str] = []

    def approve(request: Any) -> Decision:
        asked.append(request.session)
        return Decision.approve()

    def run(session: FsspecToolResultStore, call_id: str) -> None:
        call = ("send_invoice", {"customer": "acme", "amount": 1}, call_id)
        if channel == "callback":
            agent.run([plan(call)], hook_context=offload_context(session, approval_channel=CallbackApprovals(approve)))
            return
        reply = agent.run([plan(call)], hook_context=offload_context(session, approval_channel=DurableApprovals()))
        for request in pending_approvals(session):
            asked.append(request.session or "")
            decide(session, request.request_id, Decision.approve())
        if reply["exit_reason"] == "approval_required":
            resume(agent, reply["messages"], session)

    alice, bob = store.for_session("acme", "alice-chat"), store.for_session("acme", "bob-chat")
    run(alice, "c1")  # asked, approved: alice's session now trusts the tool
    run(alice, "c2")  # not asked again in alice's session
    run(bob, "c3")  # bob is still asked: what alice's session learned stays there
    assert asked == ["alice-chat", "bob-chat"]
    assert policy.trusted == []  # the shared hook's policy learned nothing
    assert len(ledger_lines(ledger)) == 3
