"""
The in-process channel: a sync or async callback decides while the run waits; a timeout denies.

The Agent runs approved calls itself (Haystack's `ConfirmationHook` message shape), so these tests also check the
tool-call counts and what the model sees.
"""

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from approval_scenario import ledger_lines, make_agent, plan, structured_error
from haystack.dataclasses import ChatMessage
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy, ConfirmationUIResult, ToolExecutionDecision

from haystack_integrations.offload import (
    ApprovalRequest,
    AskOncePerSession,
    CallbackApprovals,
    Decision,
    FsspecToolResultStore,
    offload_context,
    read_audit,
)

INVOICE = ("send_invoice", {"customer": "acme", "amount": 120}, "call_inv")


def callback_context(callback: Any, store: FsspecToolResultStore | None = None, **channel: Any) -> dict[str, Any]:
    if store is None:
        return {"approval_channel": CallbackApprovals(callback, **channel)}
    return offload_context(store, approval_channel=CallbackApprovals(callback, **channel))


def tool_results(reply: dict[str, Any]) -> list[tuple[str, bool]]:
    return [(str(m.tool_call_result.result), m.tool_call_result.error) for m in reply["messages"] if m.tool_call_result]


def error_kind(reply: dict[str, Any]) -> str | None:
    errors = [structured_error(text)["error"] for text, error in tool_results(reply) if error]
    return errors[0] if errors else None


def test_a_sync_callback_approves(ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    seen: list[ApprovalRequest] = []

    def approve(request: ApprovalRequest) -> Decision:
        seen.append(request)
        return Decision.approve(by="alice")

    reply = agent.run([plan(INVOICE)], hook_context=callback_context(approve))
    assert [r.tool_call_id for r in seen] == ["call_inv"]
    assert tool_results(reply) == [("invoice sent to acme for 120", False)]
    assert reply["tool_call_counts"]["send_invoice"] == 1  # run by the Agent itself
    assert len(ledger_lines(ledger)) == 1


async def test_an_async_callback_denies(ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})

    async def deny(request: ApprovalRequest) -> Decision:
        await asyncio.sleep(0)
        return Decision.deny("Not today.")

    reply = await agent.run_async([plan(INVOICE)], hook_context=callback_context(deny))
    assert ledger_lines(ledger) == []
    assert error_kind(reply) == "approval-denied"
    assert "Not today." in reply["last_message"].text


async def test_a_sync_callback_in_an_async_run_does_not_block_the_loop(ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    loop_ran = threading.Event()

    def slow_approval(request: ApprovalRequest) -> bool:
        # Only returns once the event loop has run something else meanwhile.
        assert loop_ran.wait(timeout=30)
        return True

    async def tick() -> None:
        await asyncio.sleep(0.01)
        loop_ran.set()

    reply, _ = await asyncio.gather(
        agent.run_async([plan(INVOICE)], hook_context=callback_context(slow_approval)), tick()
    )
    assert tool_results(reply) == [("invoice sent to acme for 120", False)]


def test_an_async_callback_in_a_sync_run(ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})

    async def approve(request: ApprovalRequest) -> Decision:
        return Decision.approve({"customer": "acme", "amount": 3})

    reply = agent.run([plan(INVOICE)], hook_context=callback_context(approve))
    assert tool_results(reply) == [("invoice sent to acme for 3", False)]
    # Haystack's shape for an edit: a user note, then the call with its new arguments.
    note = [m for m in reply["messages"] if m.text and "updated by the user" in m.text]
    assert len(note) == 1


def test_a_sync_callback_that_never_answers_times_out_as_expired(ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    release = threading.Event()

    def never(request: ApprovalRequest) -> bool:
        release.wait(timeout=30)
        return True  # too late: the call was already denied

    try:
        reply = agent.run([plan(INVOICE)], hook_context=callback_context(never, timeout=0.05))
    finally:
        release.set()
    assert ledger_lines(ledger) == []
    assert error_kind(reply) == "approval-expired"


async def test_an_async_callback_that_never_answers_times_out_as_expired(ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})

    async def never(request: ApprovalRequest) -> bool:
        await asyncio.Event().wait()
        return True

    reply = await agent.run_async([plan(INVOICE)], hook_context=callback_context(never, timeout=0.05))
    assert ledger_lines(ledger) == []
    assert error_kind(reply) == "approval-expired"


async def test_a_sync_callback_times_out_in_an_async_run(ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    release = threading.Event()

    def never(request: ApprovalRequest) -> bool:
        release.wait(timeout=30)
        return True

    try:
        reply = await agent.run_async([plan(INVOICE)], hook_context=callback_context(never, timeout=0.05))
    finally:
        release.set()
    assert error_kind(reply) == "approval-expired"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (ConfirmationUIResult(action="confirm"), ("invoice sent to acme for 120", False)),
        (
            ConfirmationUIResult(action="modify", new_tool_params={"customer": "x", "amount": 2}),
            ("invoice sent to x for 2", False),
        ),
        (
            ToolExecutionDecision(
                tool_name="send_invoice", execute=True, final_tool_params={"customer": "acme", "amount": 120}
            ),
            ("invoice sent to acme for 120", False),
        ),
        (True, ("invoice sent to acme for 120", False)),
    ],
)
def test_haystack_answers_are_understood(ledger: Path, answer: Any, expected: tuple[str, bool]) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    reply = agent.run([plan(INVOICE)], hook_context=callback_context(lambda request: answer))
    assert tool_results(reply) == [expected]


