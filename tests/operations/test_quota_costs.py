"""
What a quota'd write costs in requests as a tenant grows (issue 42), counted on moto's server.

A listing that takes longer than `Quota.refresh_seconds` is no longer stale on arrival: the next periodic refresh
counts from when it came back. A worker's first quota'd write still lists the tenant (a LIST per 1000 objects): kept
as a known gap below, strict, so that it turns red once usage is kept incrementally.
"""

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from haystack_integrations.offload import FsspecToolResultStore, Quota
from haystack_integrations.offload.stores.names import new_object_name
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

pytestmark = pytest.mark.s3


def _seed_tenant(server: LocalS3Server, prefix: str, count: int) -> None:
    """Put `count` results of tenant acme, 50 per session, straight into the bucket (no store, no quota)."""
    keys = [
        f"{prefix}/acme/chat-{index // 50}/{new_object_name(key=f'{index}.txt', kind='text', tool_name='t')}"
        for index in range(count)
    ]
    client = server.client()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=server.bucket, Key=key, Body=b"x"), keys))


def _first_write_requests(server: LocalS3Server, log: RequestLog, count: int, quota: Quota) -> dict[str, int]:
    prefix = f"quota-costs-{uuid.uuid4().hex}"
    _seed_tenant(server, prefix, count)
    root = FsspecToolResultStore(
        f"{server.bucket_url}/{prefix}", storage_options=server.storage_options(), engine="obstore", quota=quota
    )
    session = root.for_session("acme", "new-chat")
    session.warm_up()
    log.clear()

    async def write() -> None:
        # Bounded: before, a listing slower than refresh_seconds was stale on arrival and listed again, for ever.
        await asyncio.wait_for(session.write_async(key="first.txt", content="x"), timeout=30)

    asyncio.run(write())
    return {
        "LIST": log.count(method="GET", query_contains="list-type"),
        "PUT": log.count(method="PUT"),
        "all": len(log),
    }


@pytest.mark.parametrize("count", [50, 2_500])
def test_a_listing_slower_than_refresh_seconds_is_not_stale_on_arrival(
    s3_server: LocalS3Server, s3_requests: RequestLog, count: int
) -> None:
    # Every listing takes longer than a microsecond: before, each one came back stale and the write listed again.
    quota = Quota(tenant_results=1_000_000, refresh_seconds=1e-6)
    counts = _first_write_requests(s3_server, s3_requests, count, quota)
    assert counts == {"LIST": count // 1000 + 1, "PUT": 1, "all": count // 1000 + 2}


@pytest.mark.xfail(
    strict=True,
    reason="issue 42, not done: tenant usage is still known from a listing of the tenant (a LIST per 1000 objects), "
    "not kept incrementally, so a worker's first quota'd write grows with the tenant",
)
def test_a_first_quotad_write_costs_the_same_at_any_tenant_size(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    quota = Quota(tenant_results=1_000_000)
    small = _first_write_requests(s3_server, s3_requests, 50, quota)
    large = _first_write_requests(s3_server, s3_requests, 2_500, quota)
    assert small == large
    assert large["all"] <= large["PUT"] + 2
