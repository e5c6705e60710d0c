"""
A session's approval history, written fast for tests and benchmarks: the documents of one real round trip, copied once
per step number, as the code writes them (`seed`); and one round trip through the public API (`round_trip`).
"""

import asyncio
import uuid
from typing import Any

from approval_scenario import plan
from haystack.components.agents import Agent

from haystack_integrations.offload import (
    APPROVAL_REQUIRED,
    Decision,
    DurableApprovals,
    FsspecToolResultStore,
    decide_async,
    offload_context,
    pending_approvals_async,
    resume_async,
)


async def round_trip(agent: Agent, session: Any, call_id: str) -> None:
    """One approval round trip through the public API: the run stops, the client lists, a person decides, resume."""
    reply = await agent.run_async(
        [plan(("send_invoice", {"customer": "acme", "amount": 10}, call_id))],
        hook_context=offload_context(session, approval_channel=DurableApprovals()),
    )
    assert reply["exit_reason"] == APPROVAL_REQUIRED
    [request] = await pending_approvals_async(session)
    await decide_async(session, request.request_id, Decision.approve(by="alice"))
    final = await resume_async(agent, reply["messages"], session)
    assert final["last_message"].text.startswith("final: invoice sent")


async def seed(root: FsspecToolResultStore, session: Any, agent: Agent, prior: int) -> None:
    """
    Give `session` a history of `prior` decided and resumed approvals, as the real code writes them.

    One real round trip runs in a scratch session; its approval and audit documents are then written into `session`
    once per step number 1..`prior` (the step number renamed in names and contents), so that seeding costs a few
    batched writes rather than `prior` round trips.
    """
    scratch = root.for_session("acme", f"template-{uuid.uuid4().hex[:8]}")
    await round_trip(agent, scratch, "template")
    copies = []
    for namespace in ("approvals", "audit"):
        source = scratch.documents(namespace)
        names = await source.list_async()
        contents = await asyncio.gather(*(source.get_async(name) for name in names))
        copies.append((session.documents(namespace), list(zip(names, contents, strict=True))))
    writes = []
    for sequence in range(1, prior + 1):
        number = f"{sequence:08d}"
        for target, documents in copies:
            for name, data in documents:
                if "00000001" not in name and not data.count(b"00000001"):
                    continue  # not a step's (rules' memory and such): written by the measured round trips
                renamed = name.replace("00000001", number)
                if renamed == name:  # an audit event named by a counter: one per step
                    renamed = f"{name.removesuffix('.json')}-{number}.json"
                content = data.replace(b"00000001", number.encode()).replace(
                    b'"sequence":1,', f'"sequence":{sequence},'.encode()
                )
                writes.append((target, renamed, content))
    for start in range(0, len(writes), 32):
        await asyncio.gather(*(target.put_async(name, data) for target, name, data in writes[start : start + 32]))
