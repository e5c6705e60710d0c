"""
The durable channel on every backend: a run stops with its requests stored, decisions come later, resume runs once.

Each test drives a real Agent (scripted `MockChatGenerator`) and checks what the model finally sees, what ran (the
`send_invoice` ledger) and what the session's records say.
"""

import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from approval_scenario import INVOICE_SCHEMA, ledger_lines, make_agent, make_tools, plan, script, structured_error
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy, NeverAskPolicy
from haystack.hooks.tool_result_offloading import AlwaysOffload, ToolResultOffloadHook
from haystack.tools import Tool

from haystack_integrations.offload import (
    APPROVAL_REQUIRED,
    ApprovalHook,
    AskOncePerSession,
    AskWhen,
    Decision,
    DurableApprovals,
    FsspecToolResultStore,
    OffloadHook,
    decide,
    decide_async,
    offload_context,
    pending_approvals,
    pending_approvals_async,
    read_audit,
    resume,
    resume_async,
)
from haystack_integrations.offload.approvals import (
    META_KEY,
    ApprovalAlreadyDecidedError,
    ApprovalClaimedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    InvalidApprovalEditError,
    ResumeConversationError,
    ResumeInterruptedError,
)
from haystack_integrations.offload.approvals.ledger import ApprovalLedger
from haystack_integrations.offload.testing.local_s3 import LocalS3Server
from haystack_integrations.offload.testing.relay import LatencyProxy

# Also on the real S3 server's lane, both engines, and there with STS credentials and SSE-C keys per tenant.
pytestmark = [pytest.mark.real_s3, pytest.mark.isolated]

INVOICE = ("send_invoice", {"customer": "acme", "amount": 120}, "call_inv")
SEARCH = ("web_search", {"query": "acme"}, "call_search")


@pytest.fixture
def agent(ledger: Path) -> Agent:
    return make_agent({"send_invoice": AlwaysAskPolicy(), "*": NeverAskPolicy()})


@pytest.fixture
def session(store: FsspecToolResultStore) -> FsspecToolResultStore:
    return store.for_session("acme", "chat-1")


def durable(store: FsspecToolResultStore, **channel: Any) -> dict[str, Any]:
    return offload_context(store, approval_channel=DurableApprovals(**channel))


def error_of(message: ChatMessage) -> dict[str, Any] | None:
    """The approval error a tool result carries, parsed from the text the model reads."""
    result = message.tool_call_result
    if result is None or not result.error:
        return None
    return structured_error(str(result.result))


def results_seen(reply: dict[str, Any]) -> list[tuple[str | None, str, bool]]:
    """(tool call id, result text, error) of every tool result in the final conversation, in order."""
    return [
        (m.tool_call_result.origin.id, str(m.tool_call_result.result), m.tool_call_result.error)
        for m in reply["messages"]
        if m.tool_call_result is not None
    ]


def stop(agent: Agent, session: FsspecToolResultStore, *calls: Any, **channel: Any) -> dict[str, Any]:
    reply = agent.run([plan(*calls)], hook_context=durable(session, **channel))
    assert reply["exit_reason"] == APPROVAL_REQUIRED
    return reply


def test_run_stops_with_its_request_recorded_and_nothing_run(
    agent: Agent, session: FsspecToolResultStore, ledger: Path
) -> None:
    reply = stop(agent, session, INVOICE, actor="user-7")

    # The held assistant message is out of the returned conversation (no tool call is left without a result); a
    # notice naming the pending request takes its place as the run's last message.
    assert [m.role.value for m in reply["messages"]] == ["user", "assistant"]
    assert ledger_lines(ledger) == []
    [request] = pending_approvals(session)
    assert reply["last_message"].text == f"Approval required: {request.request_id}"
    assert not reply["last_message"].tool_calls
    assert (request.tenant, request.session, request.tool_call_id, request.tool_name) == (
        "acme",
        "chat-1",
        "call_inv",
        "send_invoice",
    )
    assert request.arguments == {"customer": "acme", "amount": 120}
    assert request.arguments_digest.startswith("sha256:")
    assert request.requested_by == "user-7"
    assert request.created < request.expires
    assert request.parameters["required"] == ["customer", "amount"]