@pytest.mark.parametrize(
    "answer",
    [
        ConfirmationUIResult(action="reject", feedback="no"),
        ToolExecutionDecision(tool_name="send_invoice", execute=False, feedback="no"),
        False,
    ],
)
def test_haystack_rejections_are_denials(ledger: Path, answer: Any) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    reply = agent.run([plan(INVOICE)], hook_context=callback_context(lambda request: answer))
    assert error_kind(reply) == "approval-denied"
    assert ledger_lines(ledger) == []


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (Decision.approve({"customer": "acme", "amount": "lots"}), "is not of type 'integer'"),
        (Decision.approve(tool_name="web_search"), "cannot change it to 'web_search'"),
        (ToolExecutionDecision(tool_name="web_search", execute=True, final_tool_params={"query": "q"}), "web_search"),
        (ConfirmationUIResult(action="shrug"), "Unknown confirmation action"),
        ("yes", "must return a Decision"),
    ],
)
def test_an_invalid_answer_denies_the_call_with_the_reason(ledger: Path, answer: Any, message: str) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    reply = agent.run([plan(INVOICE)], hook_context=callback_context(lambda request: answer))
    assert ledger_lines(ledger) == []
    [(text, error)] = tool_results(reply)
    assert error and structured_error(text)["error"] == "approval-invalid"
    assert message in structured_error(text)["message"]


def test_a_failing_callback_fails_the_run(ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})

    def broken(request: ApprovalRequest) -> bool:
        raise ConnectionResetError("websocket closed")

    with pytest.raises(ConnectionResetError, match="websocket closed"):
        agent.run([plan(INVOICE)], hook_context=callback_context(broken))
    assert ledger_lines(ledger) == []


def test_mixed_decisions_in_one_step(ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})

    def only_b(request: ApprovalRequest) -> bool:
        return request.arguments["customer"] == "b"

    calls = [
        ("send_invoice", {"customer": "a", "amount": 1}, "c1"),
        ("web_search", {"query": "q"}, "c2"),
        ("send_invoice", {"customer": "b", "amount": 2}, "c3"),
    ]
    reply = agent.run([plan(*calls)], hook_context=callback_context(only_b))
    results = {m.tool_call_result.origin.id: m.tool_call_result for m in reply["messages"] if m.tool_call_result}
    assert results["c1"].error and not results["c2"].error and not results["c3"].error
    assert [line.split(":")[0] for line in ledger_lines(ledger)] == ["b"]
    # The model's text is kept once, on the message with the calls that ran.
    assert [m.text for m in reply["messages"] if m.tool_calls] == [None, "Working on it."]


def test_no_channel_is_a_clear_error_and_runs_nothing(ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    with pytest.raises(ValueError, match="no approval channel"):
        agent.run([plan(INVOICE)])
    assert ledger_lines(ledger) == []
    # Calls that need no approval never need a channel.
    reply = agent.run([plan(("web_search", {"query": "q"}, "c1"))])
    assert tool_results(reply) == [("results for q", False)]


def test_with_a_session_store_the_callback_channel_audits_and_remembers(
    ledger: Path, store: FsspecToolResultStore
) -> None:
    agent = make_agent({"send_invoice": AskOncePerSession()})
    session = store.for_session("acme", "chat-1")
    asked: list[str] = []

    def approve(request: ApprovalRequest) -> Decision:
        asked.append(request.request_id)
        return Decision.approve(by="alice")

    for _ in range(2):
        agent.run([plan(INVOICE)], hook_context=callback_context(approve, session, actor="user-7"))
    assert len(asked) == 1 and len(ledger_lines(ledger)) == 2
    assert [(e.event, e.actor) for e in read_audit(session)] == [
        ("approval.requested", "user-7"),
        ("approval.decided", "alice"),
    ]
    # Another session asks again.
    agent.run([plan(INVOICE)], hook_context=callback_context(approve, store.for_session("acme", "chat-2")))
    assert len(asked) == 2


def test_messages_keep_the_order_for_all_approved(ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    calls = [("send_invoice", {"customer": c, "amount": 1}, f"id-{c}") for c in "abc"]
    reply = agent.run([plan(*calls)], hook_context=callback_context(lambda request: True))
    assert [m.tool_call_result.origin.id for m in reply["messages"] if m.tool_call_result] == ["id-a", "id-b", "id-c"]
    assert isinstance(reply["messages"][1], ChatMessage) and reply["messages"][1].text == "Working on it."
