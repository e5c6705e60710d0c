"""
Retries of storage calls under injected S3 faults: what is retried, how often, what gets stored, and how it gives up.

Everything runs against moto's server over HTTP behind `FaultProxy`; ``roots.direct`` reads what really got stored.
"""

import asyncio
import errno
import pickle
import uuid

import pytest
from ops_helpers import FAST_RETRY, Roots, proxied_options, retries_since

from haystack_integrations.offload import (
    CreateOutcomeUnknownError,
    DocumentExistsError,
    FsspecToolResultStore,
    ResultNotFoundError,
    RetryPolicy,
    StorageError,
    StorageUnavailableError,
)
from haystack_integrations.offload.stores.failures import StorageRequestError, transient_cause
from haystack_integrations.offload.stores.s3fs_io import S3IO
from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

pytestmark = pytest.mark.s3

# Per kind, injected twice on the next PUT: how many PUTs moto handles before the write succeeds, and the retries the
# store counts. Resets are usually resent once by aiohttp below the store, so two resets make one retry here; under
# load, now and then aiohttp does not resend (seen: a few runs in many, depending on when the proxy's reset lands), and
# the store retries twice. Both are right; what must hold either way is one PUT handled and one stored result.
# A withheld answer ends in botocore's read timeout, or, if aiohttp never started that timer, in the attempt timeout.
WRITE_OUTCOMES = {
    Fault.INTERNAL_ERROR: (1, 2, {"HTTP 500 InternalError"}),
    Fault.SLOW_DOWN: (1, 2, {"HTTP 503 SlowDown"}),
    Fault.RESET: (1, (1, 2), {"connection failed"}),
    Fault.RESET_AFTER: (3, 1, {"connection failed"}),
    Fault.READ_TIMEOUT: (3, 2, {"read timeout", "timeout"}),
}


@pytest.mark.parametrize("kind", list(WRITE_OUTCOMES))
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_write_survives_each_transient_fault_as_one_result(
    kind: Fault, mode: str, roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog
) -> None:
    handled, retries, causes = WRITE_OUTCOMES[kind]
    session = roots.faulty.for_session("acme", "chat-1")
    s3_requests.clear()
    # Counted from here: the fixture's warm-up calls may have retried on a loaded machine, and are not this write's.
    before = roots.faulty.retry_stats.as_dict()
    fault_proxy.inject(kind, kind, method="PUT")
    if mode == "sync":
        reference = session.write(key="1_fetch_call_1.txt", content="the result")
    else:
        reference = await session.write_async(key="1_fetch_call_1.txt", content="the result")

    # Every attempt PUT the same name: ambiguous failures that landed were written over, never duplicated.
    assert s3_requests.count(method="PUT") == handled
    assert {request.path for request in s3_requests.filter(method="PUT")} == {s3_requests.snapshot()[0].path}
    stored = roots.direct.for_session("acme", "chat-1")
    assert [record.reference for record in stored.list()] == [reference]
    assert stored.read(reference) == "the result"
    stats = retries_since(before, roots.faulty.retry_stats.as_dict())
    allowed = retries if isinstance(retries, tuple) else (retries,)
    assert stats["retries"] in allowed and (stats["recovered"], stats["gave_up"]) == (1, 0), stats
    assert set(stats["causes"]) <= causes
    assert sum(stats["causes"].values()) == stats["retries"]