def test_approve_runs_the_call_once_and_the_model_sees_its_real_result(
    agent: Agent, session: FsspecToolResultStore, ledger: Path
) -> None:
    reply = stop(agent, session, INVOICE)
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve(by="alice"))
    assert pending_approvals(session) == []

    final = resume(agent, reply["messages"], session)

    assert ledger_lines(ledger)[0].startswith("acme:120:")
    assert len(ledger_lines(ledger)) == 1
    assert results_seen(final) == [("call_inv", "invoice sent to acme for 120", False)]
    assert final["last_message"].text == "final: invoice sent to acme for 120"
    assert final["exit_reason"] == "text"
    [outcome] = final["approval_outcomes"]
    assert (outcome.outcome, outcome.request_id) == ("executed", request.request_id)
    # user, held assistant message, its result, final answer: nothing lost, nothing twice.
    assert [m.role.value for m in final["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert final["messages"][1].text == "Working on it."


def test_deny_reaches_the_model_as_an_error_result_with_its_kind(
    agent: Agent, session: FsspecToolResultStore, ledger: Path
) -> None:
    reply = stop(agent, session, INVOICE)
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.deny("Invoices over 100 need a manager.", by="alice"))

    final = resume(agent, reply["messages"], session)

    assert ledger_lines(ledger) == []
    tool_message = final["messages"][2]
    error = error_of(tool_message)
    assert error is not None and error["error"] == "approval-denied"
    assert "Invoices over 100 need a manager." in error["message"]
    assert tool_message.meta[META_KEY] == {"kind": "approval-denied", "request_id": request.request_id}
    assert "approval-denied" in final["last_message"].text
    assert final["approval_outcomes"][0].outcome == "denied"


def test_an_edit_runs_with_the_edited_arguments_and_tells_the_model(
    agent: Agent, session: FsspecToolResultStore, ledger: Path
) -> None:
    reply = stop(agent, session, INVOICE)
    [request] = pending_approvals(session)
    decision = decide(session, request.request_id, Decision.approve({"customer": "acme", "amount": 99}, by="alice"))
    assert decision.edited and decision.arguments == {"customer": "acme", "amount": 99}

    final = resume(agent, reply["messages"], session)

    assert [line.rsplit(":", 1)[0] for line in ledger_lines(ledger)] == ["acme:99"]
    roles = [m.role.value for m in final["messages"]]
    assert roles == ["user", "user", "assistant", "tool", "assistant"]
    note, assistant = final["messages"][1], final["messages"][2]
    assert "updated by the user" in (note.text or "") and "99" in (note.text or "")
    assert assistant.tool_calls[0].arguments == {"customer": "acme", "amount": 99}
    assert final["last_message"].text == "final: invoice sent to acme for 99"


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"customer": "acme", "amount": "ninety"}, "amount: 'ninety' is not of type 'integer'"),
        ({"customer": "acme"}, "'amount' is a required property"),
        ({"customer": "acme", "amount": 0}, "amount: 0 is less than the minimum of 1"),
        ({"customer": "acme", "amount": 5, "cc": "x"}, "Additional properties are not allowed"),
    ],
)
def test_an_invalid_edit_is_a_clear_error_and_records_nothing(
    agent: Agent, session: FsspecToolResultStore, ledger: Path, edit: dict[str, Any], problem: str
) -> None:
    reply = stop(agent, session, INVOICE)
    [request] = pending_approvals(session)
    with pytest.raises(InvalidApprovalEditError, match="not valid") as caught:
        decide(session, request.request_id, Decision.approve(edit, by="alice"))
    assert problem in str(caught.value)
    # Nothing was recorded: the request still waits and can be decided properly; the model has seen nothing yet.
    assert [r.request_id for r in pending_approvals(session)] == [request.request_id]
    with pytest.raises(ApprovalPendingError):
        resume(agent, reply["messages"], session)
    decide(session, request.request_id, Decision.approve({"customer": "acme", "amount": 5}))
    final = resume(agent, reply["messages"], session)
    assert final["last_message"].text == "final: invoice sent to acme for 5"
    assert len(ledger_lines(ledger)) == 1


