"""
A listing's first page costs one LIST whatever the session holds (issue 42): names sort newest first, and a page is a
LIST with start-after and max-keys. Results named by the layout before keep being listed, after the newer ones.
"""

import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from read_back_helpers import state_for

from haystack_integrations.offload import FsspecToolResultStore, InvalidReferenceError, ListToolResults
from haystack_integrations.offload.stores.names import new_object_name, parse_object_name
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

pytestmark = pytest.mark.s3

START = datetime(2026, 11, 1, tzinfo=UTC)


def _legacy_name(index: int) -> str:
    """A result name as versions before newest-first names wrote them (time counting up)."""
    created = START - timedelta(days=1) + timedelta(seconds=index)
    return f"{created.strftime('%Y%m%dT%H%M%S')}{created.microsecond:06d}Z-{index:08x}.t.old.{index}_old.txt"


def _seed(server: LocalS3Server, prefix: str, count: int, *, legacy: int = 0) -> list[str]:
    """Put `count` results (and `legacy` old-layout ones, and session documents) straight into the bucket."""
    names = [
        new_object_name(
            key=f"{index}_search_call.txt", kind="text", tool_name="search", now=START + timedelta(seconds=index)
        )
        for index in range(count)
    ]
    keys = [f"{prefix}/acme/chat-1/{name}" for name in [*names, *(_legacy_name(index) for index in range(legacy))]]
    keys += [f"{prefix}/acme/chat-1/.history/{index:08d}.json" for index in range(3)]  # documents: not results
    keys.append(f"{prefix}/acme/chat-2/{names[0] if names else _legacy_name(0)}")  # another session's
    client = server.client()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=server.bucket, Key=key, Body=b"x"), keys))
    return names


def _session(server: LocalS3Server, prefix: str, engine: str) -> FsspecToolResultStore:
    root = FsspecToolResultStore(
        f"{server.bucket_url}/{prefix}", storage_options=server.storage_options(), engine=engine
    )
    root.warm_up()
    return root.for_session("acme", "chat-1")


def _lists(log: RequestLog) -> tuple[int, int]:
    """LISTs, and requests in all."""
    snapshot = log.snapshot()
    return sum(1 for request in snapshot if "list-type" in request.query), len(snapshot)


@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
@pytest.mark.parametrize("count", [50, 2_500])
def test_the_first_page_is_one_list_at_any_size(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str, count: int
) -> None:
    prefix = f"pages-{uuid.uuid4().hex}"
    names = _seed(s3_server, prefix, count)
    session = _session(s3_server, prefix, engine)

    s3_requests.clear()
    page = session.list_page(limit=20)
    assert _lists(s3_requests) == (1, 1)
    assert [record.reference for record in page.results] == names[::-1][:20]
    assert page.next_after == names[-20]

    s3_requests.clear()
    second = session.list_page(limit=20, after=page.next_after)
    assert _lists(s3_requests) == (1, 1)
    assert [record.reference for record in second.results] == names[::-1][20:40]

    # list(limit=...) and the model's tool read the same one page.
    s3_requests.clear()
    assert [record.reference for record in session.list(limit=20)] == names[::-1][:20]
    output = ListToolResults().invoke(state=state_for(session))
    assert _lists(s3_requests) == (2, 2)
    header, *lines = output.splitlines()
    assert f"after='{names[-20]}'" in header
    assert [line.split(" | ")[0].removeprefix("- ") for line in lines] == names[::-1][:20]


@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
@pytest.mark.parametrize("count", [50, 2_500])
def test_the_models_first_listing_is_one_list_at_any_size(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str, count: int
) -> None:
    # The tool's first call, as the model makes it: before, it listed the whole session (3 LISTs at 2,500).
    prefix = f"pages-{uuid.uuid4().hex}"
    names = _seed(s3_server, prefix, count)
    session = _session(s3_server, prefix, engine)
    s3_requests.clear()
    lines = ListToolResults().invoke(state=state_for(session)).splitlines()[1:]
    assert _lists(s3_requests) == (1, 1)
    assert [line.split(" | ")[0].removeprefix("- ") for line in lines] == names[::-1][:20]


@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
async def test_paging_reaches_every_result_then_the_legacy_ones(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str
) -> None:
    prefix = f"pages-{uuid.uuid4().hex}"
    names = _seed(s3_server, prefix, 45, legacy=30)
    session = _session(s3_server, prefix, engine)
    legacy = [_legacy_name(index) for index in range(30)]

    seen: list[str] = []
    after = None
    lists = []
    while True:
        s3_requests.clear()
        page = await session.list_page_async(limit=20, after=after)
        lists.append(_lists(s3_requests)[0])
        seen += [record.reference for record in page.results]
        after = page.next_after
        if after is None:
            break
    # Newest first: every newest-first name, then the legacy ones, newest of them first; none twice.
    assert seen == [*names[::-1], *legacy[::-1]]
    assert lists[0] == 1  # the first page holds only newer results
    # The whole list agrees (legacy results are older here), and reads legacy names as before.
    assert [record.reference for record in await session.list_async()] == seen
    assert parse_object_name(legacy[0]) is not None
    assert await session.read_async(legacy[3]) == "x"


@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_a_session_of_the_previous_layout_lists_in_one_list(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str
) -> None:
    # Written before the upgrade, and a few since: the one LIST that finds them all is not sent twice.
    prefix = f"pages-{uuid.uuid4().hex}"
    names = _seed(s3_server, prefix, 3, legacy=12)
    session = _session(s3_server, prefix, engine)
    s3_requests.clear()
    page = session.list_page(limit=20)
    assert _lists(s3_requests) == (1, 1)
    assert [record.reference for record in page.results] == [
        *names[::-1],
        *(_legacy_name(i) for i in range(11, -1, -1)),
    ]
    assert page.next_after is None


def test_the_cursor_is_a_reference_of_this_store(s3_server: LocalS3Server) -> None:
    prefix = f"pages-{uuid.uuid4().hex}"
    session = _session(s3_server, prefix, "obstore")
    for hostile in ["../chat-2/x", "acme/chat-2/" + new_object_name(key="k", kind="text", tool_name=None), "nope"]:
        with pytest.raises(InvalidReferenceError):
            session.list_page(after=hostile)
    with pytest.raises(ValueError, match="limit"):
        session.list_page(limit=0)


def test_a_tenant_store_pages_its_sessions(s3_server: LocalS3Server) -> None:
    prefix = f"pages-{uuid.uuid4().hex}"
    names = _seed(s3_server, prefix, 5)
    tenant = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{prefix}", storage_options=s3_server.storage_options()
    ).for_tenant("acme")
    first = tenant.list_page(limit=4)
    rest = tenant.list_page(limit=4, after=first.next_after)
    every = [record.reference for record in tenant.list()]
    assert [record.reference for record in [*first.results, *rest.results]] == every
    assert rest.next_after is None
    assert sorted(every) == sorted([f"chat-1/{name}" for name in names] + [f"chat-2/{names[0]}"])
