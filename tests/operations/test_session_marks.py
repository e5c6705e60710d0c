"""
A session `Quota` at any session size (issue 42), counted on moto's server.

A session is listed while it fits one LIST page, exactly as before; the first refresh that finds more reconciles it into
usage marks of its own (``<session>/.-usage/``), which sort first in its listing, so a worker's refresh then costs that
one LIST and a GET of the newest mark (and a create for what it admitted since), however much the session holds.
"""

import asyncio
import uuid
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore, Quota, QuotaExceededError
from haystack_integrations.offload.operations import scan, usage
from haystack_integrations.offload.stores import end_session
from haystack_integrations.offload.stores.scope_usage import ScopeUsage
from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from support.seeding import seed_results

pytestmark = pytest.mark.s3


def _seeded_session(server: Any, count: int) -> str:
    """A root whose session acme/chat-1 holds `count` results put straight into the bucket (no store, no quota)."""
    prefix = f"session-marks-{uuid.uuid4().hex}"
    seed_results(server, prefix, count)
    return f"{server.bucket_url}/{prefix}"


def _session(server: LocalS3Server, url: str, quota: Quota) -> FsspecToolResultStore:
    return FsspecToolResultStore(url, storage_options=server.storage_options(), quota=quota).for_session(
        "acme", "chat-1"
    )


def _first_write_requests(server: LocalS3Server, log: RequestLog, count: int) -> dict[str, int]:
    quota = Quota(session_results=1_000_000)
    url = _seeded_session(server, count)
    _session(server, url, quota).write(key="earlier.txt", content="x")  # an earlier worker's write
    session = _session(server, url, quota)
    session.warm_up()
    log.clear()
    session.write(key="first.txt", content="x")
    return {
        "LIST": log.count(method="GET", query_contains="list-type"),
        "GET": log.count(method="GET") - log.count(method="GET", query_contains="list-type"),
        "PUT": log.count(method="PUT"),
        "all": len(log),
    }


def test_a_fresh_workers_first_write_into_a_session_costs_the_same_at_any_size(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    # A session that fits a page: that LIST is its usage, as before.
    assert _first_write_requests(s3_server, s3_requests, 50) == {"LIST": 1, "GET": 0, "PUT": 1, "all": 2}
    # Before, the new worker listed the whole session: 2 LISTs at 1,100 objects, 4 at 3,100.
    large = [_first_write_requests(s3_server, s3_requests, count) for count in (1_100, 3_100)]
    assert large[0] == large[1] == {"LIST": 1, "GET": 1, "PUT": 1, "all": 3}


def test_workers_crossing_a_page_keep_the_limit_within_an_allowance(s3_server: LocalS3Server) -> None:
    quota = Quota(session_results=1_160, slack=0.01)  # allowance: 11 results unmarked per worker
    url = _seeded_session(s3_server, 1_150)
    first, second = _session(s3_server, url, quota), _session(s3_server, url, quota)
    for index in range(5):  # its first refresh finds a full page: it reconciles the session into marks
        first.write(key=f"first-{index}.txt", content="x")
    written = 0
    with pytest.raises(QuotaExceededError) as refused:
        for index in range(100):
            second.write(key=f"second-{index}.txt", content="x")
            written += 1
    assert refused.value.scope == "session"
    root = FsspecToolResultStore(url, storage_options=s3_server.storage_options())
    stored = usage(scan(root, tenant="acme", session="chat-1")).total.results
    # The second worker never saw the first one's 5 unmarked writes: within one allowance over the limit, not more.
    assert stored == 1_150 + 5 + written and 1_160 <= stored <= 1_160 + quota.allowance(1_160)


def test_session_marks_are_not_results_and_go_with_the_session(s3_server: LocalS3Server) -> None:
    quota = Quota(session_results=1_000_000)
    url = _seeded_session(s3_server, 1_100)
    session = _session(s3_server, url, quota)
    session.write(key="k.txt", content="x")  # reconciles the session: its first mark
    root = FsspecToolResultStore(url, storage_options=s3_server.storage_options())
    objects = scan(root, tenant="acme", session="chat-1")
    marks = [item for item in objects if item.namespace == "-usage"]
    assert len(marks) == 1 and not [item for item in objects if item.kind == "result" and "-usage" in item.path]
    # Ended with its documents, the session leaves nothing behind; its marks went with them.
    end_session(session, documents=True)
    assert scan(root, tenant="acme", session="chat-1") == []
    # Once it is gone, the session is listed again (no mark to read).
    fresh = _session(s3_server, url, quota)
    fresh.write(key="again.txt", content="x")
    assert [item.namespace for item in scan(root, tenant="acme", session="chat-1")] == [None]


@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
@pytest.mark.parametrize("scope", ["tenant", "session"])
def test_a_mark_whose_answer_was_lost_is_known_as_its_own_not_counted_twice(
    s3_endpoint: Any, engine: str, scope: str
) -> None:
    # The mark's create reaches S3 and lands; the answer is lost (a reset after the request), so the retry meets 412.
    # Before, the worker took it for another worker's mark and added to it again: the reconcile's mark counted the
    # listing twice (2,200 results for 1,100).
    url = _seeded_session(s3_endpoint, 1_100)
    quota = Quota(tenant_results=1_000_000) if scope == "tenant" else Quota(session_results=1_000_000)
    plan = FaultPlan()
    plan.script(Fault.RESET_AFTER, method="PUT", path_contains="usage/")
    with FaultProxy(s3_endpoint.endpoint_url, plan=plan) as proxy:
        options = {**s3_endpoint.storage_options(), "endpoint_url": proxy.endpoint_url}
        session = FsspecToolResultStore(url, storage_options=options, engine=engine, quota=quota)
        session.for_session("acme", "chat-1").write(key="k.txt", content="x")
        assert proxy.faults.counts()[Fault.RESET_AFTER] == 1
    marks = FsspecToolResultStore(url, storage_options=s3_endpoint.storage_options(), quota=quota)
    usage_marks = ScopeUsage(marks)._usage_marks(("acme",) if scope == "tenant" else ("acme", "chat-1"))
    newest = asyncio.run(usage_marks.latest_async())
    assert newest is not None and (newest.sequence, newest.results) == (0, 1_100)
