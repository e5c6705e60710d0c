"""
Quotas on every backend: at and over the limit, per session and per tenant, with many writers at once, and across
workers (separate root stores, as separate processes would have) within the documented overshoot bound.
"""

import asyncio
import base64
import errno
import json
import logging
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading import NeverOffload, OffloadOverChars
from ops_helpers import OFFLOADED, make_agent, originals, plan_for, put_aged, tool_results

from haystack_integrations.offload import (
    FsspecToolResultStore,
    OffloadHook,
    Quota,
    QuotaExceededError,
    Retention,
    RetryPolicy,
    end_session,
    end_session_async,
    offload_context,
)
from haystack_integrations.offload.operations import scan, usage
from haystack_integrations.offload.sessions.history import SessionHistory
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog


def _root(backend: tuple[str, dict[str, Any]], quota: Quota, **kwargs: Any) -> FsspecToolResultStore:
    url, storage_options = backend
    pinned = {**getattr(backend, "store_kwargs", {}), **kwargs}
    return FsspecToolResultStore(url, storage_options=storage_options, quota=quota, **pinned)


async def _write_all(store: FsspecToolResultStore, count: int, content: str = "x") -> list[str | BaseException]:
    return list(
        await asyncio.gather(
            *(store.write_async(key=f"{i}.txt", content=content) for i in range(count)), return_exceptions=True
        )
    )


def _stored(outcomes: list[str | BaseException]) -> int:
    refused = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert all(isinstance(outcome, QuotaExceededError) for outcome in refused), refused
    return len(outcomes) - len(refused)


def test_session_results_at_and_over_the_limit(backend: tuple[str, dict[str, Any]]) -> None:
    root = _root(backend, Quota(session_results=3))
    session = root.for_session("acme", "chat-1")
    references = [session.write(key=f"{i}.txt", content=f"result {i}") for i in range(3)]  # at the limit: fine
    with pytest.raises(QuotaExceededError) as caught:
        session.write(key="3.txt", content="one too many")
    error = caught.value
    assert isinstance(error, OSError) and error.errno == errno.EDQUOT
    assert (error.tenant, error.session, error.scope, error.limit, error.allowed) == (
        "acme",
        "chat-1",
        "session",
        "results",
        3,
    )
    assert "tenant 'acme', session 'chat-1'" in str(error) and "not stored" in str(error)
    assert sorted(record.reference for record in session.list()) == sorted(references)
    # Other sessions and tenants have their own quota.
    root.for_session("acme", "chat-2").write(key="k.txt", content="fine")
    root.for_session("globex", "chat-1").write(key="k.txt", content="fine")


def test_session_bytes_count_the_stored_form(backend: tuple[str, dict[str, Any]]) -> None:
    session = _root(backend, Quota(session_bytes=10)).for_session("acme", "chat-1")
    session.write(key="a.txt", content="é" * 3)  # 6 bytes of UTF-8, though 3 characters
    session.write(key="b.bin", content=b"1234")  # exactly at the limit
    with pytest.raises(QuotaExceededError) as caught:
        session.write(key="c.txt", content="!")
    assert (caught.value.limit, caught.value.allowed) == ("bytes", 10)
    assert sum(record.size for record in session.list()) == 10
    with pytest.raises(QuotaExceededError):
        _root(backend, Quota(session_bytes=10)).for_session("acme", "big").write(key="big.txt", content="x" * 11)


def test_tenant_limits_span_the_tenants_sessions(backend: tuple[str, dict[str, Any]]) -> None:
    root = _root(backend, Quota(tenant_results=4, tenant_bytes=1000))
    for i in range(4):
        root.for_session("acme", f"chat-{i % 2}").write(key=f"{i}.txt", content="x")
    with pytest.raises(QuotaExceededError) as caught:
        root.for_session("acme", "chat-new").write(key="k.txt", content="x")
    assert (caught.value.scope, caught.value.session) == ("tenant", "chat-new")
    root.for_session("globex", "chat-0").write(key="k.txt", content="x")
    bytes_root = _root(backend, Quota(tenant_bytes=10))
    bytes_root.for_session("acme", "a").write(key="k.txt", content="x" * 6)
    with pytest.raises(QuotaExceededError, match="tenant may hold 10 bytes"):
        bytes_root.for_session("acme", "b").write(key="k.txt", content="x" * 5)