def test_a_decision_cannot_change_the_tool(agent: Agent, session: FsspecToolResultStore, ledger: Path) -> None:
    reply = stop(agent, session, INVOICE)
    [request] = pending_approvals(session)
    with pytest.raises(InvalidApprovalEditError, match="cannot change it to 'web_search'"):
        decide(session, request.request_id, Decision.approve({"query": "x"}, tool_name="web_search"))
    assert len(pending_approvals(session)) == 1

    # A decision document rewritten to name another tool is refused when it is used: nothing runs.
    decision = decide(session, request.request_id, Decision.approve(tool_name="send_invoice"))
    tampered = decision.model_copy(update={"tool_name": "web_search"})
    documents = session.documents("approvals")
    documents.put(f"decision.{request.request_id}.json", tampered.model_dump_json().encode())

    final = resume(agent, reply["messages"], session)
    assert ledger_lines(ledger) == []
    error = error_of(final["messages"][2])
    assert error is not None and error["error"] == "approval-invalid"
    assert "tool name never changes" in error["message"]


def test_an_undecided_request_that_expires_reaches_the_model_as_expired(
    agent: Agent, session: FsspecToolResultStore, ledger: Path
) -> None:
    reply = stop(agent, session, INVOICE, ttl=0)
    assert pending_approvals(session) == []  # expired requests no longer wait
    request = session_requests(session)[0]
    with pytest.raises(ApprovalExpiredError):
        decide(session, request.request_id, Decision.approve())

    final = resume(agent, reply["messages"], session)
    assert ledger_lines(ledger) == []
    error = error_of(final["messages"][2])
    assert error is not None and error["error"] == "approval-expired"
    assert final["approval_outcomes"][0].outcome == "expired"


def test_an_approval_that_expires_before_resume_does_not_run(
    agent: Agent, session: FsspecToolResultStore, ledger: Path
) -> None:
    reply = stop(agent, session, INVOICE)
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve(), ttl=0)

    final = resume(agent, reply["messages"], session)
    assert ledger_lines(ledger) == []
    error = error_of(final["messages"][2])
    assert error is not None and error["error"] == "approval-expired"
    assert "expired before the call was resumed" in error["message"]


def test_a_used_decision_cannot_be_replayed(agent: Agent, session: FsspecToolResultStore, ledger: Path) -> None:
    reply = stop(agent, session, INVOICE)
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())
    final = resume(agent, reply["messages"], session)
    assert len(ledger_lines(ledger)) == 1

    # Resuming again (a retried HTTP request, a second worker) runs nothing.
    with pytest.raises(ApprovalClaimedError):
        resume(agent, reply["messages"], session)
    # Deciding again is refused: a decision is created once.
    with pytest.raises(ApprovalAlreadyDecidedError):
        decide(session, request.request_id, Decision.approve())
    # The model asking for the very same call again (same id, same arguments) is a new request: the old approval
    # does not carry over.
    again = agent.run([*final["messages"], plan(INVOICE)], hook_context=durable(session))
    assert again["exit_reason"] == APPROVAL_REQUIRED
    [new_request] = pending_approvals(session)
    assert new_request.request_id != request.request_id
    with pytest.raises(ApprovalPendingError) as caught:
        resume(agent, again["messages"], session)
    assert caught.value.request_ids == [new_request.request_id]
    assert len(ledger_lines(ledger)) == 1


