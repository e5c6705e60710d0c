"""
Retention on every backend: expired results are refused (clearly, the storage's clock deciding), left out of listings
and removed by ``purge(expired=True)``; writers' clocks that are wrong cost no fresh result; per-tenant overrides;
``purge(older_than=...)``; and `end_session`.
"""

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage
from ops_helpers import put_aged, state_for

from haystack_integrations.offload import (
    FsspecToolResultStore,
    ResultExpiredError,
    ResultNotFoundError,
    Retention,
    end_session,
    end_session_async,
    read_tool_result,
)
from haystack_integrations.offload.sessions import history as history_module
from haystack_integrations.offload.sessions.history import SessionHistory
from haystack_integrations.offload.stores.retention import activity_document_name
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

pytestmark = pytest.mark.real_s3  # also on the real S3 server's lane, both engines (tests/conftest.py)

WEEK = Retention(ttl=timedelta(days=7), tenants={"trial": timedelta(hours=1), "archive": None})
# Ages that pass during a test: the trial tenant's results expire 3 s (time to live plus skew) after the storage says
# they were written. The storage's clock decides, so an object cannot be made old by its name: it must be waited out.
BRIEF = Retention(
    ttl=timedelta(days=7), tenants={"trial": timedelta(seconds=2), "archive": None}, clock_skew=timedelta(seconds=1)
)
BRIEF_LIFE = timedelta(seconds=3)


def _outlive(life: timedelta = BRIEF_LIFE) -> None:
    """Wait until what was written before is `life` old by any clock here (the storage's is this machine's)."""
    time.sleep(life.total_seconds() + 0.2)


def _root(backend: tuple[str, dict[str, Any]], retention: Retention | None = WEEK) -> FsspecToolResultStore:
    url, storage_options = backend
    engine = getattr(backend, "store_kwargs", {})  # the real-S3 lane's rgw-obstore backend names its engine
    return FsspecToolResultStore(url, storage_options=storage_options, retention=retention, **engine)


@pytest.mark.slow  # waits out a time to live
async def test_an_expired_result_is_refused_by_every_read(backend: tuple[str, dict[str, Any]]) -> None:
    session = _root(backend, BRIEF).for_session("trial", "chat-1")
    old = session.write(key="old.txt", content="old news")
    _outlive()
    fresh = session.write(key="fresh.txt", content="today's news")
    reads = [
        lambda: session.read(old),
        lambda: session.read_range(old, 0, 3),
        lambda: session.read_range_and_size(old, 0, 3),
        lambda: session.info(old),
    ]
    for read in reads:
        with pytest.raises(ResultExpiredError) as caught:
            read()
        assert isinstance(caught.value, ResultNotFoundError) and isinstance(caught.value, FileNotFoundError)
        assert "has expired" in str(caught.value) and "2 seconds" in str(caught.value)
        assert "the storage says" in str(caught.value)
    with pytest.raises(ResultExpiredError):
        await session.read_async(old)
    with pytest.raises(ResultExpiredError):
        await session.read_range_and_size_async(old, 0, 3)
    assert session.read(fresh) == "today's news"
    assert [record.reference for record in session.list()] == [fresh]
    # Without retention the same object is an ordinary, readable result.
    assert _root(backend, retention=None).for_session("trial", "chat-1").read(old) == "old news"


@pytest.mark.slow  # waits out a time to live
def test_tenants_override_the_stores_time_to_live(backend: tuple[str, dict[str, Any]]) -> None:
    root = _root(backend, BRIEF)
    trial, acme, archive = (root.for_session(tenant, "chat-1") for tenant in ("trial", "acme", "archive"))
    written = {store.tenant: store.write(key="k.txt", content="3s") for store in (trial, acme)}
    ancient = put_aged(archive, age=timedelta(days=400), content="kept")
    _outlive()
    with pytest.raises(ResultExpiredError, match="2 seconds"):
        trial.read(written["trial"])
    assert acme.read(written["acme"]) == "3s"
    assert archive.read(ancient) == "kept"
    # The root store applies each tenant's own time to live to references that name the tenant.
    with pytest.raises(ResultExpiredError):
        root.read(f"trial/chat-1/{written['trial']}")
    assert root.read(f"acme/chat-1/{written['acme']}") == "3s"
    assert {record.reference.split("/")[0] for record in root.list()} == {"acme", "archive"}