async def test_many_writers_at_once_never_pass_a_session_limit(backend: tuple[str, dict[str, Any]]) -> None:
    session = _root(backend, Quota(session_results=15)).for_session("acme", "chat-1")
    outcomes = await _write_all(session, 40)
    assert _stored(outcomes) == 15
    assert len(await session.list_async()) == 15


def test_many_threads_at_once_never_pass_a_session_byte_limit(backend: tuple[str, dict[str, Any]]) -> None:
    session = _root(backend, Quota(session_bytes=150)).for_session("acme", "chat-1")

    def write(i: int) -> bool:
        try:
            session.write(key=f"{i}.txt", content="x" * 10)
        except QuotaExceededError:
            return False
        return True

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(write, range(40)))
    assert outcomes.count(True) == 15
    assert sum(record.size for record in session.list()) == 150


async def test_many_sessions_at_once_never_pass_the_tenant_limit(backend: tuple[str, dict[str, Any]]) -> None:
    root = _root(backend, Quota(tenant_results=20, session_results=4))
    sessions = [root.for_session("acme", f"chat-{s}") for s in range(8)]
    outcomes = await asyncio.gather(*(_write_all(session, 6) for session in sessions))
    assert sum(_stored(session_outcomes) for session_outcomes in outcomes) == 20
    assert all(_stored(session_outcomes) <= 4 for session_outcomes in outcomes)
    assert len(await root.for_tenant("acme").list_async()) == 20


async def test_two_workers_stay_within_the_documented_overshoot(backend: tuple[str, dict[str, Any]]) -> None:
    # Two root stores keep two ledgers, exactly as two worker processes would: they only see each other through
    # listings. Each may have admitted its allowance (slack x limit = 5) unseen by the other.
    quota = Quota(tenant_results=20, slack=0.25)
    workers = [_root(backend, quota), _root(backend, quota)]
    outcomes = await asyncio.gather(
        *(
            _write_all(worker.for_session("acme", f"worker-{w}-chat-{s}"), 10)
            for w, worker in enumerate(workers)
            for s in range(3)
        )
    )
    stored = sum(_stored(session_outcomes) for session_outcomes in outcomes)
    assert 20 <= stored <= 25  # limit + (workers - 1) x allowance, allowance = 0.25 x 20
    assert len(await workers[0].for_tenant("acme").list_async()) == stored


def test_a_refusal_rests_on_a_fresh_listing(backend: tuple[str, dict[str, Any]]) -> None:
    quota = Quota(session_results=2, refresh_seconds=3600, recheck_seconds=0)
    first, second = _root(backend, quota), _root(backend, quota)
    mine = first.for_session("acme", "chat-1")
    mine.write(key="a.txt", content="a")
    mine.write(key="b.txt", content="b")
    theirs = second.for_session("acme", "chat-1")
    with pytest.raises(QuotaExceededError):
        theirs.write(key="c.txt", content="c")
    # The first worker frees the quota; the second, refused a moment ago, lists again before refusing and sees it.
    assert first.for_session("acme", "chat-1").purge() == 2
    theirs.write(key="c.txt", content="c")
    # And the first worker's own purge made it forget its count at once.
    mine.write(key="d.txt", content="d")
    with pytest.raises(QuotaExceededError):
        mine.write(key="e.txt", content="e")


def test_expired_results_do_not_count(backend: tuple[str, dict[str, Any]]) -> None:
    root = _root(backend, Quota(session_results=2), retention=Retention(ttl=timedelta(days=1)))
    session = root.for_session("acme", "chat-1")
    for i in range(3):
        put_aged(session, age=timedelta(days=2), content="stale", key=f"old{i}.txt")
    session.write(key="a.txt", content="a")
    session.write(key="b.txt", content="b")
    with pytest.raises(QuotaExceededError):
        session.write(key="c.txt", content="c")