def test_decisions_from_another_session_or_tenant_are_refused(
    agent: Agent, store: FsspecToolResultStore, ledger: Path
) -> None:
    mine = store.for_session("acme", "chat-1")
    reply = stop(agent, mine, INVOICE)
    [request] = pending_approvals(mine)

    # Through the API: another session or tenant does not even see the request.
    for other in (store.for_session("acme", "chat-2"), store.for_session("globex", "chat-1")):
        with pytest.raises(ApprovalNotFoundError):
            decide(other, request.request_id, Decision.approve())
        assert pending_approvals(other) == []
    assert [r.request_id for r in pending_approvals(mine)] == [request.request_id]

    # A decision made in another tenant's session and copied into this one's records is refused when used.
    theirs = store.for_session("globex", "chat-1")
    stop(agent, theirs, INVOICE)
    [their_request] = pending_approvals(theirs)
    their_decision = decide(theirs, their_request.request_id, Decision.approve())
    forged = their_decision.model_copy(update={"request_id": request.request_id, "step_id": request.step_id})
    mine.documents("approvals").put(f"decision.{request.request_id}.json", forged.model_dump_json().encode())

    final = resume(agent, reply["messages"], mine)
    assert ledger_lines(ledger) == []
    error = error_of(final["messages"][2])
    assert error is not None and error["error"] == "approval-invalid"
    assert "another tenant or session" in error["message"]


def test_several_calls_in_one_step_keep_the_models_order(ledger: Path, session: FsspecToolResultStore) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    first = ("send_invoice", {"customer": "a", "amount": 10}, "c1")
    second = ("send_invoice", {"customer": "b", "amount": 20}, "c3")
    reply = stop(agent, session, first, ("web_search", {"query": "q"}, "c2"), second)
    # The search needs no approval but waits with its step, so the step's results stay in the model's order.
    requests = pending_approvals(session)
    assert [(r.position, r.tool_call_id) for r in requests] == [(0, "c1"), (2, "c3")]
    decide(session, requests[0].request_id, Decision.deny("no"))
    decide(session, requests[1].request_id, Decision.approve())

    final = resume(agent, reply["messages"], session)

    seen = results_seen(final)
    assert [(call_id, error) for call_id, _, error in seen] == [("c1", True), ("c2", False), ("c3", False)]
    assert seen[1][1] == "results for q" and seen[2][1] == "invoice sent to b for 20"
    assert [line.rsplit(":", 1)[0] for line in ledger_lines(ledger)] == ["b:20"]
    assert [o.outcome for o in final["approval_outcomes"]] == ["denied", "executed", "executed"]
    # Resuming runs the before_tool chain again, so the denied call is answered in Haystack's ConfirmationHook shape:
    # its own assistant/tool pair first, then the message with the calls that ran.
    assistants = [m for m in final["messages"] if m.tool_calls]
    assert [[c.id for c in m.tool_calls] for m in assistants] == [["c1"], ["c2", "c3"]]


def test_a_call_without_an_id_cannot_be_bound_and_is_denied(
    agent: Agent, session: FsspecToolResultStore, ledger: Path
) -> None:
    # Alone: nothing can be held, so the run goes on with the call denied and a clear reason.
    reply = agent.run([plan(("send_invoice", {"customer": "a", "amount": 1}, None))], hook_context=durable(session))
    assert reply["exit_reason"] == "text"
    assert ledger_lines(ledger) == []
    error = error_of(reply["messages"][2])
    assert error is not None and error["error"] == "approval-denied" and "no tool-call id" in error["message"]

    # Beside a call that can be bound: the step is held, and the unbound call is denied when it resumes.
    reply = stop(agent, session, ("send_invoice", {"customer": "a", "amount": 1}, None), INVOICE)
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())
    final = resume(agent, reply["messages"], session)
    assert [error for _, _, error in results_seen(final)] == [True, False]
    assert len(ledger_lines(ledger)) == 1


def test_resume_needs_every_request_decided_or_expired(ledger: Path, session: FsspecToolResultStore) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    reply = stop(agent, session, ("send_invoice", {"customer": "a", "amount": 1}, "c1"), INVOICE)
    first, second = pending_approvals(session)
    decide(session, first.request_id, Decision.approve())
    with pytest.raises(ApprovalPendingError) as caught:
        resume(agent, reply["messages"], session)
    assert caught.value.request_ids == [second.request_id]
    assert ledger_lines(ledger) == []  # nothing ran, nothing was claimed: resume can be called again
    decide(session, second.request_id, Decision.approve())
    assert len(resume(agent, reply["messages"], session)["approval_outcomes"]) == 2
    assert len(ledger_lines(ledger)) == 2