@pytest.mark.parametrize("kind", list(WRITE_OUTCOMES))
async def test_reads_pages_and_listings_are_retried_too(kind: Fault, roots: Roots, fault_proxy: FaultProxy) -> None:
    session = roots.faulty.for_session("acme", "chat-1")
    reference = await session.write_async(key="k.txt", content="0123456789" * 100)
    fault_proxy.inject(kind, method="GET")
    assert await session.read_async(reference) == "0123456789" * 100
    fault_proxy.inject(kind, method="GET")
    assert session.read_range_and_size(reference, 10, 20) == (b"0123456789", 1000)
    fault_proxy.inject(kind, method="GET")
    assert [record.reference for record in session.list()] == [reference]
    assert roots.faulty.retry_stats.as_dict()["gave_up"] == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_persistent_failure_gives_up_after_the_policy_with_a_chained_error(
    mode: str, roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog
) -> None:
    session = roots.faulty.for_session("acme", "chat-1")
    fault_proxy.plan = FaultPlan(every=1, kinds=[Fault.SLOW_DOWN], methods=["PUT"])
    s3_requests.clear()
    with pytest.raises(StorageUnavailableError) as caught:
        if mode == "sync":
            session.write(key="k.txt", content="x")
        else:
            await session.write_async(key="k.txt", content="x")

    error = caught.value
    assert isinstance(error, StorageError) and isinstance(error, OSError)
    assert error.attempts == FAST_RETRY.attempts == 4
    assert error.causes == ("HTTP 503 SlowDown",) * 4
    assert "gave up on a write after 4 attempt(s)" in str(error) and "SlowDown" in str(error)
    assert "offload-results" not in str(error)  # the message is safe to show: no bucket, no path
    assert error.__notes__ == [f"attempt {n}: HTTP 503 SlowDown" for n in range(1, 5)]
    # Chained to the engine's classification, then s3fs's error, then botocore's.
    assert isinstance(error.__cause__, StorageRequestError) and error.__cause__.status == 503
    assert isinstance(error.__cause__.__cause__, OSError) and error.__cause__.__cause__.errno == errno.EBUSY
    assert type(error.__cause__.__cause__.__cause__).__name__ == "ClientError"
    # Bounded at the wire: four requests, not botocore's 5 x s3fs's 5.
    assert fault_proxy.requests.count(method="PUT") == 4
    assert s3_requests.count(method="PUT") == 0
    assert roots.faulty.retry_stats.as_dict()["gave_up"] == 1
    assert roots.direct.for_session("acme", "chat-1").list() == []
    restored = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own error, round-tripped in the test
    assert (restored.attempts, restored.causes) == (4, error.causes)


async def test_dropped_connections_cost_at_most_two_requests_per_attempt(roots: Roots, fault_proxy: FaultProxy) -> None:
    session = roots.faulty.for_session("acme", "chat-1")
    fault_proxy.plan = FaultPlan(every=1, kinds=[Fault.RESET], methods=["PUT"])
    with pytest.raises(StorageUnavailableError) as caught:
        await session.write_async(key="k.txt", content="x")
    assert caught.value.attempts == 4
    assert fault_proxy.requests.count(method="PUT") == 8  # each attempt, and aiohttp's one resend of it


def test_making_the_client_does_not_count_against_a_sync_calls_first_attempt(
    s3_server: LocalS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A busy machine makes the first client slowly (here: s3fs's set_session delayed by 3 s, over the whole attempt
    # limit). A sync call runs on fsspec's loop with the filesystem's own client; making it is not part of an attempt.
    # The s3fs engine's own client set-up is what this is about, so the engine is named; the limit leaves a loaded
    # machine's LIST room (0.3 s was seen too short for obstore's LIST in CI, when the default engine served here).
    import s3fs

    original = s3fs.S3FileSystem.set_session

    async def slow_set_session(self: s3fs.S3FileSystem, *args: object, **kwargs: object) -> object:
        if self._s3 is None:
            await asyncio.sleep(3.0)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "set_session", slow_set_session)
    policy = RetryPolicy(attempts=1, attempt_timeout=2.0)
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options={**s3_server.storage_options(), "skip_instance_cache": True},
        retry=policy,
        engine="fsspec",
    ).for_session("acme", "chat-1")
    assert store.list() == []
    assert store.retry_stats.as_dict()["retries"] == 0


async def test_the_deadline_stops_new_attempts(s3_server: LocalS3Server, fault_proxy: FaultProxy) -> None:
    policy = RetryPolicy(attempts=10, base_delay=0.01, max_delay=0.01, deadline=0.3, attempt_timeout=1.0)
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/deadline", storage_options=proxied_options(s3_server, fault_proxy), retry=policy
    ).for_session("acme", "chat-1")
    store.list()
    fault_proxy.plan = FaultPlan(every=1, kinds=[Fault.READ_TIMEOUT], methods=["PUT"])
    with pytest.raises(StorageUnavailableError) as caught:
        await store.write_async(key="k.txt", content="x")
    assert caught.value.attempts == 1  # the first attempt alone outlasted the deadline
    assert caught.value.causes[0] in {"read timeout", "timeout"}