def test_quota_validation() -> None:
    with pytest.raises(ValueError):
        Quota(session_results=-1)
    with pytest.raises(ValueError):
        Quota(slack=1.5)
    with pytest.raises(ValueError):
        Quota(refresh_seconds=0)
    assert Quota(session_results=0, slack=0).allowance(0) == 1
    session = FsspecToolResultStore("memory://q0", quota=Quota(session_results=0)).for_session("acme", "chat-1")
    with pytest.raises(QuotaExceededError):
        session.write(key="k.txt", content="x")


def test_quota_retention_and_retry_survive_serialization(tmp_path: Path) -> None:
    root = FsspecToolResultStore(
        str(tmp_path / "results"),
        quota=Quota(session_results=1, tenant_bytes=10_000),
        retention=Retention(ttl=timedelta(days=7), tenants={"trial": timedelta(hours=1), "keep": None}),
        retry=RetryPolicy(attempts=2, deadline=None),
    )
    data = json.loads(json.dumps(root.for_session("acme", "chat-1").to_dict()))
    restored = FsspecToolResultStore.from_dict(data)
    assert (restored.quota, restored.retention, restored.retry) == (root.quota, root.retention, root.retry)
    restored.write(key="a.txt", content="a")
    with pytest.raises(QuotaExceededError):
        restored.write(key="b.txt", content="b")
    plain = FsspecToolResultStore.from_dict(FsspecToolResultStore("memory://plain", retry=None).to_dict())
    assert (plain.quota, plain.retention, plain.retry) == (None, None, None)


# S3: nothing is sent for a refused write, and quotas add no LIST per write


@pytest.mark.s3
def test_a_refused_write_sends_nothing_and_lists_are_amortised(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options=s3_server.storage_options(),
        quota=Quota(session_results=30, slack=0.1, recheck_seconds=0),
    )
    session = root.for_session("acme", "chat-1")
    session.warm_up()
    s3_requests.clear()
    for i in range(30):
        session.write(key=f"{i}.txt", content="x")
    listings = s3_requests.count(method="GET", query_contains="list-type")
    assert s3_requests.count(method="PUT") == 30
    # One listing per allowance (slack x limit = 3 writes), not one per write; s3fs lists an empty prefix twice.
    assert listings <= 30 // root.quota.allowance(30) + 1  # type: ignore[union-attr]
    assert set(s3_requests.methods()) <= {"PUT", "GET", "HEAD"}
    s3_requests.clear()
    with pytest.raises(QuotaExceededError):
        session.write(key="over.txt", content="x")
    assert s3_requests.count(method="PUT") == 0  # refused before any byte was sent
    assert s3_requests.count(method="GET", query_contains="list-type") == 1  # the fresh listing it rests on


@pytest.mark.s3
def test_a_full_scope_does_not_list_for_every_refusal(s3_server: LocalS3Server, s3_requests: RequestLog) -> None:
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options=s3_server.storage_options(),
        quota=Quota(tenant_results=3, recheck_seconds=3600),
    )
    for i in range(3):
        root.for_session("acme", f"chat-{i}").write(key="k.txt", content="x")
    s3_requests.clear()
    for i in range(10):
        with pytest.raises(QuotaExceededError):
            root.for_session("acme", f"chat-{i}").write(key="more.txt", content="x")
    # One listing for the first refusal at most (the last write's may be recent enough), none for the nine others.
    assert s3_requests.count(method="GET", query_contains="list-type") <= 1
    assert s3_requests.count(method="PUT") == 0


@pytest.mark.s3
def test_without_a_quota_a_write_is_one_put(s3_server: LocalS3Server, s3_requests: RequestLog) -> None:
    session = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options()
    ).for_session("acme", "chat-1")
    session.warm_up()
    s3_requests.clear()
    for i in range(5):
        session.write(key=f"{i}.txt", content="x")
    assert dict(s3_requests.methods()) == {"PUT": 5}


