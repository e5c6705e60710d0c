"""
Exactly once with other hooks beside ApprovalHook, with workers that stop mid-call, and with the run's state.

A resumed step goes through the Agent's whole ``before_tool`` chain again: every `ApprovalHook` decides its own calls
(a step waits until each one's requests are decided), and every other hook runs and is obeyed.
"""

import asyncio
import importlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from approval_scenario import INVOICE_SCHEMA, LEDGER_ENV, ledger_lines, plan, script
from haystack.components.agents import Agent
from haystack.components.agents.state.state import State
from haystack.components.agents.state.state_utils import replace_values
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage
from haystack.hooks import hook
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy
from haystack.tools import Tool

from haystack_integrations.offload import (
    APPROVAL_REQUIRED,
    ApprovalHook,
    CallbackApprovals,
    Decision,
    DurableApprovals,
    FsspecToolResultStore,
    decide,
    offload_context,
    pending_approvals,
    read_audit,
    resume,
    resume_async,
)
from haystack_integrations.offload.approvals import ApprovalClaimedError
from haystack_integrations.offload.approvals.resume import current_idempotency_key
from support.isolation import RGW_LANE

# Also on RGW with STS credentials and an SSE-C key per tenant (tests/conftest.py, "isolated").
pytestmark = pytest.mark.isolated

INVOICE = ("send_invoice", {"customer": "acme", "amount": 120}, "call_inv")
DELETE = ("delete_file", {"path": "a.txt"}, "call_del")
WIPE = ("wipe", {"path": "/"}, "call_wipe")
PATH_SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


class Stop(BaseException):
    """Escapes every handler, as a worker killed mid-call would stop everything at once."""


def _record(kind: str, detail: str) -> str:
    import os

    line = json.dumps({"kind": kind, "detail": detail, "key": current_idempotency_key()}) + "\n"
    with open(os.environ[LEDGER_ENV], "a") as file:
        file.write(line)
    return f"{kind} done: {detail}"


def send_invoice(customer: str, amount: int) -> str:
    """Send an invoice (records the idempotency key it ran with)."""
    return _record("invoice", f"{customer}:{amount}")


def delete_file(path: str) -> str:
    """Delete a file."""
    return _record("delete", path)


def wipe(path: str) -> str:
    """Wipe a disk: a guardrail must stop this."""
    return _record("wipe", path)


STOP_ONCE: dict[str, bool] = {}


def flaky_invoice(customer: str, amount: int) -> str:
    """Send an invoice, but the first try's worker dies after the provider charged (the line is written)."""
    result = _record("invoice", f"{customer}:{amount}")
    if not STOP_ONCE.get("stopped"):
        STOP_ONCE["stopped"] = True
        raise Stop
    return result


def slow_invoice(customer: str, amount: int) -> str:
    """Send an invoice slowly (longer than the resume lease)."""
    time.sleep(3.0)
    return _record("invoice", f"{customer}:{amount}")


@hook
def block_wipe(state: State) -> None:
    """A plain Haystack guardrail: answers any `wipe` call with an error instead of letting it run."""
    messages = state.data.get("messages") or []
    if not messages or not messages[-1].tool_calls:
        return
    message = messages[-1]
    blocked = [call for call in message.tool_calls if call.tool_name == "wipe"]
    if not blocked:
        return
    running = [call for call in message.tool_calls if call.tool_name != "wipe"]
    shaped = []
    for call in blocked:
        shaped.append(ChatMessage.from_assistant(tool_calls=[call]))
        shaped.append(ChatMessage.from_tool(tool_result="blocked by policy", origin=call, error=True))
    if running:
        shaped.append(ChatMessage.from_assistant(text=message.text, tool_calls=running))
    state.set("messages", messages[:-1] + shaped, handler_override=replace_values)


def tools(invoice: Any = send_invoice) -> list[Tool]:
    return [
        Tool(name="send_invoice", description="Send an invoice.", parameters=INVOICE_SCHEMA, function=invoice),
        Tool(name="delete_file", description="Delete a file.", parameters=PATH_SCHEMA, function=delete_file),
        Tool(name="wipe", description="Wipe a disk.", parameters=PATH_SCHEMA, function=wipe),
    ]


def agent_with(before_tool: list[Any], invoice: Any = send_invoice, **kwargs: Any) -> Agent:
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=tools(invoice),
        hooks={"before_tool": before_tool},
        **kwargs,
    )
    agent.warm_up()
    return agent


def approvals() -> tuple[ApprovalHook, ApprovalHook]:
    return ApprovalHook({"send_invoice": AlwaysAskPolicy()}), ApprovalHook({"delete_file": AlwaysAskPolicy()})


