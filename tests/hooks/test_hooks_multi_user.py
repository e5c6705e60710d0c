"""
Many users on one Agent: 20 concurrent sessions over 5 tenants, both hooks, S3 (moto's server over HTTP).

Every offloaded or compacted result must land in its own session, be readable there, and be nowhere else.
"""

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading import NeverOffload, OffloadOverChars
from hook_scripts import make_agent, page, references

from haystack_integrations.offload import (
    FsspecToolResultStore,
    OffloadCompactionHook,
    OffloadHook,
    ResultNotFoundError,
    offload_context,
)
from haystack_integrations.offload.testing.local_s3 import LocalS3Server

pytestmark = pytest.mark.s3

TENANTS = [f"tenant-{t}" for t in range(5)]
SESSIONS = [(tenant, f"chat-{s}") for tenant in TENANTS for s in range(4)]


def _label(tenant: str, session: str) -> str:
    return f"{tenant}/{session}"


def _originals(label: str) -> set[str]:
    """Every tool result the scripted run of `label` produces."""
    return {page(f"{label} step 0 call 0")} | {
        page(f"{label} step {step} call {call}", lines=40) for step, call in ((0, 1), (1, 0), (2, 0), (3, 0))
    }


@pytest.mark.parametrize("write_behind", [False, True], ids=["write-through", "write-behind"])
@pytest.mark.slow
async def test_twenty_sessions_over_five_tenants_on_one_agent(s3_server: LocalS3Server, write_behind: bool) -> None:
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options()
    )
    await root.warm_up_async()
    offload = OffloadHook({"fetch": OffloadOverChars(10_000), "*": NeverOffload()}, write_behind=write_behind)
    agent = make_agent(
        {
            "after_tool": [offload],
            "before_llm": [OffloadCompactionHook(context_window=4000)],
            **({"after_run": [offload]} if write_behind else {}),
        }
    )
    stores = {(tenant, session): root.for_session(tenant, session) for tenant, session in SESSIONS}

    async def one_session(tenant: str, session: str) -> dict[str, Any]:
        plan = f"{_label(tenant, session)}: fetch+notes, notes, notes, notes"
        return await agent.run_async(
            [ChatMessage.from_user(plan)], hook_context=offload_context(stores[tenant, session])
        )

    results = await asyncio.gather(*(one_session(tenant, session) for tenant, session in SESSIONS))

    everything = 0
    for (tenant, session), result in zip(SESSIONS, results, strict=True):
        label, store = _label(tenant, session), stores[tenant, session]
        assert result["messages"][-1].text == f"{label}: finished after 4 steps"
        offloaded, compacted = references(result, compacted=False), references(result, compacted=True)
        assert len(offloaded) == 1
        assert len(compacted) >= 2
        # Readable in its own session, holding its own run's results, and that session holds nothing else.
        contents = [await store.read_async(reference) for reference in offloaded + compacted]
        assert contents[0] == page(f"{label} step 0 call 0")
        assert set(contents) <= _originals(label)
        assert sorted(record.reference for record in await store.list_async()) == sorted(offloaded + compacted)
        everything += len(offloaded) + len(compacted)

        # Not readable from a neighbouring session of the same tenant, nor from another tenant's session.
        neighbour = stores[tenant, "chat-3" if session != "chat-3" else "chat-0"]
        stranger = stores[TENANTS[(TENANTS.index(tenant) + 1) % len(TENANTS)], session]
        for other in (neighbour, stranger):
            for reference in offloaded + compacted:
                with pytest.raises(ResultNotFoundError):
                    await other.read_async(reference)

    # Nowhere else: the whole tree holds exactly the sessions' results, each under its own prefix.
    tree = await root.list_async()
    assert len(tree) == everything
    per_session = Counter(record.reference.rsplit("/", 1)[0] for record in tree)
    assert set(per_session) == {_label(tenant, session) for tenant, session in SESSIONS}
    for record in tree:
        owner = record.reference.rsplit("/", 1)[0]
        assert (await root.read_async(record.reference)) in _originals(owner)
