"""
Exclusive creates on real answers: the probe's verdicts, AWS's 409 conflict retried, a store that ignores or refuses
conditional writes refused before anything is coordinated; on moto and, in the real-S3 lane, on Ceph RGW.
"""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from haystack_integrations.offload import (
    DocumentExistsError,
    ExclusiveCreatesUnsupportedError,
    FsspecToolResultStore,
    RetryPolicy,
    StorageUnavailableError,
    end_session,
)
from haystack_integrations.offload.stores.names import new_temporary_name
from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy

ENGINES = pytest.mark.parametrize("engine", ["fsspec", "obstore"])
ONE_ATTEMPT = RetryPolicy(attempts=1)


def _root(server: Any, engine: str, endpoint: str | None = None, **kwargs: Any) -> FsspecToolResultStore:
    options = {**server.storage_options(), **({"endpoint_url": endpoint} if endpoint else {})}
    return FsspecToolResultStore(
        f"{server.bucket_url}/{uuid.uuid4().hex}", storage_options=options, engine=engine, **kwargs
    )


def _keys(server: Any, store: FsspecToolResultStore) -> list[str]:
    bucket, _, prefix = store._handle.root_path().partition("/")
    listed = server.client().list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return [item["Key"] for item in listed.get("Contents", [])]


@ENGINES
def test_a_backend_that_refuses_the_second_create_is_enforced_and_the_probe_leaves_nothing(
    s3_endpoint: Any, engine: str
) -> None:
    root = _root(s3_endpoint, engine)
    session = root.for_session("acme", "chat-1")
    check = session.check_exclusive_creates()
    assert (check.verdict, check.enforced) == ("enforced", True)
    assert _keys(s3_endpoint, root) == []  # the probe key is gone
    claims = session.documents("claims")
    claims.create("call_1", b"mine")
    with pytest.raises(DocumentExistsError):  # a 412 by its status, whatever the body names (RGW names nothing)
        claims.create("call_1", b"theirs")
    assert claims.get("call_1") == b"mine"
    assert session.list() == [] and claims.list() == ["call_1"]


@pytest.mark.s3
@ENGINES
async def test_a_store_that_ignores_if_none_match_coordinates_nothing_and_still_offloads(
    s3_server: Any, engine: str
) -> None:
    with FaultProxy(s3_server.endpoint_url, ignore_conditional_writes=True) as proxy:
        root = _root(s3_server, engine, proxy.endpoint_url)
        session = root.for_session("acme", "chat-1")
        with pytest.raises(ExclusiveCreatesUnsupportedError) as refused:
            await session.documents("claims").create_async("call_1", b"mine")
        assert "accepted a second exclusive create" in str(refused.value)
        assert root.url in refused.value.store and "If-None-Match" in refused.value.reason
        assert len(proxy.stripped.snapshot()) >= 2  # the probe's two creates really went without the condition
        # The verdict is kept: a second create is refused with no request at all.
        sent = len(proxy.requests.snapshot())
        with pytest.raises(ExclusiveCreatesUnsupportedError):
            session.documents("claims").create("call_2", b"mine")
        assert len(proxy.requests.snapshot()) == sent
        assert await session.documents("claims").list_async() == []
        reference = await session.write_async(key="1_search_call_1.txt", content="offloading still works")
        assert await session.read_async(reference) == "offloading still works"
    assert [key.rsplit("/", 1)[1] for key in _keys(s3_server, root)] == [reference]


@pytest.mark.s3
@ENGINES
def test_a_store_that_answers_501_to_conditional_writes_is_unsupported(s3_server: Any, engine: str) -> None:
    with FaultProxy(s3_server.endpoint_url) as proxy:
        root = _root(s3_server, engine, proxy.endpoint_url)
        proxy.inject(Fault.NOT_IMPLEMENTED, method="PUT")
        check = root.check_exclusive_creates()
        assert check.verdict == "unsupported" and "501" in check.detail
        with pytest.raises(ExclusiveCreatesUnsupportedError):
            check.require()
        assert proxy.faults.counts() == {Fault.NOT_IMPLEMENTED: 1}


@pytest.mark.s3
@ENGINES
def test_a_probe_that_fails_transiently_says_unknown_and_is_asked_again(s3_server: Any, engine: str) -> None:
    with FaultProxy(s3_server.endpoint_url) as proxy:
        root = _root(s3_server, engine, proxy.endpoint_url, retry=ONE_ATTEMPT)
        proxy.inject(Fault.SLOW_DOWN, method="PUT")
        check = root.check_exclusive_creates()
        assert check.verdict == "unknown"
        with pytest.raises(StorageUnavailableError) as unknown:
            check.require()
        assert not isinstance(unknown.value, ExclusiveCreatesUnsupportedError)
        assert "retry" in str(unknown.value)
        # Not kept: the next create probes again, and this time the store answers.
        root.for_session("acme", "chat-1").documents("claims").create("call_1", b"mine")
        assert root.check_exclusive_creates().enforced
        assert proxy.faults.counts() == {Fault.SLOW_DOWN: 1}


@ENGINES
def test_a_409_conflict_on_a_conditional_create_is_retried_until_it_lands_once(s3_endpoint: Any, engine: str) -> None:
    # AWS answers 409 ConditionalRequestConflict while a competing write is in flight; here every key's first one.
    with FaultProxy(s3_endpoint.endpoint_url, plan=FaultPlan(conflict_first_conditional_put=True)) as proxy:
        root = _root(s3_endpoint, engine, proxy.endpoint_url)
        claims = root.for_session("acme", "chat-1").documents("claims")
        claims.create("call_1", b"mine")
        with pytest.raises(DocumentExistsError):
            claims.create("call_1", b"theirs")
        assert claims.get("call_1") == b"mine"
        conflicts = proxy.faults.counts()[Fault.CONFLICT]
    assert conflicts == 2  # the probe's key and the claim's, once each
    stats = root.retry_stats.as_dict()
    assert stats["causes"] == {"HTTP 409 ConditionalRequestConflict": 2} and stats["gave_up"] == 0


@ENGINES
def test_a_killed_probes_key_goes_with_the_next_purge_after_minutes_not_an_hour(s3_endpoint: Any, engine: str) -> None:
    # A prober killed between its creates and its delete leaves its key, at the root or in a scope. Object stores write
    # no temporary files of their own, so any such key is a probe's: a purge takes it once no probe can still run.
    root = _root(s3_endpoint, engine)
    session = root.for_session("acme", "chat-1")
    session.write(key="k.txt", content="kept")
    bucket, _, prefix = root._handle.root_path().partition("/")
    twenty_minutes_ago = datetime.now(UTC) - timedelta(minutes=20)
    left = [f"{prefix}/{new_temporary_name(now=twenty_minutes_ago)}"]
    left.append(f"{prefix}/acme/chat-1/{new_temporary_name(now=twenty_minutes_ago)}")
    running = f"{prefix}/acme/chat-1/{new_temporary_name()}"
    for key in [*left, running]:
        s3_endpoint.client().put_object(Bucket=bucket, Key=key, Body=b"probe")

    assert root.purge(older_than=timedelta(days=1)) == 0  # no result or document goes; the probes' keys are not counted
    keys = _keys(s3_endpoint, root)
    assert not set(left) & set(keys)
    assert running in keys and len(session.list()) == 1
    end_session(session)  # ending a session takes its results, never a key a probe may be using now
    assert running in _keys(s3_endpoint, root)