# With the hook: refused results stay in the conversation, and each refusal is logged once


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_the_hook_keeps_refused_results_in_the_conversation(
    backend: tuple[str, dict[str, Any]], mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = _root(backend, Quota(session_results=3))
    store = root.for_session("acme", "chat-1")
    agent = make_agent({"after_tool": [OffloadHook({"fetch": OffloadOverChars(1000), "*": NeverOffload()})]})
    messages = [ChatMessage.from_user(plan_for("acme/chat-1", 3, 2))]
    with caplog.at_level(logging.WARNING):
        if mode == "sync":
            result = agent.run(messages, hook_context=offload_context(store))
        else:
            result = await agent.run_async(messages, hook_context=offload_context(store))

    assert result["messages"][-1].text == "acme/chat-1: finished after 3 steps"
    produced = originals("acme/chat-1", 3, 2)
    seen = []
    for message in tool_results(result):
        references = message.meta.get(OFFLOADED)
        seen.append(store.read(references[0]) if references else message.tool_call_result.result)  # type: ignore[union-attr]
    assert sorted(seen) == sorted(produced)  # every result, whole: offloaded or still in the conversation
    offloaded = [message for message in tool_results(result) if message.meta.get(OFFLOADED)]
    assert len(offloaded) == 3 == len(store.list())
    refusals = [record for record in caplog.records if "Quota exceeded" in record.getMessage()]
    assert len(refusals) == 3  # six large results, three refused: one record each
    assert all("tenant 'acme', session 'chat-1'" in record.getMessage() for record in refusals)


async def test_cancelled_writers_do_not_disturb_the_others(backend: tuple[str, dict[str, Any]]) -> None:
    # slack=0: every write after the first waits for the one in flight, so many writers wait on shared futures.
    session = _root(backend, Quota(session_results=5, slack=0)).for_session("acme", "chat-1")
    tasks = [asyncio.create_task(session.write_async(key=f"{i}.txt", content="x")) for i in range(20)]
    await asyncio.sleep(0)
    for task in tasks[1::2]:
        task.cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    kept = [outcome for task, outcome in zip(tasks, outcomes, strict=True) if not task.cancelled()]
    assert all(isinstance(outcome, str | QuotaExceededError) for outcome in kept), kept
    assert len(await session.list_async()) <= 5
    assert _stored([outcome for outcome in kept if not isinstance(outcome, asyncio.CancelledError)]) <= 5
    # The ledger still works afterwards: it fills up to the limit and refuses beyond.
    await _write_all(session, 10)
    assert len(await session.list_async()) == 5


# Session documents count too: history, approvals, audit


async def _turn(history: SessionHistory, text: str, reply_chars: int) -> None:
    turn = await history.begin(await history.read(), kind="message", text=text)
    # Random text: a history end is stored gzipped, and a reply of one letter repeated would take no room at all.
    reply = ChatMessage.from_assistant(f"{text}: " + base64.b64encode(os.urandom(reply_chars))[:reply_chars].decode())
    await history.finish(turn, status="completed", messages=[*turn.conversation, ChatMessage.from_user(text), reply])


async def test_history_counts_and_a_full_session_starts_no_new_turn(backend: tuple[str, dict[str, Any]]) -> None:
    root = _root(backend, Quota(session_bytes=30_000))
    session = root.for_session("acme", "chat-1")
    history = SessionHistory(session, worker="w")
    turns = 0
    with pytest.raises(QuotaExceededError) as caught:
        for number in range(1, 60):
            await _turn(history, f"question {number}", reply_chars=2_000)
            turns += 1
    error = caught.value
    assert (error.scope, error.limit, error.allowed) == ("session", "bytes", 30_000)
    assert "this document needs" in str(error)
    stored = usage(scan(root, tenant="acme", session="chat-1")).total
    # Within the limit plus what the last admitted turn wrote after its start (its end, and the head when it wrote
    # one: charged, never refused; the turn that writes a session's first head stores the whole conversation).
    documents = session.documents("history")
    after_start = len(documents.get(f"turn.{turns:08d}.end.json")) + 100
    assert 3 <= turns < 15 and stored.results == 0 and 30_000 - 5_000 < stored.document_bytes <= 30_000 + after_start
    state = await history.read()
    assert state.next_turn == turns + 1 and state.open_start is None  # the refused turn claimed nothing
    # The conversation's bytes leave no room for results either; another session has its own quota.
    with pytest.raises(QuotaExceededError):
        await session.write_async(key="r.txt", content="x" * 10)
    await _turn(SessionHistory(root.for_session("acme", "chat-2"), worker="w"), "hello", reply_chars=100)


async def test_a_tenant_cannot_pass_its_quota_by_opening_sessions(backend: tuple[str, dict[str, Any]]) -> None:
    root = _root(backend, Quota(tenant_bytes=20_000))
    opened = 0
    with pytest.raises(QuotaExceededError) as caught:
        for number in range(40):
            await _turn(SessionHistory(root.for_session("acme", f"chat-{number}"), worker="w"), "hi", 3_000)
            opened += 1
    assert (caught.value.scope, caught.value.session) == ("tenant", f"chat-{opened}")
    assert 3 <= opened < 10
    assert usage(scan(root, tenant="acme")).total.total_bytes <= 20_000 + 5_000
    await _turn(SessionHistory(root.for_session("globex", "chat-0"), worker="w"), "hi", 3_000)
    # Ending sessions frees the tenant's quota at once (this worker forgets its count).
    for number in range(opened):
        await end_session_async(root.for_session("acme", f"chat-{number}"), documents=True)
    await _turn(SessionHistory(root.for_session("acme", "chat-new"), worker="w"), "hi", 3_000)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_coordination_documents_are_charged_but_never_refused(
    backend: tuple[str, dict[str, Any]], mode: str
) -> None:
    root = _root(backend, Quota(session_bytes=1_000))
    session = root.for_session("acme", "chat-1")
    approvals, audit, history = (session.documents(name) for name in ("approvals", "audit", "history"))
    # Past the limit, a decision, a claim and an audit event are still written: refusing them could lose an approved
    # call, or the record that it ran.
    if mode == "sync":
        approvals.create("decision.x-0.json", b"d" * 800)
        approvals.create("claim.x-0.json", b"c" * 800)
        audit.put("event.json", b"e" * 800)
    else:
        await approvals.create_async("decision.x-0.json", b"d" * 800)
        await approvals.create_async("claim.x-0.json", b"c" * 800)
        await audit.put_async("event.json", b"e" * 800)
    assert approvals.list() == ["claim.x-0.json", "decision.x-0.json"] and audit.list() == ["event.json"]
    # They count: a write that may be refused is refused now, before anything is sent.
    with pytest.raises(QuotaExceededError, match="this document needs 2 more bytes"):
        if mode == "sync":
            history.create("turn.00000001.start.json", b"{}", enforce_quota=True)
        else:
            await history.create_async("turn.00000001.start.json", b"{}", enforce_quota=True)
    with pytest.raises(QuotaExceededError):
        history.put("notes.json", b"{}", enforce_quota=True)
    with pytest.raises(QuotaExceededError, match="this result needs"):
        session.write(key="r.txt", content="x")
    assert history.list() == []
    # Deleting the session's documents frees the quota at once.
    end_session(session, documents=True)
    history.create("turn.00000001.start.json", b"{}", enforce_quota=True)


def test_documents_count_in_another_workers_listing(backend: tuple[str, dict[str, Any]]) -> None:
    quota = Quota(session_bytes=1_000, tenant_bytes=1_500)
    _root(backend, quota).for_session("acme", "chat-1").documents("audit").put("event.json", b"e" * 900)
    other = _root(backend, quota)  # a second worker: it learns of the document from its listing only
    with pytest.raises(QuotaExceededError):
        other.for_session("acme", "chat-1").write(key="r.txt", content="x" * 200)
    other.for_session("acme", "chat-1").write(key="ok.txt", content="x" * 100)
    with pytest.raises(QuotaExceededError) as caught:
        other.for_session("acme", "chat-2").write(key="r.txt", content="x" * 600)
    assert caught.value.scope == "tenant"


@pytest.mark.s3
async def test_a_refused_turn_start_sends_nothing(s3_server: LocalS3Server, s3_requests: RequestLog) -> None:
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options=s3_server.storage_options(),
        quota=Quota(session_bytes=2_000),
    )
    history = SessionHistory(root.for_session("acme", "chat-1"), worker="w")
    await _turn(history, "hello", reply_chars=2_000)
    state = await history.read()
    s3_requests.clear()
    with pytest.raises(QuotaExceededError):
        await history.begin(state, kind="message", text="one more")
    assert s3_requests.count(method="PUT") == 0