async def test_failures_retrying_cannot_fix_are_not_retried(
    s3_server: LocalS3Server, fault_proxy: FaultProxy, s3_requests: RequestLog
) -> None:
    options = proxied_options(s3_server, fault_proxy)
    missing_bucket = FsspecToolResultStore("s3://no-such-bucket/p", storage_options=options, retry=FAST_RETRY)
    session = missing_bucket.for_session("acme", "chat-1")
    with pytest.raises(StorageError, match="does not exist") as caught:
        await session.write_async(key="k.txt", content="x")
    assert not isinstance(caught.value, StorageUnavailableError)
    # Count this test's own requests only: the proxy is shared by every test of the worker.
    assert _sent(fault_proxy, "PUT", "/no-such-bucket/p/acme/chat-1/") == 1
    prefix = uuid.uuid4().hex
    existing = FsspecToolResultStore(f"{s3_server.bucket_url}/{prefix}", storage_options=options, retry=FAST_RETRY)
    with pytest.raises(ResultNotFoundError):
        existing.for_session("acme", "chat-1").read("20261129T213400123456Z-5f3a9c1e.t.search.k.txt")
    assert _sent(fault_proxy, "GET", f"/{prefix}/acme/chat-1/") == 1
    assert missing_bucket.retry_stats.as_dict()["retries"] == existing.retry_stats.as_dict()["retries"] == 0


@pytest.mark.parametrize("kind", [Fault.RESET_AFTER, Fault.READ_TIMEOUT])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_conditional_create_whose_answer_was_lost_is_still_its_own(
    kind: Fault, mode: str, roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog
) -> None:
    claims = roots.faulty.for_session("acme", "chat-1").documents("claims")
    mine = b'{"claimed_by": "worker-a", "at": "2026-11-29T21:34:00.123456Z"}'
    # reset-after twice: both transmissions (aiohttp resends once) create or find the claim, and the answer is lost.
    fault_proxy.inject(*([kind] * (2 if kind is Fault.RESET_AFTER else 1)), method="PUT")
    s3_requests.clear()
    if mode == "sync":
        claims.create("call_1.json", mine)
    else:
        await claims.create_async("call_1.json", mine)
    # The retry's If-None-Match found the document there, read it back, and recognised its own bytes.
    assert [request.status for request in s3_requests.filter(method="PUT")][-1] == 412
    assert s3_requests.count(method="GET") == 1
    direct = roots.direct.for_session("acme", "chat-1").documents("claims")
    assert direct.get("call_1.json") == mine
    # A real competitor still loses: its 412 is read back once and the bytes are not its own.
    s3_requests.clear()
    with pytest.raises(DocumentExistsError):
        await claims.create_async("call_1.json", b'{"claimed_by": "worker-b"}')
    assert s3_requests.count(method="GET") == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_one_reset_after_the_create_landed_is_not_taken_for_a_lost_race(
    mode: str, roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog
) -> None:
    # One reset after S3 stored the PUT: aiohttp resends it below the retry layer, and the resend's 412 is the first
    # answer the store sees. Reading back and finding its own token makes it a success, not "another worker won".
    claims = roots.faulty.for_session("acme", "chat-1").documents("claims")
    mine = b'{"token": "a1b2", "claimed_by": "worker-a"}'
    fault_proxy.inject(Fault.RESET_AFTER, method="PUT")
    s3_requests.clear()
    if mode == "sync":
        claims.create("call_1.json", mine)
    else:
        await claims.create_async("call_1.json", mine)
    assert [request.status for request in s3_requests.filter(method="PUT")] == [200, 412]
    assert roots.direct.for_session("acme", "chat-1").documents("claims").get("call_1.json") == mine


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_create_whose_outcome_cannot_be_read_back_is_retryable_not_lost(
    mode: str, roots: Roots, fault_proxy: FaultProxy
) -> None:
    claims = roots.faulty.for_session("acme", "chat-1").documents("claims")
    mine = b'{"token": "c3d4", "claimed_by": "worker-a"}'
    # The create lands but its answer is lost, and every read-back attempt fails too: nobody can tell whose it is.
    fault_proxy.inject(Fault.RESET_AFTER, method="PUT")
    fault_proxy.inject(*[Fault.SLOW_DOWN] * FAST_RETRY.attempts, method="GET")
    with pytest.raises(CreateOutcomeUnknownError) as caught:
        if mode == "sync":
            claims.create("call_1.json", mine)
        else:
            await claims.create_async("call_1.json", mine)
    assert not isinstance(caught.value, DocumentExistsError)
    assert isinstance(caught.value, StorageUnavailableError)
    # Retrying the same create, once storage answers, recognises it as its own.
    await claims.create_async("call_1.json", mine)


