"""
An approval round trip costs the same whatever the session's approval history: its requests and bytes on moto's S3
server are equal after 10 and after 200 decided approvals in the session (issue 42).
"""

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from approval_history import round_trip, seed
from approval_scenario import ledger_lines, make_agent, plan
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy

from haystack_integrations.offload import (
    Decision,
    DurableApprovals,
    FsspecToolResultStore,
    decide_async,
    offload_context,
    pending_approvals_async,
    resume_async,
)
from haystack_integrations.offload.approvals.decisions import open_step_async
from haystack_integrations.offload.approvals.ledger import ApprovalLedger
from haystack_integrations.offload.sessions import ChatService

pytestmark = pytest.mark.s3


def costs(requests: Any) -> dict[str, int]:
    """Requests by kind, and the bytes the server sent, LIST responses apart."""
    log = requests.snapshot()
    requests.clear()
    lists = [r for r in log if "list-type=2" in r.query]
    counted: Counter[str] = Counter(r.method for r in log if "list-type=2" not in r.query)
    return {
        "LIST": len(lists),
        "LIST bytes": sum(r.bytes_sent for r in lists),
        **counted,
        "requests": len(log),
        "bytes": sum(r.bytes_sent for r in log),
    }


async def measured(s3_server: Any, s3_requests: Any, prior: int, engine: str) -> dict[str, int]:
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options(), engine=engine
    )
    await root.warm_up_async()
    assert root.check_exclusive_creates().enforced
    session = root.for_session("acme", "chat-1")
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    await seed(root, session, agent, prior)
    # A first round trip on the seeded history: whatever it learns of the session once is not the measured cost.
    await round_trip(agent, session, "warm")
    s3_requests.clear()
    await round_trip(agent, session, "measured")
    return costs(s3_requests)


@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_a_round_trip_costs_the_same_after_10_and_after_200_decided_approvals(
    s3_server: Any, s3_requests: Any, ledger: Path, engine: str
) -> None:
    small = asyncio.run(measured(s3_server, s3_requests, 10, engine))
    large = asyncio.run(measured(s3_server, s3_requests, 200, engine))
    # Equal, request for request and byte for byte of every LIST; the bodies of GETs are the same documents.
    assert large["LIST"] == small["LIST"], (small, large)
    assert large["LIST bytes"] == small["LIST bytes"], (small, large)
    # Bytes differ only by the digits of step numbers and times in the documents read.
    assert {kind: count for kind, count in large.items() if kind != "bytes"} == {
        kind: count for kind, count in small.items() if kind != "bytes"
    }
    assert abs(large["bytes"] - small["bytes"]) <= small["bytes"] // 100, (small, large)


def lists(requests: Any) -> int:
    """How many LISTs the server answered since the last call (and forget them)."""
    counted = sum(1 for request in requests.snapshot() if "list-type=2" in request.query)
    requests.clear()
    return counted


def test_a_session_written_before_heads_existed_resolves_as_before(
    s3_server: Any, s3_requests: Any, ledger: Path
) -> None:
    """
    Today's code writes the documents it always wrote, plus ``.approvals/head.json``. A session without a head is one
    written by the code before it: its decided approval still resolves, and is run once.
    """
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options()
    )
    session = root.for_session("acme", "chat-1")
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})

    async def scenario() -> None:
        for index in range(3):
            await round_trip(agent, session, f"seed-{index}")
        reply = await agent.run_async(
            [plan(("send_invoice", {"customer": "old", "amount": 7}, "old-call"))],
            hook_context=offload_context(session, approval_channel=DurableApprovals()),
        )
        [request] = await pending_approvals_async(session)
        await decide_async(session, request.request_id, Decision.approve(by="alice"))
        # What the code before heads left: the same documents, and no head.
        await session.documents("approvals").delete_async("head.json")
        assert "head.json" not in await session.documents("approvals").list_async()
        s3_requests.clear()

        assert await pending_approvals_async(session) == []  # decided: nothing waits
        assert lists(s3_requests) == 1  # the one listing that finds the newest step, and writes the head
        step = await open_step_async(session)
        assert step is not None and step.decided and not step.waiting and step.sequence == 4
        final = await resume_async(agent, reply["messages"], session)
        assert lists(s3_requests) == 0
        assert [outcome.outcome for outcome in final["approval_outcomes"]] == ["executed"]
        assert final["last_message"].text == "final: invoice sent to old for 7"

        # The next step takes the next number: nothing of the old history is reused or shadowed.
        await round_trip(agent, session, "after")
        assert lists(s3_requests) == 0
        assert (await ApprovalLedger(session).snapshot_async()).step.sequence == 5  # type: ignore[union-attr]

    asyncio.run(scenario())
    assert sum(line.startswith("old:7:") for line in ledger_lines(ledger)) == 1


