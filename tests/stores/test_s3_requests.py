"""Request counts on S3, measured from the HTTP traffic moto's server received (not from client-side mocks)."""

import uuid

import pytest

from haystack_integrations.offload import FsspecToolResultStore, InvalidReferenceError
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

pytestmark = pytest.mark.s3


@pytest.fixture(params=["fsspec", "obstore"])
def s3_session(s3_server: LocalS3Server, request: pytest.FixtureRequest) -> FsspecToolResultStore:
    """A session store on each S3 engine: the requests each operation makes must be the same."""
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options=s3_server.storage_options(),
        engine=request.param,
    )
    store.warm_up()
    return store.for_session("acme", "chat-1")


def _summary(log: RequestLog) -> list[tuple[str, str, bool]]:
    """(method, kind, ranged) per request, where kind tells object requests from bucket listings."""
    return [
        (
            request.method,
            "list" if "list-type" in request.query or request.key in (None, "") else "object",
            request.range is not None,
        )
        for request in log
    ]


@pytest.mark.parametrize("content", ["text " * 1000, b"\x00\xff" * 1000, "x" * (6 * 2**20)])
def test_a_write_is_exactly_one_put(
    s3_session: FsspecToolResultStore, s3_requests: RequestLog, content: str | bytes
) -> None:
    s3_session.write(key="1_search_call.txt", content=content)
    assert _summary(s3_requests) == [("PUT", "object", False)]


async def test_an_async_write_is_exactly_one_put(s3_session: FsspecToolResultStore, s3_requests: RequestLog) -> None:
    await s3_session.write_async(key="1_search_call.txt", content="text" * 1000)
    assert _summary(s3_requests) == [("PUT", "object", False)]


@pytest.mark.parametrize("size", [10, 100_000, 20 * 2**20])
def test_a_whole_read_is_exactly_one_get(s3_session: FsspecToolResultStore, s3_requests: RequestLog, size: int) -> None:
    # 20 MiB is above s3fs's default block size, where its cat_file would HEAD first and then fetch ranges in parallel.
    reference = s3_session.write(key="big.txt", content="y" * size)
    s3_requests.clear()
    assert len(s3_session.read(reference)) == size
    assert _summary(s3_requests) == [("GET", "object", False)]
    assert s3_requests.snapshot()[0].bytes_sent == size


async def test_an_async_whole_read_is_exactly_one_get(
    s3_session: FsspecToolResultStore, s3_requests: RequestLog
) -> None:
    reference = await s3_session.write_async(key="big.txt", content=b"z" * (9 * 2**20))
    s3_requests.clear()
    assert len(await s3_session.read_async(reference)) == 9 * 2**20
    assert _summary(s3_requests) == [("GET", "object", False)]


async def test_a_page_is_one_ranged_get_moving_about_the_page_size(
    s3_session: FsspecToolResultStore, s3_requests: RequestLog
) -> None:
    reference = await s3_session.write_async(key="big.txt", content="p" * (8 * 2**20))
    s3_requests.clear()
    page = await s3_session.read_range_async(reference, 4 * 2**20, 4 * 2**20 + 10_000)
    assert page == b"p" * 10_000
    (request,) = s3_requests.snapshot()
    assert (request.method, request.range) == ("GET", f"bytes={4 * 2**20}-{4 * 2**20 + 9_999}")
    assert request.bytes_sent == 10_000
    s3_requests.clear()
    assert s3_session.read_range(reference, 0, 100) == b"p" * 100
    assert [(r.method, r.range, r.bytes_sent) for r in s3_requests] == [("GET", "bytes=0-99", 100)]


