"""
What the offload hooks count (``offload.results``, ``offload.result.bytes``), checked against what really happened: the
objects a separate store finds on the same root, the PUTs moto's server answered, and the conversation the run left.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading import AlwaysOffload, OffloadOverChars
from haystack.tools import Tool
from hook_scripts import ALLOW_EXPERIMENTAL, OFFLOADED, TOOLS, make_agent, page, references, tool_results

from haystack_integrations.offload import (
    FsspecToolResultStore,
    OffloadCompactionHook,
    OffloadHook,
    metrics,
    offload_context,
)
from haystack_integrations.offload.stores.quotas import Quota
from haystack_integrations.offload.testing.local_s3 import RequestLog
from metric_readings import MetricReadings

RESULTS = "offload.results"
BYTES = "offload.result.bytes"
PLAN = "acme: fetch+notes, fetch, notes"
# What PLAN's tools return, in conversation order: fetch's ~24 KB results are over the threshold, notes' ~4.8 KB not.
ORIGINALS = [
    page("acme step 0 call 0"),
    page("acme step 0 call 1", lines=40),
    page("acme step 1 call 0"),
    page("acme step 2 call 0", lines=40),
]
MODES = ["sync", "async", "behind"]


def hooks(mode: str, policy: Any) -> dict[str, list[Any]]:
    hook = OffloadHook({"*": policy}, write_behind=mode == "behind")
    # Registered at the end of the run too, as write-behind needs: a result seen there again must not count twice.
    return {"after_tool": [hook], "after_run": [hook]}


async def run(mode: str, agent: Any, store: Any, plan: str = PLAN) -> dict[str, Any]:
    messages = [ChatMessage.from_user(plan)]
    if mode == "sync":
        return agent.run(messages, hook_context=offload_context(store))
    return await agent.run_async(messages, hook_context=offload_context(store))


def stored_elsewhere(backend: Any) -> list[Any]:
    """The session's objects as a store sharing nothing with the run's (no client, no in-flight table) lists them."""
    return on_root(backend).for_session("acme", "chat-1").list()


def on_root(backend: Any, **settings: Any) -> FsspecToolResultStore:
    url, storage_options = backend
    return FsspecToolResultStore(url, storage_options=storage_options, **backend.store_kwargs, **settings)


def whole(result: dict[str, Any]) -> list[str]:
    """The tool results the run left whole in its conversation."""
    return [
        str(message.tool_call_result.result)  # type: ignore[union-attr]
        for message in tool_results(result)
        if OFFLOADED not in message.meta
    ]


def utf8_bytes(texts: list[str]) -> int:
    return sum(len(text.encode()) for text in texts)


@pytest.fixture
def s3_log(request: pytest.FixtureRequest, backend: Any) -> RequestLog | None:
    """Moto's request log on the s3 backend (emptied now), None on the others."""
    return request.getfixturevalue("s3_requests") if backend.url.startswith("s3://") else None


@pytest.fixture
def labelled_tenants() -> Iterator[None]:
    """Label acme's series with its tenant for one test; labelling is process-wide, so it is turned off after."""
    metrics.label_tenants(["acme"])
    yield
    metrics.label_tenants([])


@pytest.mark.parametrize("mode", MODES)
async def test_stored_and_under_threshold_count_what_the_store_and_the_conversation_hold(
    mode: str, backend: Any, s3_log: RequestLog | None, metric_readings: MetricReadings
) -> None:
    session = on_root(backend).for_session("acme", "chat-1")
    result = await run(mode, make_agent(hooks(mode, OffloadOverChars(10_000))), session)

    objects = stored_elsewhere(backend)
    assert len(objects) == len(references(result)) == 2
    assert metric_readings.added(RESULTS, offload__outcome="stored") == len(objects)
    assert metric_readings.added(BYTES, offload__outcome="stored") == sum(o.size for o in objects)
    if s3_log is not None:
        assert s3_log.count(method="PUT") == len(objects)
    kept = whole(result)
    assert kept == [ORIGINALS[1], ORIGINALS[3]]
    assert metric_readings.added(RESULTS, offload__outcome="under_threshold") == len(kept)
    assert metric_readings.added(BYTES, offload__outcome="under_threshold") == utf8_bytes(kept)
    assert metric_readings.added(RESULTS) == len(ORIGINALS)  # each result once, in one outcome


@pytest.mark.parametrize("mode", MODES)
async def test_a_failed_write_counts_as_kept_inline(
    mode: str, failing_store: FsspecToolResultStore, metric_readings: MetricReadings
) -> None:
    result = await run(mode, make_agent(hooks(mode, AlwaysOffload())), failing_store)

    kept = whole(result)
    assert kept == ORIGINALS  # every write failed, every result stayed
    assert metric_readings.added(RESULTS, offload__outcome="kept_inline") == len(kept)
    assert metric_readings.added(BYTES, offload__outcome="kept_inline") == utf8_bytes(kept)
    # Behind, each pointer was placed before its write failed: placing it stored nothing, and counted nothing.
    assert metric_readings.added(RESULTS, offload__outcome="stored") == 0