def test_resume_refuses_a_conversation_that_already_holds_the_step(
    agent: Agent, session: FsspecToolResultStore, ledger: Path
) -> None:
    reply = stop(agent, session, INVOICE)
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())
    held = session_step_message(session)
    with pytest.raises(ResumeConversationError):
        resume(agent, [*reply["messages"], held], session)
    assert ledger_lines(ledger) == []
    assert resume(agent, reply["messages"], session)["last_message"].text.startswith("final:")


def test_nothing_to_resume_and_unknown_requests(agent: Agent, session: FsspecToolResultStore) -> None:
    with pytest.raises(ApprovalNotFoundError):
        resume(agent, [], session)
    assert pending_approvals(session) == []
    for bad in ["nope", "../x", "20261129T213400123456Z-5f3a9c1e7b2d-0", "", "x" * 500]:
        with pytest.raises(ApprovalNotFoundError):
            decide(session, bad, Decision.approve())


def test_two_deciders_racing_record_one_decision(agent: Agent, session: FsspecToolResultStore) -> None:
    stop(agent, session, INVOICE)
    [request] = pending_approvals(session)

    def attempt(who: int) -> str:
        try:
            decide(session, request.request_id, Decision.approve(by=f"decider-{who}"))
        except ApprovalAlreadyDecidedError:
            return "lost"
        return "won"

    with ThreadPoolExecutor(max_workers=4) as pool:
        outcomes = list(pool.map(attempt, range(6)))
    assert outcomes.count("won") == 1


def test_ask_once_per_session_remembers_an_approval_in_that_session_only(
    ledger: Path, store: FsspecToolResultStore
) -> None:
    agent = make_agent({"send_invoice": AskOncePerSession(ttl=3600)})
    mine, other = store.for_session("acme", "chat-1"), store.for_session("acme", "chat-2")
    reply = stop(agent, mine, INVOICE)
    [request] = pending_approvals(mine)
    decide(mine, request.request_id, Decision.approve())
    resume(agent, reply["messages"], mine)

    # Same session: no question this time. Another session: asked, as if the first had never happened.
    again = agent.run([plan(("send_invoice", {"customer": "b", "amount": 2}, "c9"))], hook_context=durable(mine))
    assert again["exit_reason"] == "text"
    assert len(ledger_lines(ledger)) == 2
    stop(agent, other, INVOICE)
    assert len(pending_approvals(other)) == 1


def test_ask_once_does_not_remember_a_denial_or_an_edit(ledger: Path, session: FsspecToolResultStore) -> None:
    agent = make_agent({"send_invoice": AskOncePerSession()})
    for decision in (Decision.deny("no"), Decision.approve({"customer": "acme", "amount": 1})):
        reply = stop(agent, session, INVOICE)
        [request] = pending_approvals(session)
        decide(session, request.request_id, decision)
        resume(agent, reply["messages"], session)
    stop(agent, session, INVOICE)


def test_ask_when_asks_only_when_the_predicate_says_so(ledger: Path, session: FsspecToolResultStore) -> None:
    agent = make_agent({"send_invoice": AskWhen(over_100)})
    small = agent.run([plan(("send_invoice", {"customer": "a", "amount": 5}, "c1"))], hook_context=durable(session))
    assert small["exit_reason"] == "text" and len(ledger_lines(ledger)) == 1
    stop(agent, session, INVOICE)


def test_audit_records_who_did_what_when(agent: Agent, session: FsspecToolResultStore) -> None:
    reply = stop(agent, session, INVOICE, actor="user-7")
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve(by="alice"))
    resume(agent, reply["messages"], session, worker="worker-1")
    with pytest.raises(ApprovalClaimedError):
        resume(agent, reply["messages"], session, worker="worker-2")

    events = read_audit(session)
    assert [(e.event, e.actor) for e in events] == [
        ("approval.requested", "user-7"),
        ("approval.decided", "alice"),
        ("approval.resumed", "worker-1"),
        ("approval.executed", "worker-1"),
    ]
    assert all(e.request_id == request.request_id for e in events if e.event != "approval.resumed")
    assert all((e.tenant, e.session) == ("acme", "chat-1") for e in events)
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert events[1].detail["approved"] is True
    assert events[3].arguments_digest == request.arguments_digest