def ran(ledger: Path) -> list[tuple[str, str]]:
    return [(entry["kind"], entry["detail"]) for entry in map(json.loads, ledger_lines(ledger))]


def durable(store: FsspecToolResultStore) -> dict[str, Any]:
    return offload_context(store, approval_channel=DurableApprovals())


@pytest.fixture
def session(store: FsspecToolResultStore) -> FsspecToolResultStore:
    return store.for_session("acme", "chat-1")


@pytest.mark.parametrize("order", ["approvals-first", "guardrail-first"])
def test_every_hook_of_the_chain_decides_on_resume(order: str, session: FsspecToolResultStore, ledger: Path) -> None:
    invoice_hook, delete_hook = approvals()
    chain = (
        [invoice_hook, delete_hook, block_wipe]
        if order == "approvals-first"
        else [block_wipe, invoice_hook, delete_hook]
    )
    agent = agent_with(chain)
    reply = agent.run([plan(INVOICE, DELETE, WIPE)], hook_context=durable(session))
    assert reply["exit_reason"] == APPROVAL_REQUIRED

    # One guard at a time: the invoice's approval lets the step go on to the next guard, which holds it again.
    [first] = pending_approvals(session)
    assert first.tool_name == "send_invoice"
    decide(session, first.request_id, Decision.approve())
    again = resume(agent, reply["messages"], session)
    assert again["exit_reason"] == APPROVAL_REQUIRED
    assert ran(ledger) == []
    [second] = pending_approvals(session)
    assert (second.tool_name, second.guard) == ("delete_file", delete_hook.guard)

    decide(session, second.request_id, Decision.approve())
    final = resume(agent, again["messages"], session)

    # Both approved calls ran once; the guarded one never, whatever the order of the hooks.
    assert sorted(ran(ledger)) == [("delete", "a.txt"), ("invoice", "acme:120")]
    results = {m.tool_call_result.origin.id: m.tool_call_result for m in final["messages"] if m.tool_call_result}
    assert results["call_wipe"].error and results["call_wipe"].result == "blocked by policy"
    assert not results["call_inv"].error and not results["call_del"].error
    assert final["exit_reason"] == "text"
    with pytest.raises(ApprovalClaimedError):
        resume(agent, again["messages"], session)
    assert len(ran(ledger)) == 2


def test_a_denial_by_one_guard_keeps_the_others_decisions(session: FsspecToolResultStore, ledger: Path) -> None:
    invoice_hook, delete_hook = approvals()
    agent = agent_with([invoice_hook, delete_hook])
    reply = agent.run([plan(INVOICE, DELETE)], hook_context=durable(session))
    [first] = pending_approvals(session)
    decide(session, first.request_id, Decision.deny("not today"))
    again = resume(agent, reply["messages"], session)
    [second] = pending_approvals(session)
    assert second.tool_name == "delete_file"
    decide(session, second.request_id, Decision.approve())
    final = resume(agent, again["messages"], session)
    assert ran(ledger) == [("delete", "a.txt")]
    outcomes = {o.tool_call_id: o.outcome for o in final["approval_outcomes"]}
    assert outcomes == {"call_del": "executed"}
    events = [e.event for e in read_audit(session)]
    assert events.count("approval.denied") == 1 and events.count("approval.executed") == 1


def test_in_process_channel_obeys_every_hook(session: FsspecToolResultStore, ledger: Path) -> None:
    invoice_hook, delete_hook = approvals()
    asked: list[str] = []

    def approve_all(request: Any) -> Decision:
        asked.append(request.tool_name)
        return Decision.approve()

    for chain in ([invoice_hook, delete_hook, block_wipe], [block_wipe, delete_hook, invoice_hook]):
        agent = agent_with(chain)
        context = offload_context(session, approval_channel=CallbackApprovals(approve_all))
        agent.run([plan(INVOICE, DELETE, WIPE)], hook_context=context)
    assert sorted(asked) == ["delete_file", "delete_file", "send_invoice", "send_invoice"]
    assert sorted(ran(ledger)) == [("delete", "a.txt")] * 2 + [("invoice", "acme:120")] * 2


def test_the_tool_sees_a_stable_idempotency_key(session: FsspecToolResultStore, ledger: Path) -> None:
    invoice_hook, _ = approvals()
    agent = agent_with([invoice_hook])
    reply = agent.run([plan(INVOICE)], hook_context=durable(session))
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())
    final = resume(agent, reply["messages"], session)
    [entry] = [json.loads(line) for line in ledger_lines(ledger)]
    assert entry["key"] is not None and entry["key"].startswith("offload-")
    assert final["approval_outcomes"][0].idempotency_key == entry["key"]
    # Outside an approved call there is no key.
    assert current_idempotency_key() is None


