"""
The storage-request metrics under injected S3 faults, checked against what happened outside the library: the faults
the proxy logged and the requests moto's server logged, never against the store's own counters.
"""

import pytest
from ops_helpers import Roots

from haystack_integrations.offload import ResultNotFoundError, StorageUnavailableError
from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy
from haystack_integrations.offload.testing.local_s3 import RequestLog
from metric_readings import MetricReadings

pytestmark = pytest.mark.s3

REQUESTS = "offload.storage.requests"
RETRIES = "offload.storage.retries"
DURATION = "offload.storage.request.duration"


async def test_a_write_that_recovers_counts_one_retried_request_and_each_injected_fault(
    roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog, metric_readings: MetricReadings
) -> None:
    session = roots.faulty.for_session("acme", "chat-1")
    s3_requests.clear()
    fault_proxy.inject(Fault.SLOW_DOWN, Fault.INTERNAL_ERROR, method="PUT")

    await session.write_async(key="1_fetch_call_1.txt", content="the result")

    injected = fault_proxy.faults.counts()
    assert sum(injected.values()) == 2
    assert metric_readings.added(RETRIES, offload__operation="put") == sum(injected.values())
    assert metric_readings.added(RETRIES, offload__cause="HTTP 503 SlowDown") == injected[Fault.SLOW_DOWN]
    assert metric_readings.added(RETRIES, offload__cause="HTTP 500 InternalError") == injected[Fault.INTERNAL_ERROR]
    # One call, counted once, although three attempts were sent: the one that reached moto succeeded.
    assert s3_requests.count(method="PUT") == 1
    assert metric_readings.added(REQUESTS, offload__operation="put") == 1
    assert metric_readings.added(REQUESTS, offload__operation="put", offload__outcome="retried") == 1
    assert metric_readings.recorded(DURATION, offload__operation="put", offload__outcome="retried")[0] == 1


async def test_every_call_that_reached_s3_is_counted_once(
    roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog, metric_readings: MetricReadings
) -> None:
    session = roots.faulty.for_session("acme", "chat-2")
    s3_requests.clear()
    references = [await session.write_async(key=f"{n}.txt", content="x" * 100) for n in range(3)]
    for reference in references:
        await session.read_range_async(reference, 0, 10)

    assert fault_proxy.faults.counts() == {}
    assert metric_readings.added(REQUESTS, offload__operation="put", offload__outcome="ok") == s3_requests.count(
        method="PUT"
    )
    ranged_gets = [request for request in s3_requests.filter(method="GET") if request.range is not None]
    assert metric_readings.added(REQUESTS, offload__operation="get_range", offload__outcome="ok") == len(ranged_gets)
    assert len(ranged_gets) == 3


async def test_a_call_that_runs_out_of_attempts_counts_as_gave_up(
    roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog, metric_readings: MetricReadings
) -> None:
    session = roots.faulty.for_session("acme", "chat-3")
    s3_requests.clear()
    fault_proxy.plan = FaultPlan(rate=1.0, kinds=[Fault.SLOW_DOWN], methods=["PUT"])

    with pytest.raises(StorageUnavailableError):
        await session.write_async(key="k.txt", content="lost to the outage")

    assert s3_requests.count(method="PUT") == 0
    assert metric_readings.added(REQUESTS, offload__operation="put", offload__outcome="gave_up") == 1
    # Every attempt met a fault; all but the last were retried.
    assert metric_readings.added(RETRIES, offload__operation="put") == sum(fault_proxy.faults.counts().values()) - 1


async def test_a_missing_result_counts_as_refused_and_is_not_retried(
    roots: Roots, s3_requests: RequestLog, metric_readings: MetricReadings
) -> None:
    session = roots.faulty.for_session("acme", "chat-4")
    reference = await session.write_async(key="k.txt", content="soon gone")
    await session.delete_async(reference)
    s3_requests.clear()

    with pytest.raises(ResultNotFoundError):
        await session.read_async(reference)

    refused = metric_readings.added(REQUESTS, offload__outcome="refused")
    assert refused >= 1
    assert metric_readings.added(RETRIES) == 0
    assert refused <= len(s3_requests.snapshot())
