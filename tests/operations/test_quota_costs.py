"""
What a quota'd write costs in requests as a tenant grows (issue 42), counted on moto's server.

A worker's first quota'd write reads the tenant's newest usage mark (a LIST with max-keys 1 and a GET) instead of
listing the tenant (a LIST per 1000 objects). With ``tenant_usage="listing"``, a listing that takes longer than
`Quota.refresh_seconds` is no longer stale on arrival: the next periodic refresh counts from when it came back.
"""

import asyncio
import uuid

import pytest

from haystack_integrations.offload import FsspecToolResultStore, Quota, QuotaExceededError
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from support.seeding import seed_results

pytestmark = pytest.mark.s3


def _first_write_requests(
    server: LocalS3Server, log: RequestLog, count: int, quota: Quota, *, earlier_worker: bool = False
) -> dict[str, int]:
    prefix = f"quota-costs-{uuid.uuid4().hex}"
    seed_results(server, prefix, count, per_session=50)
    url, options = f"{server.bucket_url}/{prefix}", server.storage_options()
    if earlier_worker:  # another worker wrote into the tenant before: its first write reconciled the tenant's marks
        FsspecToolResultStore(url, storage_options=options, quota=quota).for_session("acme", "old").write(
            key="k.txt", content="x"
        )
    root = FsspecToolResultStore(url, storage_options=options, engine="obstore", quota=quota)
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
    quota = Quota(tenant_results=1_000_000, refresh_seconds=1e-6, tenant_usage="listing")
    counts = _first_write_requests(s3_server, s3_requests, count, quota)
    assert counts == {"LIST": count // 1000 + 1, "PUT": 1, "all": count // 1000 + 2}


def test_a_first_quotad_write_costs_the_same_at_any_tenant_size(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    # Before, the new worker listed the whole tenant: 1 LIST at 50 objects, 3 at 2,500.
    quota = Quota(tenant_results=1_000_000)
    small = _first_write_requests(s3_server, s3_requests, 50, quota, earlier_worker=True)
    large = _first_write_requests(s3_server, s3_requests, 2_500, quota, earlier_worker=True)
    assert small == large == {"LIST": 1, "PUT": 1, "all": 3}  # the newest mark: a LIST (max-keys 1) and a GET


def test_marks_drift_is_bounded_and_reconciled(s3_server: LocalS3Server) -> None:
    # Usage marks carry what workers added: a worker that dies before marking leaves them short (by at most its
    # allowance); deletes leave them long. A reconcile (before a refusal, every reconcile_seconds, or the operator's
    # reconcile_usage) sets them to the listing.
    url, options = f"{s3_server.bucket_url}/{uuid.uuid4().hex}", s3_server.storage_options()
    quota = Quota(tenant_results=10, slack=0.2)  # allowance: 2 results unmarked per worker
    crashed = FsspecToolResultStore(url, storage_options=options, quota=quota).for_session("acme", "a")
    for index in range(2):
        crashed.write(key=f"{index}.txt", content="x")
    del crashed  # dies with its 2 writes unmarked (its first write's reconcile marked 0)
    worker = FsspecToolResultStore(url, storage_options=options, quota=quota)
    session = worker.for_session("acme", "b")
    assert session.reconcile_usage() == (2, 2)  # the listing finds them
    for index in range(8):
        session.write(key=f"{index}.txt", content="x")
    with pytest.raises(QuotaExceededError):
        session.write(key="over.txt", content="x")
    # Deleted results are still counted by the marks, until the refusal's listing says otherwise.
    assert session.purge() == 8
    session.write(key="after-purge.txt", content="x")
    # An operator's reconcile (a process with nothing unmarked) marks exactly what is stored.
    operator = FsspecToolResultStore(url, storage_options=options, quota=quota)
    assert operator.reconcile_usage("acme") == (3, 3)


def test_a_reconcile_prunes_old_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    from haystack_integrations.offload.stores import scope_usage

    monkeypatch.setattr(scope_usage, "KEPT_MARKS", 3)  # instead of 1000, to see it with a few writes
    root = FsspecToolResultStore("memory://marks-pruned", quota=Quota(tenant_results=1_000, slack=0))
    session = root.for_session("acme", "chat-1")
    for index in range(10):  # slack 0: every write after the first marks what the one before added
        session.write(key=f"{index}.txt", content="x")
    fs = root._handle.io().fs
    assert len(fs.ls("/marks-pruned/acme/.usage")) >= 9
    operator = FsspecToolResultStore("memory://marks-pruned", quota=Quota(tenant_results=1_000, slack=0))
    assert operator.reconcile_usage("acme") == (10, 10)
    assert len(fs.ls("/marks-pruned/acme/.usage")) == 3 + 1


@pytest.mark.parametrize("count", [1, 5])
def test_a_reconcile_counts_this_workers_listed_writes_once(
    s3_server: LocalS3Server, s3_requests: RequestLog, count: int
) -> None:
    # Before, a reconcile marked the listing plus everything this worker had admitted and not marked, though what had
    # landed before the listing began was in it: one result written and reconciled gave (2, 2), then (1, 1).
    url, options = f"{s3_server.bucket_url}/{uuid.uuid4().hex}", s3_server.storage_options()
    session = FsspecToolResultStore(url, storage_options=options, quota=Quota(tenant_results=1_000)).for_session(
        "acme", "chat-1"
    )
    for index in range(count):  # within the allowance (100): all of them unmarked when the reconcile begins
        session.write(key=f"{index}.txt", content="x")
    s3_requests.clear()
    assert session.reconcile_usage() == (count, count)
    # The newest mark (a LIST, max-keys 1, and a GET), the tenant (a LIST) and the new mark (a PUT), at any count.
    assert {
        "LIST": s3_requests.count(method="GET", query_contains="list-type"),
        "PUT": s3_requests.count(method="PUT"),
        "all": len(s3_requests),
    } == {"LIST": 2, "PUT": 1, "all": 4}
    assert session.reconcile_usage() == (count, count)
    operator = FsspecToolResultStore(url, storage_options=options, quota=Quota(tenant_results=1_000))
    assert operator.reconcile_usage("acme") == (count, count)


def test_a_reconcile_counts_writes_in_flight_when_it_began() -> None:
    # A write still in flight when the listing begins may land after the listing passed it: it counts, once.
    quota = Quota(tenant_bytes=10_000)
    root = FsspecToolResultStore("memory://reconcile-in-flight", quota=quota)
    session = root.for_session("acme", "chat-1")
    for index in range(3):
        session.write(key=f"{index}.txt", content="x")
    in_flight = root._handle.quota_tracker().charge(quota, "acme", "chat-1", 7)  # a document not yet written
    assert session.reconcile_usage() == (3, 3 + 7)
    in_flight.settle()


def test_a_reconcile_before_a_refusal_does_not_refuse_a_write_that_fits(s3_server: LocalS3Server) -> None:
    # Another worker deletes a result this worker wrote: this worker's view (its marks) now counts one too many, so
    # its next write is over on that view and a reconcile lists the tenant before refusing. Before, that reconcile
    # added this worker's unmarked writes to a listing that already held them, and refused a write that fit.
    url, options = f"{s3_server.bucket_url}/{uuid.uuid4().hex}", s3_server.storage_options()
    quota = Quota(tenant_results=10, slack=0.5)  # allowance: 5 results unmarked
    session = FsspecToolResultStore(url, storage_options=options, quota=quota).for_session("acme", "chat-1")
    references = [session.write(key=f"{index}.txt", content="x") for index in range(10)]
    other = FsspecToolResultStore(url, storage_options=options, quota=quota).for_session("acme", "chat-1")
    other.delete(references[0])
    session.write(key="fits.txt", content="x")  # 10 stored again: at the limit, not over it
    with pytest.raises(QuotaExceededError):
        session.write(key="over.txt", content="x")
    operator = FsspecToolResultStore(url, storage_options=options, quota=quota)
    assert operator.reconcile_usage("acme") == (10, 10)


def test_a_reconcile_adds_only_what_its_listing_may_miss() -> None:
    # What landed before the listing began is in it; what was in flight then, or admitted since, may not be.
    from haystack_integrations.offload.stores.quotas import QuotaTracker

    tracker, quota = QuotaTracker(), Quota(tenant_bytes=10_000)
    tracker.charge(quota, "acme", "chat-1", 1).settle()  # landed before the listing
    in_flight = tracker.charge(quota, "acme", "chat-1", 20)
    start = tracker.listing_began(("acme",))
    tracker.charge(quota, "acme", "chat-1", 300).settle()  # admitted while the listing ran
    taken, unlisted = tracker.take_unlisted(("acme",), start)
    assert (taken, unlisted) == ((0, 321), (0, 320))
    # The mark was not written: all of it is put back, and the next listing (nothing in flight) adds what came after.
    tracker.restore_pending(("acme",), taken)
    in_flight.settle()
    start = tracker.listing_began(("acme",))
    tracker.charge(quota, "acme", "chat-1", 4_000).settle()
    assert tracker.take_unlisted(("acme",), start) == ((0, 4_321), (0, 4_000))
    # A mark written while the listing ran carries what was admitted before it: only what came after is added.
    start = tracker.listing_began(("acme",))
    tracker.charge(quota, "acme", "chat-1", 50).settle()
    assert tracker.take_pending(("acme",)) == (0, 50)  # marked, as a refresh would
    tracker.charge(quota, "acme", "chat-1", 600).settle()
    assert tracker.take_unlisted(("acme",), start) == ((0, 600), (0, 600))