@pytest.mark.slow
def test_a_call_whose_worker_stopped_mid_call_is_held_as_may_have_run(
    session: FsspecToolResultStore, ledger: Path
) -> None:
    STOP_ONCE.clear()
    invoice_hook, _ = approvals()
    agent = agent_with([invoice_hook], invoice=flaky_invoice)
    reply = agent.run([plan(INVOICE)], hook_context=durable(session))
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())
    with pytest.raises(Stop):
        resume(agent, reply["messages"], session, lease=2.0)
    assert len(ran(ledger)) == 1  # the provider was charged; the worker died before recording it

    # While the dead worker's lease lasts, nobody else resumes; after it, a takeover neither re-runs nor drops it.
    with pytest.raises(ApprovalClaimedError):
        resume(agent, reply["messages"], session)
    time.sleep(2.1)
    held = resume(agent, reply["messages"], session)
    assert held["exit_reason"] == APPROVAL_REQUIRED
    assert [o.outcome for o in held["approval_outcomes"]] == ["may-have-run"]
    [uncertain] = pending_approvals(session)
    assert (uncertain.guard, uncertain.tool_call_id) == ("may-have-run", "call_inv")
    assert len(ran(ledger)) == 1
    assert "approval.may_have_run" in [e.event for e in read_audit(session)]

    # An explicit retry runs it again with the same idempotency key, so the provider can tell.
    decide(session, uncertain.request_id, Decision.approve(by="alice"))
    final = resume(agent, held["messages"], session)
    entries = [json.loads(line) for line in ledger_lines(ledger)]
    assert len(entries) == 2 and entries[0]["key"] == entries[1]["key"]
    assert [o.outcome for o in final["approval_outcomes"]] == ["executed"]
    assert final["exit_reason"] == "text"


def test_a_may_have_run_call_that_is_not_retried_reaches_the_model_as_such(
    session: FsspecToolResultStore, ledger: Path
) -> None:
    STOP_ONCE.clear()
    invoice_hook, _ = approvals()
    agent = agent_with([invoice_hook], invoice=flaky_invoice)
    reply = agent.run([plan(INVOICE)], hook_context=durable(session))
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())
    with pytest.raises(Stop):
        resume(agent, reply["messages"], session, lease=0.1)
    time.sleep(0.2)
    held = resume(agent, reply["messages"], session)
    [uncertain] = pending_approvals(session)
    decide(session, uncertain.request_id, Decision.deny("It went through; do not retry."))
    final = resume(agent, held["messages"], session)
    assert len(ran(ledger)) == 1
    [result] = [m.tool_call_result for m in final["messages"] if m.tool_call_result is not None]
    assert result.error and "do not retry" in str(result.result)


def test_a_recorded_result_is_reused_by_a_takeover_never_run_again(
    session: FsspecToolResultStore, ledger: Path
) -> None:
    invoice_hook, _ = approvals()
    agent = agent_with([invoice_hook])
    reply = agent.run([plan(INVOICE)], hook_context=durable(session))
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())
    # A worker that ran and recorded the call, then died before it finished the step (simulated: the done record
    # and the history are lost, the lease lapses).
    first = resume(agent, reply["messages"], session, lease=0.1)
    assert len(ran(ledger)) == 1
    documents = session.documents("approvals")
    [done] = [name for name in documents.list() if name.startswith("done.")]
    documents.delete(done)
    time.sleep(0.2)
    again = resume(agent, reply["messages"], session)
    assert len(ran(ledger)) == 1
    assert [o.outcome for o in again["approval_outcomes"]] == ["recorded"]
    assert [m.text for m in again["messages"] if m.tool_call_result] == [
        m.text for m in first["messages"] if m.tool_call_result
    ]