@pytest.mark.parametrize("mode", MODES)
async def test_a_quota_refusal_counts_as_refused_quota(
    mode: str, backend: Any, s3_log: RequestLog | None, metric_readings: MetricReadings
) -> None:
    session = on_root(backend, quota=Quota(session_results=1)).for_session("acme", "chat-1")
    result = await run(mode, make_agent(hooks(mode, AlwaysOffload())), session)

    objects = stored_elsewhere(backend)
    assert len(objects) == 1  # the first result fitted; the quota refused the others before sending a byte
    assert metric_readings.added(RESULTS, offload__outcome="stored") == len(objects)
    if s3_log is not None:
        assert s3_log.count(method="PUT") == len(objects)
    kept = whole(result)
    assert kept == ORIGINALS[1:]
    assert metric_readings.added(RESULTS, offload__outcome="refused_quota") == len(kept)
    assert metric_readings.added(BYTES, offload__outcome="refused_quota") == utf8_bytes(kept)
    assert metric_readings.added(RESULTS, offload__outcome="kept_inline") == 0


@pytest.mark.parametrize("mode", MODES)
async def test_a_run_that_ends_on_a_tool_counts_its_last_results_once(
    mode: str, tmp_path: Path, metric_readings: MetricReadings
) -> None:
    session = FsspecToolResultStore(str(tmp_path / "results")).for_session("acme", "chat-1")
    # The run stops after `notes`: `after_run` sees that step's results again, after `after_tool` counted them.
    agent = make_agent(hooks(mode, OffloadOverChars(10_000)), exit_conditions=["notes"])
    result = await run(mode, agent, session, plan="acme: fetch, notes")

    assert whole(result) == [page("acme step 1 call 0", lines=40)]
    assert metric_readings.added(RESULTS, offload__outcome="under_threshold") == 1
    assert metric_readings.added(RESULTS, offload__outcome="stored") == len(session.list()) == 1


async def test_write_behind_counts_a_result_only_once_its_write_has_landed(
    backend: Any, metric_readings: MetricReadings
) -> None:
    session = on_root(backend).for_session("acme", "chat-1")
    seen: list[tuple[float, int]] = []

    def fetch(query: str) -> str:
        # Each step's tool runs while the previous step's upload may still be in flight.
        seen.append((metric_readings.added(RESULTS, offload__outcome="stored"), len(stored_elsewhere(backend))))
        return page(query)

    tool = Tool(name="fetch", description="Fetch.", parameters=TOOLS[0].parameters, function=fetch)
    agent = make_agent(hooks("behind", AlwaysOffload()), tools=[tool])
    result = await run("behind", agent, session, plan="acme: fetch, fetch, fetch")

    assert len(seen) == 3
    assert all(counted <= landed for counted, landed in seen), seen
    objects = stored_elsewhere(backend)
    assert len(objects) == len(references(result)) == 3
    assert metric_readings.added(RESULTS, offload__outcome="stored") == len(objects)
    assert metric_readings.added(BYTES, offload__outcome="stored") == sum(o.size for o in objects)


@ALLOW_EXPERIMENTAL
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_compaction_counts_each_result_it_stores(
    mode: str, backend: Any, s3_log: RequestLog | None, metric_readings: MetricReadings
) -> None:
    session = on_root(backend).for_session("acme", "chat-1")
    agent = make_agent({"before_llm": [OffloadCompactionHook(context_window=6000)]})
    result = await run(mode, agent, session, plan="acme: fetch+notes, notes, notes")

    objects = stored_elsewhere(backend)
    assert len(objects) == len(references(result, compacted=True)) >= 1
    assert metric_readings.added(RESULTS, offload__outcome="stored") == len(objects)
    assert metric_readings.added(BYTES, offload__outcome="stored") == sum(o.size for o in objects)
    if s3_log is not None:
        assert s3_log.count(method="PUT") == len(objects)
    assert metric_readings.added(RESULTS, offload__outcome="under_threshold") == 0


async def test_only_a_listed_tenant_is_labelled(
    tmp_path: Path, labelled_tenants: None, metric_readings: MetricReadings
) -> None:
    root = FsspecToolResultStore(str(tmp_path / "results"))
    agent = make_agent(hooks("async", OffloadOverChars(10_000)))
    await run("async", agent, root.for_session("acme", "chat-1"))
    await run("async", agent, root.for_session("globex", "chat-1"))

    assert metric_readings.added(RESULTS, offload__outcome="stored", offload__tenant="acme") == 2
    assert metric_readings.added(RESULTS, offload__outcome="stored") == 4
    # Globex is not listed: its series carry the outcome alone, never a tenant, session or tool-call id.
    assert {frozenset(series) for series in metric_readings.series(RESULTS)} == {
        frozenset({"offload.outcome"}),
        frozenset({"offload.outcome", "offload.tenant"}),
    }