def test_a_head_that_lags_behind_is_caught_up(s3_server: Any, s3_requests: Any, ledger: Path) -> None:
    """A head write that failed, or two holds that raced, leave the head behind: the next numbers are read on."""
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options()
    )
    session = root.for_session("acme", "chat-1")
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})

    async def scenario() -> None:
        for index in range(2):
            await round_trip(agent, session, f"seed-{index}")
        await agent.run_async(
            [plan(("send_invoice", {"customer": "late", "amount": 3}, "late-call"))],
            hook_context=offload_context(session, approval_channel=DurableApprovals()),
        )
        approvals = session.documents("approvals")
        await approvals.put_async("head.json", b'{"sequence":1}')
        s3_requests.clear()
        [request] = await pending_approvals_async(session)
        assert request.tool_call_id == "late-call" and request.step_id.startswith("00000003-")
        assert await approvals.get_async("head.json") == b'{"sequence":3}'  # caught up for the next reader
        assert lists(s3_requests) == 0

    asyncio.run(scenario())


def approval_costs(requests: Any) -> dict[str, int]:
    """`costs` of the requests about the session's approvals and audit (a LIST by its prefix, others by key)."""
    log = [r for r in requests.snapshot() if ".approvals" in r.path + r.query or ".audit" in r.path + r.query]
    requests.clear()
    lists = [r for r in log if "list-type=2" in r.query]
    counted: Counter[str] = Counter(r.method for r in log if "list-type=2" not in r.query)
    return {"LIST": len(lists), "LIST bytes": sum(r.bytes_sent for r in lists), **counted, "requests": len(log)}


async def service_measured(s3_server: Any, s3_requests: Any, prior: int) -> dict[str, int]:
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options()
    )
    await root.warm_up_async()
    assert root.check_exclusive_creates().enforced
    session = root.for_session("acme", "chat-1")
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    await seed(root, session, agent, prior)
    service = ChatService(agent)

    async def chat_round_trip(call_id: str) -> None:
        held = await service.send_message(
            session, plan(("send_invoice", {"customer": "acme", "amount": 10}, call_id)).text or ""
        )
        assert held.status == "approval_required"
        [request] = await service.pending(session)
        decided = await service.decide(session, request.request_id, approved=True, actor="alice")
        assert decided.resumed is not None and decided.resumed.status == "completed"

    await chat_round_trip("warm")
    s3_requests.clear()
    await chat_round_trip("measured")
    return approval_costs(s3_requests)


def test_a_chat_service_round_trip_reads_the_same_approvals_after_10_and_200(
    s3_server: Any, s3_requests: Any, ledger: Path
) -> None:
    """Through `ChatService` (send, pending, decide and its resume), as the reference server serves it."""
    small = asyncio.run(service_measured(s3_server, s3_requests, 10))
    large = asyncio.run(service_measured(s3_server, s3_requests, 200))
    assert small["LIST"] == large["LIST"] == 0, (small, large)
    assert small == large, (small, large)