def test_a_call_whose_worker_died_before_its_audit_append_is_audited_once_by_the_takeover(
    session: FsspecToolResultStore, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The module, not the package's `resume` function of the same name.
    resume_module = importlib.import_module("haystack_integrations.offload.approvals.resume")
    invoice_hook, _ = approvals()
    agent = agent_with([invoice_hook])
    reply = agent.run([plan(INVOICE)], hook_context=durable(session))
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())
    # The worker ran and recorded the call, then died before it appended the step's audit events (its last write)
    # and before its done record was read by anyone: simulated by stopping at that append, and losing the record.
    appends = resume_module.append_audit_async

    async def dies_at_the_audit(*args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(resume_module, "append_audit_async", appends)
        raise Stop

    monkeypatch.setattr(resume_module, "append_audit_async", dies_at_the_audit)
    with pytest.raises(Stop):
        resume(agent, reply["messages"], session, lease=0.1)
    assert len(ran(ledger)) == 1
    assert [e.event for e in read_audit(session)].count("approval.executed") == 0  # the dead worker's was lost
    documents = session.documents("approvals")
    for name in [name for name in documents.list() if name.startswith("done.")]:
        documents.delete(name)
    time.sleep(0.2)
    again = resume(agent, reply["messages"], session)
    assert [o.outcome for o in again["approval_outcomes"]] == ["recorded"] and len(ran(ledger)) == 1
    executed = [e for e in read_audit(session) if e.event == "approval.executed"]
    assert [(e.request_id, e.detail["attempt"]) for e in executed] == [(request.request_id, 1)]


@pytest.mark.slow
async def test_a_long_call_keeps_its_lease(session: FsspecToolResultStore, ledger: Path) -> None:
    invoice_hook, _ = approvals()
    agent = agent_with([invoice_hook], invoice=slow_invoice)
    reply = await agent.run_async([plan(INVOICE)], hook_context=durable(session))
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())
    running = asyncio.create_task(resume_async(agent, reply["messages"], session, lease=1.0))
    await asyncio.sleep(2.2)  # over twice the lease: without renewal another worker could take over now
    with pytest.raises(ApprovalClaimedError):
        await resume_async(agent, reply["messages"], session, worker="other")
    final = await running
    assert final["exit_reason"] == "text"
    assert len(ran(ledger)) == 1


def test_the_runs_state_survives_the_stop(session: FsspecToolResultStore, ledger: Path) -> None:
    seen: list[Any] = []

    def charge(customer: str, amount: int, budget: int) -> str:
        seen.append(budget)
        return f"charged {customer} {amount} of {budget}"

    invoice = Tool(
        name="send_invoice",
        description="Send an invoice.",
        parameters=INVOICE_SCHEMA,
        function=charge,
        inputs_from_state={"budget": "budget"},
    )
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=[invoice],
        hooks={"before_tool": [ApprovalHook({"send_invoice": AlwaysAskPolicy()})]},
        state_schema={"budget": {"type": int}},
    )
    agent.warm_up()
    reply = agent.run([plan(INVOICE)], hook_context=durable(session), budget=500)
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())
    final = resume(agent, reply["messages"], session)  # the caller no longer has the budget: the step kept it
    assert seen == [500]
    assert final["budget"] == 500


# memory:// lives in one process: a killed worker's storage must be one another process sees. In the RGW lane, also
# RGW with STS credentials and SSE-C keys per tenant in both processes.
KILLED_WORKER_BACKENDS = ["local", pytest.param("s3", marks=pytest.mark.s3)]
if RGW_LANE:
    KILLED_WORKER_BACKENDS.append(pytest.param("rgw-isolated", marks=pytest.mark.rgw))


@pytest.mark.parametrize("backend", KILLED_WORKER_BACKENDS, indirect=True)
@pytest.mark.slow
def test_a_worker_process_killed_mid_call_leaves_a_may_have_run_request(
    backend: Any, ledger: Path, tmp_path: Path
) -> None:
    import signal
    import subprocess
    import sys

    url, options = backend
    session = FsspecToolResultStore(url, storage_options=options, **backend.store_kwargs).for_session(
        "acme", "chat-kill"
    )
    invoice_hook, _ = approvals()
    agent = agent_with([invoice_hook])
    reply = agent.run([plan(INVOICE)], hook_context=durable(session))
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())

    here = Path(__file__).parent
    paths = [str(here.parent.parent / "src"), str(here), str(here.parent)]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    messages = json.dumps([message.to_dict() for message in reply["messages"]])
    credentials = backend.store_kwargs.get("credentials")
    role = [credentials.role_arn] if credentials is not None else []
    worker = subprocess.Popen(
        [
            *(sys.executable, str(here / "resume_worker.py"), url, json.dumps(options)),
            *("acme", "chat-kill", messages, "2", *role),
        ],
        env=environment,
    )
    try:
        deadline = time.monotonic() + 60
        while not ran(ledger) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ran(ledger) == [("invoice", "acme:120")]
        worker.send_signal(signal.SIGKILL)  # after the charge, before the result was recorded
    finally:
        worker.wait(timeout=30)

    time.sleep(2.1)  # the dead worker's lease lapses
    held = resume(agent, reply["messages"], session)
    assert held["exit_reason"] == APPROVAL_REQUIRED
    [uncertain] = pending_approvals(session)
    assert uncertain.guard == "may-have-run"
    assert len(ran(ledger)) == 1  # never re-run silently
    decide(session, uncertain.request_id, Decision.deny("The charge went through."))
    final = resume(agent, held["messages"], session)
    assert len(ran(ledger)) == 1  # and never dropped: the model is told
    [result] = [m.tool_call_result for m in final["messages"] if m.tool_call_result is not None]
    assert result.error and "The charge went through." in str(result.result)
