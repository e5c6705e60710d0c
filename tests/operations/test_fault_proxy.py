"""
`FaultProxy` and `FaultPlan`: which requests fail, and what each fault kind does at the wire, seen from both ends.

The client is a store with a single attempt (`RetryPolicy(attempts=1)`), so what the proxy does reaches the test;
moto's own request log says whether the server ever handled the request.
"""

import uuid

import pytest
from ops_helpers import proxied_options

from haystack_integrations.offload import FsspecToolResultStore, RetryPolicy, StorageError, StorageUnavailableError
from haystack_integrations.offload.testing.faults import AMBIGUOUS_FAULTS, Fault, FaultPlan, FaultProxy
from haystack_integrations.offload.testing.latency_proxy import ProxiedRequest
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

# One attempt, cut off before the proxy's 5 s hold ends, so a withheld answer always fails the attempt.
ONE_ATTEMPT = RetryPolicy(attempts=1, attempt_timeout=3.0)  # room for a loaded machine (CI runs tests in parallel)


def _request(method: str = "PUT") -> ProxiedRequest:
    return ProxiedRequest(method, "/bucket/key", 1, 0.0)


def test_every_gives_an_exact_share_cycling_through_the_kinds() -> None:
    plan = FaultPlan(every=10, kinds=[Fault.SLOW_DOWN, Fault.RESET])
    decisions = [plan.decide(_request()) for _ in range(100)]
    assert [kind for kind in decisions if kind is not None] == [Fault.SLOW_DOWN, Fault.RESET] * 5
    assert [i for i, kind in enumerate(decisions) if kind is not None] == list(range(9, 100, 10))


def test_rate_is_reproducible_from_the_seed_and_near_the_share() -> None:
    def draw(seed: int) -> list[Fault | None]:
        plan = FaultPlan(rate=0.1, seed=seed)
        return [plan.decide(_request()) for _ in range(2000)]

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)
    failed = sum(kind is not None for kind in draw(3))
    assert 140 <= failed <= 260  # 10% of 2000, far inside any plausible spread
    assert {kind for kind in draw(3) if kind is not None} == set(Fault)


def test_methods_and_scripts_choose_which_requests_fail() -> None:
    plan = FaultPlan(every=1, methods=["put"])
    assert plan.decide(_request("GET")) is None
    assert plan.decide(_request("PUT")) is not None
    scripted = FaultPlan()
    scripted.script(Fault.SLOW_DOWN, "timeout", method="PUT")
    assert scripted.decide(_request("GET")) is None
    assert scripted.decide(_request("PUT")) is Fault.SLOW_DOWN
    assert scripted.decide(_request("PUT")) is Fault.READ_TIMEOUT
    assert scripted.decide(_request("PUT")) is None


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        FaultPlan(rate=1.5)
    with pytest.raises(ValueError, match="not both"):
        FaultPlan(rate=0.1, every=10)
    with pytest.raises(ValueError, match="not both"):
        FaultPlan(every=0)
    with pytest.raises(ValueError, match="at least one"):
        FaultPlan(kinds=[])
    with pytest.raises(ValueError):
        FaultPlan(kinds=["418"])
    with pytest.raises(ValueError, match="negative"):
        FaultProxy("http://127.0.0.1:9", slow_seconds=-1)


# At the wire: (faults injected on the next PUTs, whether the write fails, PUTs moto handled, whether it stored).
# aiohttp resends an idempotent request once when its connection drops, so a reset must happen twice to be seen.
WIRE = {
    Fault.INTERNAL_ERROR: ([Fault.INTERNAL_ERROR], True, 0, False),
    Fault.SLOW_DOWN: ([Fault.SLOW_DOWN], True, 0, False),
    Fault.RESET: ([Fault.RESET, Fault.RESET], True, 0, False),
    Fault.RESET_AFTER: ([Fault.RESET_AFTER, Fault.RESET_AFTER], True, 2, True),
    Fault.READ_TIMEOUT: ([Fault.READ_TIMEOUT], True, 1, True),
    Fault.SLOW: ([Fault.SLOW], False, 1, True),
}


@pytest.mark.s3
@pytest.mark.parametrize("kind", list(Fault))
def test_each_fault_at_the_wire(
    kind: Fault, s3_server: LocalS3Server, s3_requests: RequestLog, fault_proxy: FaultProxy
) -> None:
    injected, fails, handled, stored = WIRE[kind]
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    once = FsspecToolResultStore(
        url, storage_options=proxied_options(s3_server, fault_proxy), retry=ONE_ATTEMPT
    ).for_session("acme", "chat-1")
    once.list()  # open the client with one real request
    direct = FsspecToolResultStore(url, storage_options=s3_server.storage_options()).for_session("acme", "chat-1")
    s3_requests.clear()

    fault_proxy.inject(*injected, method="PUT")
    if fails:
        with pytest.raises(StorageUnavailableError) as caught:
            once.write(key="k.txt", content="payload")
        assert caught.value.attempts == 1
    else:
        once.write(key="k.txt", content="payload")
    assert s3_requests.count(method="PUT") == handled
    assert [record.size for record in direct.list()] == ([7] if stored else [])
    assert fault_proxy.faults.counts() == {kind: len(injected)}
    assert (kind in AMBIGUOUS_FAULTS) == (fails and stored)


@pytest.mark.s3
def test_one_reset_is_resent_by_aiohttp_below_the_store(
    s3_server: LocalS3Server, s3_requests: RequestLog, fault_proxy: FaultProxy
) -> None:
    once = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options=proxied_options(s3_server, fault_proxy),
        retry=ONE_ATTEMPT,
    ).for_session("acme", "chat-1")
    once.list()
    fault_proxy.requests.clear()
    s3_requests.clear()
    fault_proxy.inject(Fault.RESET, method="PUT")
    reference = once.write(key="k.txt", content="payload")
    assert fault_proxy.requests.count(method="PUT") == 2  # the reset one, and aiohttp's resend
    assert s3_requests.count(method="PUT") == 1
    assert once.retry_stats.as_dict()["retries"] == 0
    assert once.read(reference) == "payload"


@pytest.mark.s3
def test_errors_reach_get_and_head_too_and_big_bodies_pass_intact(
    s3_server: LocalS3Server, fault_proxy: FaultProxy
) -> None:
    once = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options=proxied_options(s3_server, fault_proxy),
        retry=ONE_ATTEMPT,
    ).for_session("acme", "chat-1")
    content = bytes(range(256)) * 20_000  # 5 MB each way
    reference = once.write(key="big.bin", content=content)
    assert once.read(reference) == content
    fault_proxy.inject(Fault.SLOW_DOWN, method="GET")
    with pytest.raises(StorageError, match="SlowDown"):
        once.read(reference)
    fault_proxy.inject(Fault.INTERNAL_ERROR, method="HEAD")
    with pytest.raises(StorageError, match="HTTP 500"):
        once.info(reference)
    assert once.read(reference) == content
