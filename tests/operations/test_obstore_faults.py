"""
The obstore engine under injected S3 faults: retried by the store's policy, conditional creates resolved by read-back.

The same proxy and moto server as test_retries.py. Where the counts differ from s3fs's, it is because nothing below
the store resends a request here (aiohttp resends an idempotent request once on a dropped connection; reqwest does
not), so every failed transmission is one retry the store counts.
"""

import uuid

import pytest
from ops_helpers import FAST_RETRY, Roots, proxied_options, retries_since

from haystack_integrations.offload import (
    CreateOutcomeUnknownError,
    DocumentExistsError,
    FsspecToolResultStore,
    ResultNotFoundError,
    StorageError,
    StorageUnavailableError,
)
from haystack_integrations.offload.stores.failures import StorageRequestError, transient_cause
from haystack_integrations.offload.stores.obstore_io import _mapped_errors
from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

pytestmark = pytest.mark.s3

# Per kind, injected twice on the next PUT: how many PUTs moto handles before the write succeeds, and the causes.
WRITE_OUTCOMES = {
    Fault.INTERNAL_ERROR: (1, {"HTTP 500 InternalError"}),
    Fault.SLOW_DOWN: (1, {"HTTP 503 SlowDown"}),
    Fault.RESET: (1, {"connection reset", "connection failed"}),
    Fault.RESET_AFTER: (3, {"connection reset", "connection failed"}),
    Fault.READ_TIMEOUT: (3, {"timeout"}),
}


@pytest.fixture
def obstore_roots(s3_server: LocalS3Server, fault_proxy: FaultProxy) -> Roots:
    """A fresh prefix on the obstore engine, through the proxy (retrying under `FAST_RETRY`), and directly."""
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    options = proxied_options(s3_server, fault_proxy)
    faulty = FsspecToolResultStore(url, storage_options=options, retry=FAST_RETRY, engine="obstore")
    direct = FsspecToolResultStore(url, storage_options=s3_server.storage_options(), engine="obstore")
    faulty.check_exclusive_creates().require()  # the probe first: scripted faults hit the requests a test makes
    fault_proxy.requests.clear()
    return Roots(faulty, direct)


@pytest.mark.parametrize("kind", list(WRITE_OUTCOMES))
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_write_survives_each_transient_fault_as_one_result(
    kind: Fault, mode: str, obstore_roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog
) -> None:
    handled, causes = WRITE_OUTCOMES[kind]
    session = obstore_roots.faulty.for_session("acme", "chat-1")
    s3_requests.clear()
    before = obstore_roots.faulty.retry_stats.as_dict()  # the fixture's probe is not this write
    fault_proxy.inject(kind, kind, method="PUT")
    if mode == "sync":
        reference = session.write(key="1_fetch_call_1.txt", content="the result")
    else:
        reference = await session.write_async(key="1_fetch_call_1.txt", content="the result")

    assert fault_proxy.requests.count(method="PUT") == 3  # two failed transmissions, no hidden resend, then success
    assert s3_requests.count(method="PUT") == handled
    assert {request.path for request in s3_requests.filter(method="PUT")} == {s3_requests.snapshot()[0].path}
    stored = obstore_roots.direct.for_session("acme", "chat-1")
    assert [record.reference for record in stored.list()] == [reference]
    assert stored.read(reference) == "the result"
    stats = retries_since(before, obstore_roots.faulty.retry_stats.as_dict())
    assert (stats["retries"], stats["recovered"], stats["gave_up"]) == (2, 1, 0)
    assert set(stats["causes"]) <= causes


@pytest.mark.parametrize("kind", [Fault.SLOW_DOWN, Fault.RESET_AFTER, Fault.READ_TIMEOUT])
async def test_reads_pages_and_listings_are_retried_too(
    kind: Fault, obstore_roots: Roots, fault_proxy: FaultProxy
) -> None:
    session = obstore_roots.faulty.for_session("acme", "chat-1")
    reference = await session.write_async(key="k.txt", content="0123456789" * 100)
    before = obstore_roots.faulty.retry_stats.as_dict()  # the fixture's probe and the write are not these reads
    fault_proxy.inject(kind, method="GET")
    assert await session.read_async(reference) == "0123456789" * 100
    fault_proxy.inject(kind, method="GET")
    assert session.read_range_and_size(reference, 10, 20) == (b"0123456789", 1000)
    fault_proxy.inject(kind, method="GET")
    assert await session.read_range_and_size_async(reference, 990, 2000) == (b"0123456789", 1000)
    fault_proxy.inject(kind, method="GET")
    assert [record.reference for record in session.list()] == [reference]
    stats = retries_since(before, obstore_roots.faulty.retry_stats.as_dict())
    assert (stats["retries"], stats["recovered"], stats["gave_up"]) == (4, 4, 0)


@pytest.mark.parametrize("kind", [Fault.RESET_AFTER, Fault.READ_TIMEOUT])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_conditional_create_whose_answer_was_lost_is_still_its_own(
    kind: Fault, mode: str, obstore_roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog
) -> None:
    claims = obstore_roots.faulty.for_session("acme", "chat-1").documents("claims")
    mine = b'{"token": "a1b2", "claimed_by": "worker-a"}'
    fault_proxy.inject(kind, method="PUT")
    s3_requests.clear()
    if mode == "sync":
        claims.create("call_1.json", mine)
    else:
        await claims.create_async("call_1.json", mine)
    # The first create landed and its answer was lost; the retry's If-None-Match met it (412), and the read-back found
    # this writer's own bytes: a success, not "another worker won".
    puts = s3_requests.filter(method="PUT")
    assert [(request.status, request.header("if-none-match")) for request in puts] == [(200, "*"), (412, "*")]
    assert s3_requests.count(method="GET") == 1
    assert obstore_roots.direct.for_session("acme", "chat-1").documents("claims").get("call_1.json") == mine
    # A real competitor still loses: its 412 is read back once and the bytes are not its own.
    s3_requests.clear()
    with pytest.raises(DocumentExistsError):
        await claims.create_async("call_1.json", b'{"claimed_by": "worker-b"}')
    assert s3_requests.count(method="GET") == 1