@pytest.mark.slow  # waits out a time to live
async def test_purge_expired_removes_only_expired_results(backend: tuple[str, dict[str, Any]]) -> None:
    root = _root(backend, BRIEF)
    stale = root.for_session("trial", "chat-1")
    stale.write(key="a.txt", content="a")
    stale.write(key="b.txt", content="b")
    root.for_session("trial", "chat-9").write(key="d.txt", content="d")
    _outlive()
    keep = stale.write(key="c.txt", content="c")
    kept_long = put_aged(root.for_session("archive", "chat-1"), age=timedelta(days=999), content="e")
    acme = root.for_session("acme", "chat-1").write(key="f.txt", content="f")
    stale.documents("audit").put("0001.json", b"{}")

    assert await root.purge_async(expired=True) == 3
    assert root.purge(expired=True) == 0
    assert [record.reference for record in stale.list()] == [keep]
    assert root.for_session("archive", "chat-1").read(kept_long) == "e"
    assert root.for_session("acme", "chat-1").read(acme) == "f"
    assert stale.documents("audit").list() == ["0001.json"]  # documents are not results
    assert stale.read(keep) == "c"


@pytest.mark.slow  # waits out a time to live
def test_purge_older_than_ignores_retention(backend: tuple[str, dict[str, Any]]) -> None:
    root = _root(backend, retention=None)
    session = root.for_session("acme", "chat-1")
    session.write(key="old.txt", content="old")
    _outlive()
    recent = session.write(key="recent.txt", content="recent")
    assert root.for_tenant("acme").purge(older_than=BRIEF_LIFE) == 1
    assert [record.reference for record in session.list()] == [recent]
    with pytest.raises(ValueError, match="not both"):
        root.purge(older_than=timedelta(days=1), expired=True)
    with pytest.raises(ValueError, match="positive"):
        root.purge(older_than=timedelta(0))
    with pytest.raises(ValueError, match="no retention"):
        root.purge(expired=True)


@pytest.mark.slow  # waits out a time to live
def test_the_model_is_told_the_result_expired(backend: tuple[str, dict[str, Any]]) -> None:
    session = _root(backend, BRIEF).for_session("trial", "chat-1")
    old = session.write(key="old.txt", content="old news")
    _outlive()
    reply = read_tool_result.invoke(state=state_for(session), reference=old)
    assert isinstance(reply, str) and reply.startswith("Error")
    assert "has expired" in reply and "kept for 2 seconds" in reply and "no longer be read" in reply


@pytest.mark.s3
@pytest.mark.slow  # waits out a time to live
def test_an_expired_read_costs_one_head_and_reads_nothing(s3_server: LocalS3Server, s3_requests: RequestLog) -> None:
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    session = FsspecToolResultStore(url, storage_options=s3_server.storage_options(), retention=BRIEF).for_session(
        "trial", "chat-1"
    )
    old = session.write(key="old.txt", content="old news")
    fresh = session.write(key="fresh.txt", content="new news")
    _outlive()
    s3_requests.clear()
    with pytest.raises(ResultExpiredError):
        session.read(old)
    assert [request.method for request in s3_requests] == ["HEAD"]
    # A live result's name settles it: its read is one GET, as without retention.
    session = FsspecToolResultStore(url, storage_options=s3_server.storage_options(), retention=WEEK).for_session(
        "trial", "chat-1"
    )
    s3_requests.clear()
    assert session.read(fresh) == "new news"
    assert [request.method for request in s3_requests] == ["GET"]


async def test_end_session_deletes_the_sessions_results(backend: tuple[str, dict[str, Any]]) -> None:
    root = _root(backend, retention=None)
    ended, other = root.for_session("acme", "chat-1"), root.for_session("acme", "chat-2")
    for i in range(3):
        ended.write(key=f"{i}.txt", content=str(i))
    survivor = other.write(key="k.txt", content="mine")
    ended.documents("approvals").put("request.json", b"{}")
    other.documents("approvals").put("request.json", b"{}")

    assert end_session(ended) == 3
    assert ended.list() == []
    assert ended.documents("approvals").list() == ["request.json"]  # kept by default
    assert await end_session_async(ended, documents=True) == 1
    assert ended.documents("approvals").list() == []
    assert other.read(survivor) == "mine"
    assert other.documents("approvals").list() == ["request.json"]
    with pytest.raises(ValueError, match="session store"):
        end_session(root.for_tenant("acme"))


def test_retention_validation() -> None:
    with pytest.raises(ValueError, match="positive"):
        Retention(ttl=timedelta(0))
    with pytest.raises(ValueError, match="positive"):
        Retention(tenants={"acme": timedelta(seconds=-1)})
    with pytest.raises(ValueError, match="tenant"):
        Retention(tenants={"../x": timedelta(days=1)})
    retention = Retention(ttl=timedelta(days=1), tenants={"acme": None})
    assert retention.ttl_for("acme") is None and retention.ttl_for("globex") == timedelta(days=1)
    assert Retention.model_validate_json(retention.model_dump_json()) == retention