async def test_a_competitor_that_won_meanwhile_still_wins(
    roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog
) -> None:
    claims = roots.faulty.for_session("acme", "chat-1").documents("claims")
    await roots.direct.for_session("acme", "chat-1").documents("claims").create_async("call_1.json", b"worker-b")
    # Our first attempt fails, so the retry's 412 is checked against what is stored: another worker's bytes.
    fault_proxy.inject(Fault.SLOW_DOWN, method="PUT")
    s3_requests.clear()
    with pytest.raises(DocumentExistsError):
        await claims.create_async("call_1.json", b"worker-a")
    assert s3_requests.count(method="GET") == 1
    assert await claims.get_async("call_1.json") == b"worker-b"


@pytest.mark.slow
async def test_without_a_policy_the_backend_keeps_its_own_retries(
    s3_server: LocalS3Server, fault_proxy: FaultProxy, s3_requests: RequestLog
) -> None:
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/backend-retries", storage_options=proxied_options(s3_server, fault_proxy), retry=None
    )
    session = store.for_session("acme", "chat-1")
    session.list()
    fault_proxy.inject(Fault.INTERNAL_ERROR, method="PUT")
    reference = await session.write_async(key="k.txt", content="x")  # botocore retried it
    assert store.retry_stats.as_dict() == {"retries": 0, "recovered": 0, "gave_up": 0, "causes": {}}
    assert fault_proxy.requests.count(method="PUT") == 2
    assert session.read(reference) == "x"


def _cause(error: Exception) -> str | None:
    """What the s3fs engine makes of `error`: the cause a retry would log, or None when it is not transient."""
    import s3fs

    failure = S3IO(s3fs.S3FileSystem(anon=True, skip_instance_cache=True)).failure_of(error)
    return transient_cause(failure) if failure is not None else None


def test_transient_causes_are_told_from_permanent_failures() -> None:
    assert _cause(ConnectionResetError()) == "connection reset"
    assert _cause(TimeoutError()) == "timeout"
    try:
        try:
            raise ConnectionRefusedError("refused")
        except ConnectionRefusedError as low:
            raise OSError(errno.EIO, "wrapped") from low
    except OSError as wrapped:
        assert _cause(wrapped) == "connection failed"
    for permanent in (FileNotFoundError(), PermissionError(), FileExistsError(), ValueError(), OSError(errno.EIO, "?")):
        assert _cause(permanent) is None
    # A missing object stays permanent even if a timeout happened on the way (it is the last word).
    try:
        try:
            raise TimeoutError
        except TimeoutError:
            raise FileNotFoundError("gone") from None
    except FileNotFoundError as gone:
        assert _cause(gone) is None


def test_policies_are_validated_and_backoff_is_bounded() -> None:
    with pytest.raises(ValueError, match="max_delay"):
        RetryPolicy(base_delay=1.0, max_delay=0.5)
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError):
        RetryPolicy(attempt_timeout=0)
    policy = RetryPolicy(base_delay=0.1, max_delay=0.3)
    for retry, ceiling in ((1, 0.1), (2, 0.2), (3, 0.3), (10, 0.3)):
        assert all(0 <= policy.backoff(retry) <= ceiling for _ in range(50))


def _sent(proxy: FaultProxy, method: str, path_part: str) -> int:
    return sum(request.method == method and path_part in request.target for request in proxy.requests.snapshot())