async def test_the_async_flow_matches(agent: Agent, session: FsspecToolResultStore, ledger: Path) -> None:
    reply = await agent.run_async([plan(INVOICE, SEARCH)], hook_context=durable(session))
    assert reply["exit_reason"] == APPROVAL_REQUIRED
    [request] = await pending_approvals_async(session)
    await decide_async(session, request.request_id, Decision.approve({"customer": "acme", "amount": 7}))
    final = await resume_async(agent, reply["messages"], session)
    assert [text for _, text, _ in results_seen(final)] == ["invoice sent to acme for 7", "results for acme"]
    assert final["last_message"].text == "final: invoice sent to acme for 7 | results for acme"
    with pytest.raises(ApprovalClaimedError):
        await resume_async(agent, reply["messages"], session)
    assert len(ledger_lines(ledger)) == 1


def test_an_approved_exit_condition_tool_ends_the_run_like_the_agent_would(
    ledger: Path, session: FsspecToolResultStore
) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()}, exit_conditions=["send_invoice"])
    reply = stop(agent, session, INVOICE)
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())
    final = resume(agent, reply["messages"], session)
    assert final["exit_reason"] == "send_invoice"
    assert final["last_message"].tool_call_result is not None  # no model call after the exit tool
    assert len(ledger_lines(ledger)) == 1


def over_100(arguments: dict[str, Any]) -> bool:
    return int(arguments.get("amount", 0)) > 100


def session_requests(session: FsspecToolResultStore) -> list[Any]:
    """Every request of the session's newest step, expired or not (read from the store, as a server could)."""
    from haystack_integrations.offload.approvals.ledger import ApprovalLedger

    ledger = ApprovalLedger(session)
    sequence = ledger.listing().newest()
    assert sequence is not None
    return ledger.step(sequence).requests()


def session_step_message(session: FsspecToolResultStore) -> ChatMessage:
    from haystack_integrations.offload.approvals.ledger import ApprovalLedger

    ledger = ApprovalLedger(session)
    sequence = ledger.listing().newest()
    assert sequence is not None
    return ledger.step(sequence).chat_message()


def test_resumed_results_go_through_the_agents_after_tool_hooks(ledger: Path, session: FsspecToolResultStore) -> None:
    # Haystack's own offload hook under after_tool: an approved call's result is offloaded like any other.
    offload = ToolResultOffloadHook(
        store=FsspecToolResultStore("memory://never-used"), offload_strategies={"send_invoice": AlwaysOffload()}
    )
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=make_tools(),
        hooks={
            "before_tool": [ApprovalHook({"send_invoice": AlwaysAskPolicy()}, result_format="structured")],
            "after_tool": [offload],
        },
    )
    reply = stop(agent, session, INVOICE)
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())

    final = resume(agent, reply["messages"], session)

    [result] = [m for m in final["messages"] if m.tool_call_result is not None]
    [reference] = result.meta["tool_result_offloaded"]
    assert session.read(reference) == "invoice sent to acme for 120"
    assert len(ledger_lines(ledger)) == 1