# Session documents go by whole sessions: those inactive past the cutoff, never a live conversation's old turns


async def _talk(
    store: FsspecToolResultStore, monkeypatch: pytest.MonkeyPatch, *, age: timedelta, turns: int
) -> list[ChatMessage]:
    """Run `turns` history turns in `store`'s session as if it were `age` ago; return the conversation."""
    history = SessionHistory(store, worker="w")
    with monkeypatch.context() as patch:
        patch.setattr(history_module, "_now", lambda: datetime.now(UTC) - age)
        for _ in range(turns):
            turn = await history.begin(await history.read(), kind="message", text="question")
            number = len(turn.conversation) // 2
            added = [ChatMessage.from_user(f"question {number}"), ChatMessage.from_assistant(f"answer {number}")]
            await history.finish(turn, status="completed", messages=[*turn.conversation, *added])
    return (await history.read()).conversation


def _stamp(age: timedelta) -> str:
    return f"{(datetime.now(UTC) - age).strftime('%Y%m%dT%H%M%S%f')}Z"


def _documents(store: FsspecToolResultStore) -> dict[str, list[str]]:
    return {namespace: store.documents(namespace).list() for namespace in ("history", "approvals", "audit")}


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_purge_older_than_takes_inactive_sessions_whole_and_keeps_live_ones(
    backend: tuple[str, dict[str, Any]], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _root(backend, retention=None)
    old, live, approvals_only, undated, audited = (
        root.for_session("acme", name) for name in ("old", "live", "approvals-only", "undated", "audited")
    )
    forty_days = timedelta(days=40)
    # An old session: history, an audit event, a held step and a remembered approval, all 40 days old; and a result
    # whose name says 40 days too, but which the storage says was written just now (its writer's clock was behind).
    await _talk(old, monkeypatch, age=forty_days, turns=2)
    slow_clocks_result = put_aged(old, age=forty_days, content="old result")
    old.documents("audit").put(f"{_stamp(forty_days)}-000000000001-0b7d2e11.json", b"{}")
    old.documents("approvals").put("step.00000001.json", b"{}")
    old.documents("approvals").put("memory.0123abcd.json", b"{}")
    # A live session whose early turns are as old: its conversation must survive whole.
    await _talk(live, monkeypatch, age=forty_days, turns=3)
    conversation = await _talk(live, monkeypatch, age=timedelta(minutes=5), turns=1)
    # Approval records (numbered) and the audit event that dates them, 40 days old: they go too.
    approvals_only.documents("approvals").put("step.00000001.json", b"{}")
    approvals_only.documents("audit").put(f"{_stamp(forty_days)}-000000000001-0b7d2e11.json", b"{}")
    # Nothing tells this session's age (numbered records only): it is kept.
    undated.documents("approvals").put("step.00000001.json", b"{}")
    undated.documents("approvals").put("memory.0123abcd.json", b"{}")
    # Old history, but an audit event from today: active, so kept (its names tell, nothing needs reading).
    await _talk(audited, monkeypatch, age=forty_days, turns=1)
    audited.documents("audit").put(f"{_stamp(timedelta(hours=1))}-000000000001-0b7d2e11.json", b"{}")

    tenant = root.for_tenant("acme")
    if mode == "sync":
        deleted = tenant.purge(older_than=timedelta(days=30))
    else:
        deleted = await tenant.purge_async(older_than=timedelta(days=30))

    # old: 4 history documents (no head: a session writes one at its tenth turn), 1 audit event, 2 approval records;
    # approvals-only: 2. Results go by their own age.
    assert deleted == 7 + 2
    assert _documents(old) == {"history": [], "approvals": [], "audit": []}
    assert [record.reference for record in old.list()] == [slow_clocks_result]
    assert _documents(approvals_only) == {"history": [], "approvals": [], "audit": []}
    assert len(live.documents("history").list()) == 8  # four turns' starts and ends
    assert (await SessionHistory(live, worker="reader").read()).conversation == conversation
    assert len(conversation) == 8
    assert undated.documents("approvals").list() == ["memory.0123abcd.json", "step.00000001.json"]
    assert len(audited.documents("history").list()) == 2 and len(audited.documents("audit").list()) == 1
    assert tenant.purge(older_than=timedelta(days=30)) == 0


async def test_purge_expired_takes_sessions_inactive_past_their_tenants_retention(
    backend: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _root(backend)  # 7 days; trial: 1 hour; archive: kept
    stale, recent = root.for_session("acme", "stale"), root.for_session("acme", "recent")
    trial, archive = root.for_session("trial", "chat-1"), root.for_session("archive", "chat-1")
    await _talk(stale, monkeypatch, age=timedelta(days=8), turns=2)
    kept = await _talk(recent, monkeypatch, age=timedelta(days=2), turns=2)
    await _talk(trial, monkeypatch, age=timedelta(hours=2), turns=1)
    await _talk(archive, monkeypatch, age=timedelta(days=400), turns=1)

    assert await root.purge_async(expired=True) == 6  # turns' starts and ends (no heads before a tenth turn)
    assert stale.documents("history").list() == [] and trial.documents("history").list() == []
    assert (await SessionHistory(recent, worker="reader").read()).conversation == kept
    assert len(archive.documents("history").list()) == 2
    assert root.purge(expired=True) == 0
    # A session store purges its own documents the same way.
    await _talk(stale, monkeypatch, age=timedelta(days=9), turns=1)
    assert stale.purge(expired=True) == 2 and stale.documents("history").list() == []


async def test_a_running_turn_keeps_an_old_session(
    backend: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _root(backend, retention=None)
    session = root.for_session("acme", "chat-1")
    conversation = await _talk(session, monkeypatch, age=timedelta(days=40), turns=2)
    history = SessionHistory(session, worker="w")
    turn = await history.begin(await history.read(), kind="message", text="a question, just now")
    assert root.purge(older_than=timedelta(days=30)) == 0  # the newest turn started minutes ago
    await history.finish(turn, status="completed", messages=[*conversation, ChatMessage.from_user("now")])
    assert (await history.read()).conversation == [*conversation, ChatMessage.from_user("now")]


async def test_a_time_stamped_far_ahead_does_not_keep_an_old_session_for_ever(
    backend: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A writer whose clock ran 50 years ahead (or a planted name) left one audit event and one result. Believed, they
    # would make the session look active until 2076; a time further ahead than the cutoff is behind now says nothing.
    root = _root(backend, retention=None)
    old, skewed = root.for_session("acme", "old"), root.for_session("acme", "skewed")
    await _talk(old, monkeypatch, age=timedelta(days=40), turns=1)
    old.documents("audit").put(f"{_stamp(-timedelta(days=50 * 365))}-000000000001-0b7d2e11.json", b"{}")
    put_aged(old, age=-timedelta(days=50 * 365), content="from the future")
    # A clock only a few hours fast is believed: this session is active, and kept.
    await _talk(skewed, monkeypatch, age=timedelta(days=40), turns=1)
    skewed.documents("audit").put(f"{_stamp(-timedelta(hours=3))}-000000000001-0b7d2e11.json", b"{}")

    assert await root.for_tenant("acme").purge_async(older_than=timedelta(days=30)) == 2 + 1
    assert _documents(old) == {"history": [], "approvals": [], "audit": []}
    assert len(old.list()) == 1  # the result itself is not older than 30 days by its name: results go by their own age
    assert len(skewed.documents("history").list()) == 2 and len(skewed.documents("audit").list()) == 1


def _activity(store: FsspecToolResultStore, namespace: str, name: str, age: timedelta) -> None:
    ended = (datetime.now(UTC) - age).isoformat()
    store.documents(namespace).put(name, f'{{"ended_at": "{ended}"}}'.encode())


def test_any_series_of_activity_documents_dates_its_session(backend: tuple[str, dict[str, Any]]) -> None:
    # Retention knows the convention (`activity_document_name`), not who keeps the series: an application's own
    # numbered documents date a session as the history's turns do, and each series' newest document is read.
    root = _root(backend, retention=None)
    idle, busy = root.for_session("acme", "idle"), root.for_session("acme", "busy")
    _activity(idle, "orders", "batch.00000002.end.json", age=timedelta(days=40))
    _activity(idle, "orders", "batch.00000001.end.json", age=timedelta(days=41))
    # The history went quiet 40 days ago, but the application's series ended an hour ago: the session is active.
    _activity(busy, "history", "turn.00000009.end.json", age=timedelta(days=40))
    _activity(busy, "orders", "batch.00000003.end.json", age=timedelta(hours=1))

    assert root.for_tenant("acme").purge(older_than=timedelta(days=30)) == 2
    assert idle.documents("orders").list() == []
    assert busy.documents("history").list() == ["turn.00000009.end.json"]
    assert busy.documents("orders").list() == ["batch.00000003.end.json"]


@pytest.mark.parametrize(("series", "number", "part"), [("Turn", 1, "end"), ("turn", -1, "end"), ("turn", 1, "stop")])
def test_an_activity_document_name_retention_would_not_read_is_refused(series: str, number: int, part: str) -> None:
    with pytest.raises(ValueError, match="Not an activity document"):
        activity_document_name(series, number, part)
