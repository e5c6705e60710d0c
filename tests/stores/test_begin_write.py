"""
`begin_write_async`: the reference at once, the upload in a task, and reads of that result wait for it.

On memory and local disk a write finishes almost at once, so the "waits" cases are shown on S3 behind a proxy that holds
every answer back: without the wait, the read would reach the server before the PUT has been answered there.
"""

import asyncio
import uuid
from pathlib import Path

import pytest

from haystack_integrations.offload import FsspecToolResultStore, QuotaExceededError, ResultNotFoundError
from haystack_integrations.offload.stores.pending import PendingWrite
from haystack_integrations.offload.stores.quotas import Quota
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from haystack_integrations.offload.testing.relay import LatencyProxy

pytestmark = pytest.mark.engines  # also on the obstore engine (tests/conftest.py)

SLOW = 0.4


async def test_the_reference_comes_first_and_the_result_follows(store: FsspecToolResultStore) -> None:
    session = store.for_session("acme", "chat-1")
    pending = await session.begin_write_async(key="page.txt", content="hello\u00e9", tool_name="fetch")

    assert isinstance(pending, PendingWrite)
    assert await pending.wait() == pending.reference
    assert pending.done() and pending.error() is None
    assert "stored" in repr(pending)
    assert await session.read_async(pending.reference) == "hello\u00e9"
    (record,) = await session.list_async()
    assert (record.reference, record.tool_name, record.kind) == (pending.reference, "fetch", "text")


async def test_bytes_come_back_as_bytes(store: FsspecToolResultStore) -> None:
    session = store.for_session("acme", "chat-1")
    pending = await session.begin_write_async(key="blob.bin", content=b"\x00\xff")
    await pending.wait()
    assert await session.read_async(pending.reference) == b"\x00\xff"


async def test_a_failed_upload_raises_on_wait(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    session = FsspecToolResultStore(str(blocker / "results")).for_session("acme", "chat-1")
    pending = await session.begin_write_async(key="page.txt", content="lost?")

    with pytest.raises(OSError):
        await pending.wait()
    assert pending.error() is not None
    assert "failed" in repr(pending)


async def test_what_can_be_refused_without_io_is_refused_at_once(tmp_path: Path) -> None:
    root = FsspecToolResultStore(str(tmp_path / "results"), quota=Quota(session_bytes=10))
    session = root.for_session("acme", "chat-1")
    with pytest.raises(QuotaExceededError):
        await session.begin_write_async(key="page.txt", content="x" * 11)
    with pytest.raises(TypeError):
        await session.begin_write_async(key="page.txt", content=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tenant-scoped"):
        await root.for_tenant("acme").begin_write_async(key="page.txt", content="x")
    assert session.list() == []


def test_it_needs_a_running_loop(tmp_path: Path) -> None:
    session = FsspecToolResultStore(str(tmp_path / "results")).for_session("acme", "chat-1")
    coroutine = session.begin_write_async(key="page.txt", content="x")
    with pytest.raises(RuntimeError):
        # Driven by hand, outside any loop: there is no loop to run the upload on.
        coroutine.send(None)
    coroutine.close()


@pytest.mark.s3
@pytest.mark.slow
async def test_every_read_of_a_result_still_uploading_waits_for_it(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    with LatencyProxy(s3_server.endpoint_url, latency=SLOW) as proxy:
        root = FsspecToolResultStore(
            url, storage_options={**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        )
        session = root.for_session("acme", "chat-1")
        # Another store object from the same root shares the in-flight table: a tool reading through its own copy.
        reader = root.for_session("acme", "chat-1")
        content = "0123456789" * 100

        pending = await session.begin_write_async(key="a.txt", content=content)
        assert not pending.done()
        assert await reader.read_async(pending.reference) == content

        pending = await session.begin_write_async(key="b.txt", content=content)
        assert await reader.read_range_async(pending.reference, 10, 20) == b"0123456789"

        pending = await session.begin_write_async(key="c.txt", content=content)
        assert await reader.read_range_and_size_async(pending.reference, 0, 5) == (b"01234", 1000)

        pending = await session.begin_write_async(key="d.txt", content=content)
        assert (await reader.info_async(pending.reference)).size == 1000

        pending = await session.begin_write_async(key="e.txt", content=content)
        assert pending.reference in {record.reference for record in await reader.list_async()}

        # A delete waits too, or the upload could land after it and bring the result back.
        pending = await session.begin_write_async(key="f.txt", content=content)
        await reader.delete_async(pending.reference)
        with pytest.raises(ResultNotFoundError):
            await reader.read_async(pending.reference)

        pending = await session.begin_write_async(key="g.txt", content=content)
        assert await reader.purge_async() == 6
        assert await reader.list_async() == []
        assert pending.done()

    # Every write went out once, and the only result answered 404 is the deleted one, read after the delete.
    assert s3_requests.count(method="PUT") == 7
    missing = [request for request in s3_requests if request.status == 404 and ".t.." in request.path]
    assert [request.method for request in missing] == ["GET"]
    assert missing[0].path.endswith(".f.txt")


async def test_a_waiting_reader_can_be_cancelled_without_cancelling_the_upload(tmp_path: Path) -> None:
    session = FsspecToolResultStore(str(tmp_path / "results")).for_session("acme", "chat-1")
    pending = await session.begin_write_async(key="page.txt", content="kept")
    waiter = asyncio.ensure_future(pending.wait())
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await pending.wait() == pending.reference
    assert session.read(pending.reference) == "kept"
