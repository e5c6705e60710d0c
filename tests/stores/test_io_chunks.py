"""
Writing from chunks (`put_chunks`), and local disk's inline small I/O in async paths.

`ContentChunks` first (what it yields, and that its encoding is the whole string's), then `put_chunks` on each
backend: memory, local disk (with its temporary-file-and-rename hardening), S3 through s3fs and obstore (one PUT for
small content, a multipart upload above the threshold, aborted when the chunks fail), then which local-disk async
calls skip the worker thread.
"""

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.errors import InvalidReferenceError
from haystack_integrations.offload.stores import io, s3fs_io
from haystack_integrations.offload.stores.chunks import ContentChunks, utf8_size
from haystack_integrations.offload.stores.local_io import INLINE_IO_BYTES, LocalIO, PathCheckedLocalIO
from haystack_integrations.offload.testing.faults import Fault, FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

TEXTS = [
    "",
    "plain ascii " * 100,
    "héllo wörld ✓ " * 50,
    "astral 😀 and CJK 漢字 " * 40,
    # Lone surrogates, a high one just before a chunk boundary and a low one just after: surrogatepass keeps each.
    "ab\ud83d\ude00cd\udfff" * 30,
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk_chars", [1, 2, 3, 7, 1000])
def test_text_chunks_join_to_the_whole_encoding(text: str, chunk_chars: int) -> None:
    whole = text.encode("utf-8", "surrogatepass")
    chunks = ContentChunks(text, chunk_chars=chunk_chars)
    assert b"".join(chunks) == whole
    assert b"".join(chunks) == whole  # iterable again, for a retried write
    assert chunks.nbytes == len(whole) == utf8_size(text, chunk_chars=chunk_chars)
    assert all(len(chunk) <= 4 * chunk_chars for chunk in chunks)


def test_bytes_chunks_are_views_of_the_content() -> None:
    content = os.urandom(10_000)
    chunks = list(ContentChunks(content, chunk_chars=4096))
    assert [len(chunk) for chunk in chunks] == [4096, 4096, 1808]
    assert all(isinstance(chunk, memoryview) and chunk.obj is content for chunk in chunks)
    assert b"".join(chunks) == content
    assert ContentChunks(bytearray(content)).nbytes == 10_000
    assert b"".join(ContentChunks(memoryview(content)[100:200], chunk_chars=30)) == content[100:200]
    assert list(ContentChunks(b"")) == []


def test_content_chunks_refuse_what_a_write_refuses() -> None:
    with pytest.raises(TypeError):
        ContentChunks(12)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ContentChunks("x", chunk_chars=0)


# put_chunks on each backend


def _chunks(total: int, size: int) -> Iterator[bytes]:
    """`total` bytes of a recognisable pattern, `size` bytes per chunk."""
    pattern = bytes(range(256)) * (size // 256 + 1)
    for start in range(0, total, size):
        yield pattern[: min(size, total - start)]


def _expected(total: int, size: int) -> bytes:
    return b"".join(_chunks(total, size))


class Broken(Exception):
    pass


def _failing(total_before: int) -> Iterator[bytes]:
    yield from _chunks(total_before, 1 << 20)
    raise Broken("the producer failed mid-way")


def test_memory_joins_the_chunks() -> None:
    store = FsspecToolResultStore(f"memory://chunks-{uuid.uuid4().hex}")
    target = f"{store._handle.root_path()}/a/b.bin"
    store._handle.io().put_chunks(target, ContentChunks(b"0123456789", chunk_chars=3))
    assert store._handle.io().get(target) == b"0123456789"


@pytest.fixture(params=["at-calls", "path-checked"])
def local_io(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[io.Engine, Path]:
    root = Path(os.path.realpath(tmp_path)) / "results"
    root.mkdir()
    kind = LocalIO if request.param == "at-calls" else PathCheckedLocalIO
    return kind(FsspecToolResultStore(str(root))._handle.io().fs), root


def test_local_disk_writes_chunks_through_a_renamed_temporary_file(local_io: tuple[io.Engine, Path]) -> None:
    disk, root = local_io
    target = root / "acme" / "chat-1" / "big.bin"
    disk.put_chunks(str(target), _chunks(3_000_000, 65_536))
    assert target.read_bytes() == _expected(3_000_000, 65_536)
    assert os.listdir(target.parent) == ["big.bin"]  # no temporary file left
    disk.put_chunks(str(target), iter([b"replaced"]))
    assert disk.get(str(target)) == b"replaced"


async def test_local_disk_async_chunks_and_a_failing_producer(local_io: tuple[io.Engine, Path]) -> None:
    disk, root = local_io
    target = root / "acme" / "chat-1" / "big.bin"
    await disk.put_chunks_async(str(target), ContentChunks("é" * 600_000, chunk_chars=100_000))
    assert target.read_text("utf-8") == "é" * 600_000
    with pytest.raises(Broken):
        await disk.put_chunks_async(str(target), _failing(2_000_000))
    # The old content stays whole, and the failed write's temporary file is gone.
    assert target.read_text("utf-8") == "é" * 600_000
    assert os.listdir(target.parent) == ["big.bin"]


def test_local_disk_chunks_never_follow_a_symlink(local_io: tuple[io.Engine, Path], tmp_path: Path) -> None:
    disk, root = local_io
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "acme").mkdir()
    (root / "acme" / "chat-1").symlink_to(elsewhere)
    with pytest.raises(InvalidReferenceError):
        disk.put_chunks(str(root / "acme" / "chat-1" / "x.bin"), iter([b"escaped?"]))
    assert list(elsewhere.iterdir()) == []


def _s3_io(server: LocalS3Server, engine: str) -> tuple[io.Engine, str]:
    store = FsspecToolResultStore(
        f"{server.bucket_url}/{uuid.uuid4().hex}", storage_options=server.storage_options(), engine=engine, retry=None
    )
    return store._handle.io(), store._handle.root_path()


@pytest.mark.s3
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
async def test_s3_small_content_from_chunks_is_one_put(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str
) -> None:
    storage, root = _s3_io(s3_server, engine)
    path = f"{root}/acme/chat-1/small.bin"
    chunks = ContentChunks(_expected(io.MULTIPART_THRESHOLD, 4096), chunk_chars=1 << 20)
    await storage.put_chunks_async(path, chunks)
    assert [request.method for request in s3_requests if request.key] == ["PUT"]
    assert await storage.get_async(path) == _expected(io.MULTIPART_THRESHOLD, 4096)


@pytest.mark.s3
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
async def test_s3_large_content_from_chunks_is_a_multipart_upload(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str
) -> None:
    storage, root = _s3_io(s3_server, engine)
    path = f"{root}/acme/chat-1/large.bin"
    total = io.MULTIPART_THRESHOLD + 5 * (1 << 20) + 123
    await storage.put_chunks_async(path, _chunks(total, 3 << 20))
    methods = [request.method for request in s3_requests if request.key]
    # Initiate (POST ?uploads), the parts (PUT ?partNumber=...), complete (POST ?uploadId=...).
    parts = [request for request in s3_requests if request.method == "PUT" and "partNumber" in request.query]
    assert methods.count("POST") == 2
    assert len(parts) == methods.count("PUT") >= 2
    assert await storage.get_async(path) == _expected(total, 3 << 20)


@pytest.mark.s3
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
async def test_s3_a_failing_producer_leaves_no_object_and_no_upload(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str
) -> None:
    storage, root = _s3_io(s3_server, engine)
    path = f"{root}/acme/chat-1/broken.bin"
    with pytest.raises(Broken):
        await storage.put_chunks_async(path, _failing(io.MULTIPART_THRESHOLD + 10 * (1 << 20)))
    with pytest.raises(FileNotFoundError):
        await storage.get_async(path)
    # The outcome, not a request count: a part cancelled on our side may land after the abort, which is then repeated.
    assert s3_requests.count(method="POST", query_contains="uploads") >= 1  # it was a multipart upload
    assert _uploads_in_progress(s3_server) == []


@pytest.mark.s3
async def test_s3_an_abort_that_fails_is_repeated_until_no_part_is_left(s3_server: LocalS3Server) -> None:
    # The store's own retry policy turns botocore's retries off, so only the store can repeat the failed abort.
    with FaultProxy(s3_server.endpoint_url) as proxy:
        options = {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        store = FsspecToolResultStore(
            f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=options, engine="fsspec"
        )
        storage, root = store._handle.io(), store._handle.root_path()
        proxy.inject(Fault.INTERNAL_ERROR, method="DELETE")  # the first AbortMultipartUpload
        with pytest.raises(Broken):
            await storage.put_chunks_async(
                f"{root}/acme/chat-1/broken.bin", _failing(io.MULTIPART_THRESHOLD + (6 << 20))
            )
        assert proxy.faults.counts() == {Fault.INTERNAL_ERROR: 1}
        assert proxy.requests.count("DELETE") >= 2
    assert _uploads_in_progress(s3_server) == []


def _uploads_in_progress(server: LocalS3Server) -> list[Any]:
    uploads: list[Any] = server.client().list_multipart_uploads(Bucket=server.bucket).get("Uploads", [])
    return uploads


@pytest.mark.s3
async def test_a_retried_call_writes_chunks_through_the_engine(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    # Under the store's default RetryPolicy the chunks are written inside the retry loop (large content through it is
    # a multipart upload: tests/stores/test_streamed_writes.py).
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options(), engine="fsspec"
    )
    path = f"{store._handle.root_path()}/acme/chat-1/r.bin"
    chunks = ContentChunks(b"abc" * 1000, chunk_chars=100)
    await store._handle.request("put", path, lambda storage: storage.put_chunks_async(path, chunks))
    assert await store._handle.request("get", path, lambda storage: storage.get_async(path)) == b"abc" * 1000
    assert s3_requests.count(method="PUT") == 1


async def test_memory_writes_chunks_async() -> None:
    store = FsspecToolResultStore(f"memory://chunks-{uuid.uuid4().hex}")
    target = f"{store._handle.root_path()}/a/b.txt"
    await store._handle.io().put_chunks_async(target, ContentChunks("é" * 10, chunk_chars=3))
    assert store._handle.io().get(target) == ("é" * 10).encode()


def test_parts_group_chunks_copying_little() -> None:
    parts = list(s3fs_io._parts([bytes(20 << 20)], 8 << 20))
    assert [len(part) for part in parts] == [8 << 20, 8 << 20, 4 << 20]
    exact = bytes(8 << 20)
    assert next(s3fs_io._parts([exact], 8 << 20)) is exact  # a chunk that is a part by itself is not copied
    parts = list(s3fs_io._parts(_chunks(3_000_001, 1000), 1 << 20))
    assert [len(part) for part in parts] == [(1 << 20) + 424, (1 << 20) + 424, 3_000_001 - 2 * ((1 << 20) + 424)]
    assert b"".join(parts) == _expected(3_000_001, 1000)
    assert list(s3fs_io._parts([], 8)) == []


# Local disk: small async calls inline, large ones in a worker thread


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = asyncio.to_thread

    async def counting(function: Any, /, *args: Any, **kwargs: Any) -> Any:
        seen.append(getattr(function, "__name__", repr(function)))
        return await real(function, *args, **kwargs)

    monkeypatch.setattr(io.asyncio, "to_thread", counting)
    return seen


async def test_small_local_writes_and_reads_stay_on_the_loop(tmp_path: Path, hops: list[str]) -> None:
    session = FsspecToolResultStore(str(tmp_path / "results")).for_session("acme", "chat-1")
    small = "x" * INLINE_IO_BYTES
    reference = await session.write_async(key="small.txt", content=small)
    assert await session.read_async(reference) == small
    assert await session.read_range_async(reference, 0, 10) == b"x" * 10
    assert (await session.info_async(reference)).size == len(small)
    await session.documents("claims").create_async("claim", b"{}")
    assert hops == []


async def test_large_local_writes_and_reads_hop_to_a_thread(tmp_path: Path, hops: list[str]) -> None:
    session = FsspecToolResultStore(str(tmp_path / "results")).for_session("acme", "chat-1")
    large = "y" * (INLINE_IO_BYTES + 1)
    reference = await session.write_async(key="large.txt", content=large)
    assert hops == ["put"]
    assert await session.read_async(reference) == large
    assert hops == ["put", "_read_and_close"]
    assert await session.read_range_async(reference, 0, INLINE_IO_BYTES + 1) == large.encode()
    assert hops[-1] == "get_range"


async def test_inline_reads_keep_refusing_symlinks_and_hard_links(tmp_path: Path) -> None:
    store = FsspecToolResultStore(str(tmp_path / "results"))
    session = store.for_session("acme", "chat-1")
    reference = await session.write_async(key="mine.txt", content="mine")
    directory = Path(store._handle.root_path()) / "acme" / "chat-1"
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    victim = directory / reference.rsplit("/", 1)[-1]
    victim.unlink()
    victim.symlink_to(secret)
    with pytest.raises(InvalidReferenceError):
        await session.read_async(reference)
    victim.unlink()
    os.link(secret, victim)
    with pytest.raises(InvalidReferenceError):
        await session.read_async(reference)