@pytest.mark.s3
@pytest.mark.slow
async def test_a_resumed_result_written_behind_is_stored_when_resume_returns(
    ledger: Path, s3_server: LocalS3Server
) -> None:
    # Resume runs after_tool hooks outside an Agent run, so no after_run waits there: resume itself must settle the
    # uploads OffloadHook(write_behind=True) starts. A slow proxy keeps the upload in flight past an unsettled return.
    offload = OffloadHook({"send_invoice": AlwaysOffload()}, write_behind=True)
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=make_tools(),
        hooks={
            "before_tool": [ApprovalHook({"send_invoice": AlwaysAskPolicy()}, result_format="structured")],
            "after_tool": [offload],
            "after_run": [offload],
        },
    )
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    with LatencyProxy(s3_server.endpoint_url, latency=0.5) as proxy:
        options = {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        session = FsspecToolResultStore(url, storage_options=options).for_session("acme", "chat-1")
        reply = await agent.run_async([plan(INVOICE)], hook_context=durable(session))
        [request] = await pending_approvals_async(session)
        await decide_async(session, request.request_id, Decision.approve())

        final = await resume_async(agent, reply["messages"], session)

        [result] = [m for m in final["messages"] if m.tool_call_result is not None]
        [reference] = result.meta["tool_result_offloaded"]
        # Read directly from moto, past the proxy and the store's in-flight table: the upload has landed.
        direct = FsspecToolResultStore(url, storage_options=s3_server.storage_options()).for_session("acme", "chat-1")
        assert direct.read(reference) == "invoice sent to acme for 120"
    assert len(ledger_lines(ledger)) == 1


def record_invoice(customer: str, amount: int) -> dict[str, Any]:
    return {"customer": customer, "text": f"recorded {customer} {amount}"}


def test_resumed_calls_write_state_like_any_step(ledger: Path, session: FsspecToolResultStore) -> None:
    tool = Tool(
        name="send_invoice",
        description="Record an invoice.",
        parameters=INVOICE_SCHEMA,
        function=record_invoice,
        outputs_to_string={"source": "text"},
        outputs_to_state={"customers": {"source": "customer"}},
    )
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=[tool],
        state_schema={"customers": {"type": list[str]}},
        hooks={"before_tool": [ApprovalHook({"send_invoice": AlwaysAskPolicy()}, result_format="structured")]},
    )
    reply = stop(agent, session, INVOICE)
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())

    final = resume(agent, reply["messages"], session)

    assert final["customers"] == ["acme"]
    assert final["last_message"].text == "final: recorded acme 120"


def test_an_agents_prompts_are_not_rendered_twice(ledger: Path, session: FsspecToolResultStore) -> None:
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=make_tools(),
        system_prompt="You send invoices carefully.",
        user_prompt="{{ request }}",
        hooks={"before_tool": [ApprovalHook({"send_invoice": AlwaysAskPolicy()}, result_format="structured")]},
    )
    reply = agent.run([], request=plan(INVOICE).text, hook_context=durable(session))
    assert reply["exit_reason"] == APPROVAL_REQUIRED
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())

    final = resume(agent, reply["messages"], session)

    assert [m.role.value for m in final["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert final["last_message"].text == "final: invoice sent to acme for 120"


def unavailable_after_tools(messages: list[ChatMessage]) -> ChatMessage:
    """The scripted model, except that it fails whenever it should answer tool results."""
    if messages[-1].tool_call_result is not None:
        raise ConnectionError("model unavailable")
    return script(messages)


def test_a_failure_after_the_step_ran_hands_back_the_conversation(ledger: Path, session: FsspecToolResultStore) -> None:
    failing = Agent(
        chat_generator=MockChatGenerator(response_fn=unavailable_after_tools),
        tools=make_tools(),
        hooks={"before_tool": [ApprovalHook({"send_invoice": AlwaysAskPolicy()}, result_format="structured")]},
    )
    reply = stop(failing, session, INVOICE)
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())

    with pytest.raises(ResumeInterruptedError, match="model unavailable") as caught:
        resume(failing, reply["messages"], session)

    # The call ran once and cannot run again; its result is not lost: the error carries the conversation.
    assert len(ledger_lines(ledger)) == 1
    assert [m.role.value for m in caught.value.messages] == ["user", "assistant", "tool"]
    assert [o.outcome for o in caught.value.outcomes] == ["executed"]
    with pytest.raises(ApprovalClaimedError):
        resume(failing, reply["messages"], session)
    final = make_agent({"send_invoice": AlwaysAskPolicy()}).run(caught.value.messages)
    assert final["last_message"].text == "final: invoice sent to acme for 120"
    assert len(ledger_lines(ledger)) == 1


async def test_a_missing_step_reads_the_same_in_sync_and_async(session: FsspecToolResultStore) -> None:
    ledger = ApprovalLedger(session)
    with pytest.raises(ApprovalNotFoundError) as sync_error:
        ledger.step(7)
    with pytest.raises(ApprovalNotFoundError) as async_error:
        await ledger.step_async(7)
    assert str(sync_error.value) == str(async_error.value) == "No held step 7 ('step.00000007.json') in this session."
