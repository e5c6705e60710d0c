"""
Nothing is lost under faults: 50 concurrent sessions on one Agent with `OffloadHook`, 10% of S3 requests failing.

Every tenth request through the proxy fails (500, 503 SlowDown, a reset before the server sees it, a reset after it
handled it, an answer withheld until the client times out), in turn. Every run must complete, and every tool result
must be either still in the conversation or readable through its reference, byte for byte: the digest of every result
the tools produced is checked against what the conversation holds or the store returns (read directly from moto, so
the check itself is not subject to faults). What each session lists must be exactly its referenced results, plus at
most one complete copy of a result that stayed in the conversation when its write gave up after the PUT landed.

Run twice: with the default retries (faults are absorbed) and with none (failed writes keep their results in the
conversation, and ambiguous ones leave orphans that listing must still get right).
"""

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading import NeverOffload, OffloadOverChars
from ops_helpers import (
    FAST_RETRY,
    OFFLOADED,
    digest,
    make_agent,
    originals,
    plan_for,
    proxied_options,
    tool_results,
)

from haystack_integrations.offload import FsspecToolResultStore, OffloadHook, RetryPolicy, offload_context
from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server

pytestmark = pytest.mark.s3

TENANTS = 5
STEPS, CALLS = 3, 2
FAILING = [Fault.INTERNAL_ERROR, Fault.SLOW_DOWN, Fault.RESET, Fault.RESET_AFTER, Fault.READ_TIMEOUT]


@pytest.mark.parametrize(
    ("retry", "sessions_per_tenant"),
    [
        (FAST_RETRY.model_copy(update={"attempt_timeout": 4.0}), 10),  # 50 sessions
        (RetryPolicy(attempts=1, attempt_timeout=4.0), 4),  # 20 sessions: the same paths, fewer of them
    ],
    ids=["with-retries", "without-retries"],
)
@pytest.mark.slow
async def test_concurrent_sessions_lose_nothing_with_ten_percent_of_requests_failing(
    retry: RetryPolicy, sessions_per_tenant: int, s3_server: LocalS3Server, fault_proxy: FaultProxy
) -> None:
    prefix = f"{s3_server.bucket_url}/nothing-lost-{uuid.uuid4().hex}"
    # 50 sessions at once queue at moto (a few hundred requests a second): a read timeout of 3 s leaves room for that
    # queue, so the timeouts seen are the injected ones (withheld for the proxy's 5 s hold).
    options = proxied_options(s3_server, fault_proxy, read_timeout=3.0)
    faulty = FsspecToolResultStore(prefix, storage_options=options, retry=retry)
    direct = FsspecToolResultStore(prefix, storage_options=s3_server.storage_options())
    faulty.for_session("warm", "up").list()
    agent = make_agent({"after_tool": [OffloadHook({"fetch": OffloadOverChars(1000), "*": NeverOffload()})]})
    sessions = [(f"tenant-{t}", f"chat-{s}") for t in range(TENANTS) for s in range(sessions_per_tenant)]
    fault_proxy.requests.clear()
    fault_proxy.plan = FaultPlan(every=10, kinds=FAILING)

    async def run(tenant: str, session: str) -> dict[str, Any]:
        store = faulty.for_session(tenant, session)
        return await agent.run_async(
            [ChatMessage.from_user(plan_for(f"{tenant}/{session}", STEPS, CALLS))], hook_context=offload_context(store)
        )

    outcomes = await asyncio.gather(*(run(tenant, session) for tenant, session in sessions))
    fault_proxy.plan = FaultPlan()

    # The faults really happened: exactly one request in ten, every kind several times.
    requests, faults = len(fault_proxy.requests.snapshot()), fault_proxy.faults.counts()
    assert sum(faults.values()) == requests // 10
    assert set(faults) == set(FAILING) and min(faults.values()) >= 2

    checked = await asyncio.gather(
        *(
            _check(direct, tenant, session, outcome)
            for (tenant, session), outcome in zip(sessions, outcomes, strict=True)
        )
    )
    offloaded, inline = sum(count for count, _ in checked), sum(count for _, count in checked)
    stats = faulty.retry_stats.as_dict()
    if retry.attempts > 1:
        assert stats["recovered"] > 0 and inline == stats["gave_up"]
    else:
        assert inline > 0 and stats["retries"] == 0
    assert offloaded + inline == len(sessions) * STEPS * CALLS


async def _check(direct: FsspecToolResultStore, tenant: str, session: str, outcome: dict[str, Any]) -> tuple[int, int]:
    """Check one session's results; return how many were offloaded and how many large ones stayed in context."""
    label = f"{tenant}/{session}"
    assert outcome["messages"][-1].text == f"{label}: finished after {STEPS} steps"
    store = direct.for_session(tenant, session)
    produced = Counter(digest(result) for result in originals(label, STEPS, CALLS))
    found: Counter[str] = Counter()
    referenced: set[str] = set()
    stayed: set[str] = set()
    for message in tool_results(outcome):
        references = message.meta.get(OFFLOADED)
        if references:
            (reference,) = references
            referenced.add(reference)
            found[digest(await store.read_async(reference))] += 1
        else:
            content = message.tool_call_result.result  # type: ignore[union-attr]
            found[digest(content)] += 1
            if len(content) > 1000:
                stayed.add(digest(content))
    assert found == produced, f"{label}: results lost or altered"
    # Listing is right: every referenced result once, plus only complete copies of results kept in context.
    listed = {record.reference for record in await store.list_async()}
    assert referenced <= listed
    extra = listed - referenced
    assert len(extra) <= len(stayed)
    for reference in extra:
        assert digest(await store.read_async(reference)) in stayed
    return len(referenced), len(stayed)