async def test_a_create_whose_outcome_cannot_be_read_back_is_retryable_not_lost(
    obstore_roots: Roots, fault_proxy: FaultProxy
) -> None:
    claims = obstore_roots.faulty.for_session("acme", "chat-1").documents("claims")
    mine = b'{"token": "c3d4", "claimed_by": "worker-a"}'
    fault_proxy.inject(Fault.RESET_AFTER, method="PUT")
    fault_proxy.inject(*[Fault.SLOW_DOWN] * FAST_RETRY.attempts, method="GET")
    with pytest.raises(CreateOutcomeUnknownError) as caught:
        claims.create("call_1.json", mine)
    assert not isinstance(caught.value, DocumentExistsError)
    await claims.create_async("call_1.json", mine)  # once storage answers, the same create is recognised as its own


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_persistent_failure_gives_up_after_the_policy_with_a_chained_error(
    mode: str, obstore_roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog
) -> None:
    session = obstore_roots.faulty.for_session("acme", "chat-1")
    fault_proxy.plan = FaultPlan(every=1, kinds=[Fault.SLOW_DOWN], methods=["PUT"])
    s3_requests.clear()
    with pytest.raises(StorageUnavailableError) as caught:
        if mode == "sync":
            session.write(key="k.txt", content="x")
        else:
            await session.write_async(key="k.txt", content="x")
    assert caught.value.causes == ("HTTP 503 SlowDown",) * 4
    assert "offload-results" not in str(caught.value)
    assert isinstance(caught.value.__cause__, StorageRequestError)  # the engine's classification, chained
    assert type(caught.value.__cause__.__cause__).__name__ == "GenericError"  # to obstore's own error
    assert fault_proxy.requests.count(method="PUT") == 4  # bounded at the wire: obstore's own retries are off
    assert s3_requests.count(method="PUT") == 0


async def test_failures_retrying_cannot_fix_are_not_retried(s3_server: LocalS3Server, fault_proxy: FaultProxy) -> None:
    options = proxied_options(s3_server, fault_proxy)
    missing_bucket = FsspecToolResultStore("s3://no-such-bucket/p", storage_options=options, engine="obstore")
    session = missing_bucket.for_session("acme", "chat-1")
    with pytest.raises(StorageError, match="does not exist") as caught:
        await session.write_async(key="k.txt", content="x")
    assert not isinstance(caught.value, StorageUnavailableError)
    with pytest.raises(StorageError, match="does not exist"):
        session.list()
    existing = FsspecToolResultStore(f"{s3_server.bucket_url}/nf", storage_options=options, engine="obstore")
    with pytest.raises(ResultNotFoundError):
        await existing.for_session("acme", "chat-1").read_async("20261129T213400123456Z-5f3a9c1e.t.search.k.txt")
    assert fault_proxy.requests.count(method="PUT") == 1
    assert fault_proxy.requests.count(method="GET") == 2
    assert missing_bucket.retry_stats.as_dict()["retries"] == existing.retry_stats.as_dict()["retries"] == 0


async def test_without_a_policy_obstore_keeps_its_own_retries(
    s3_server: LocalS3Server, fault_proxy: FaultProxy
) -> None:
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/backend-retries",
        storage_options=proxied_options(s3_server, fault_proxy),
        retry=None,
        engine="obstore",
    )
    session = store.for_session("acme", "chat-1")
    fault_proxy.inject(Fault.INTERNAL_ERROR, method="PUT")
    reference = await session.write_async(key="k.txt", content="x")  # object_store retried it
    assert store.retry_stats.as_dict() == {"retries": 0, "recovered": 0, "gave_up": 0, "causes": {}}
    assert fault_proxy.requests.count(method="PUT") == 2
    assert session.read(reference) == "x"


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (Fault.INTERNAL_ERROR, "HTTP 500 InternalError"),
        (Fault.SLOW_DOWN, "HTTP 503 SlowDown"),
        (Fault.RESET, "connection reset"),
        (Fault.READ_TIMEOUT, "timeout"),
    ],
)
def test_obstores_own_errors_are_told_transient(
    kind: Fault, expected: str, s3_server: LocalS3Server, fault_proxy: FaultProxy
) -> None:
    import obstore
    from obstore.store import S3Store

    options = s3_server.storage_options()
    raw = S3Store(
        s3_server.bucket,
        endpoint=fault_proxy.endpoint_url,
        access_key_id=options["key"],
        secret_access_key=options["secret"],
        region=options["client_kwargs"]["region_name"],
        client_options={"allow_http": True, "timeout": "1s"},
        retry_config={"max_retries": 0},
    )
    fault_proxy.inject(kind, method="PUT")
    with pytest.raises(obstore.exceptions.GenericError) as caught:  # what obstore raises for all of these
        obstore.put(raw, "classify/k.txt", b"x")
    with pytest.raises(StorageRequestError) as classified, _mapped_errors():  # as the engine classifies it
        raise caught.value
    assert (classified.value.cause, classified.value.transient) == (expected, True)
    assert transient_cause(classified.value) == expected
    with pytest.raises(FileNotFoundError) as missing, _mapped_errors():
        obstore.get(raw, "classify/missing.txt")
    assert transient_cause(missing.value) is None