async def test_a_page_with_the_total_size_is_one_ranged_get_and_no_head(
    s3_session: FsspecToolResultStore, s3_requests: RequestLog
) -> None:
    reference = await s3_session.write_async(key="big.txt", content=b"q" * 50_000)
    s3_requests.clear()
    assert s3_session.read_range_and_size(reference, 10_000, 20_000) == (b"q" * 10_000, 50_000)
    assert await s3_session.read_range_and_size_async(reference, 45_000, 55_000) == (b"q" * 5_000, 50_000)
    assert [(r.method, r.range) for r in s3_requests] == [("GET", "bytes=10000-19999"), ("GET", "bytes=45000-54999")]
    # Past the end S3 answers 416, and the size costs a HEAD: the documented exception.
    s3_requests.clear()
    assert await s3_session.read_range_and_size_async(reference, 60_000, 70_000) == (b"", 50_000)
    assert [(r.method, r.status) for r in s3_requests] == [("GET", 416), ("HEAD", 200)]


def test_info_is_one_head_and_list_only_lists(s3_session: FsspecToolResultStore, s3_requests: RequestLog) -> None:
    reference = s3_session.write(key="k.txt", content="k")
    s3_requests.clear()
    s3_session.info(reference)
    assert _summary(s3_requests) == [("HEAD", "object", False)]
    s3_requests.clear()
    s3_session.list()
    assert {summary[1] for summary in _summary(s3_requests)} == {"list"}


def test_delete_is_one_request_and_purge_batches(s3_session: FsspecToolResultStore, s3_requests: RequestLog) -> None:
    references = [s3_session.write(key=f"{i}.txt", content=str(i)) for i in range(5)]
    s3_requests.clear()
    s3_session.delete(references[0])
    assert [(r.method, r.query) for r in s3_requests] == [("POST", "delete")]  # one DeleteObjects
    s3_requests.clear()
    assert s3_session.purge() == 4
    deletes = s3_requests.filter(method="POST", query_contains="delete")
    assert len(deletes) == 1  # one DeleteObjects for all four
    assert s3_session.list() == []


def test_refused_references_make_no_request(s3_session: FsspecToolResultStore, s3_requests: RequestLog) -> None:
    for hostile in ("../../globex/chat-1/x", "s3://other/x", "/etc/passwd", "%2e%2e/x", ""):
        with pytest.raises(InvalidReferenceError):
            s3_session.read(hostile)
    assert len(s3_requests) == 0


def test_connection_pool_is_sized_for_concurrency(s3_server: LocalS3Server) -> None:
    store = FsspecToolResultStore(
        s3_server.bucket_url + "/pool", storage_options=s3_server.storage_options(), engine="fsspec"
    )
    store.warm_up()
    client = store._handle.io().fs.s3  # type: ignore[attr-defined]
    assert client.meta.config.max_pool_connections >= 64


async def test_a_store_on_an_asynchronous_filesystem_serves_async_calls(s3_server: LocalS3Server) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(asynchronous=True, skip_instance_cache=True, **s3_server.storage_options())
    client = await fs.set_session()
    try:
        store = FsspecToolResultStore(f"{s3_server.bucket_url}/asynchronous", filesystem=fs)
        session = store.for_session("acme", "chat-1")
        reference = await session.write_async(key="k.txt", content="on the caller's own loop")
        assert await session.read_async(reference) == "on the caller's own loop"
        assert [record.reference for record in await session.list_async()] == [reference]
        with pytest.raises(TypeError, match="asynchronous=True"):
            session.read(reference)
    finally:
        await client.close()


@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_a_walk_is_one_list_per_thousand_keys_and_nothing_else(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str
) -> None:
    # s3fs's own find, finding nothing, sent a HEAD of the prefix without its "/": outside a tenant's session policy
    # (a 403 on SeaweedFS), and a request more.
    from support.seeding import seed_results

    prefix = uuid.uuid4().hex
    seed_results(s3_server, prefix, 1_001)
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{prefix}", storage_options=s3_server.storage_options(), engine=engine
    )
    root.warm_up()
    for tenant, objects, lists in (("nobody", 0, 1), ("acme", 1_001, 2)):
        s3_requests.clear()
        assert len(root.for_tenant(tenant).find_objects()) == objects
        assert [request.method for request in s3_requests] == ["GET"] * lists
        assert s3_requests.count(method="GET", query_contains="list-type") == lists
