"""`FsspecToolResultStore.read_range_and_size`: a byte range and the total size in one read, on every backend."""

import pytest

from haystack_integrations.offload import FsspecToolResultStore, InvalidReferenceError, ResultNotFoundError

# Also on RGW with STS credentials and an SSE-C key per tenant (tests/conftest.py, "isolated").
pytestmark = pytest.mark.isolated


def test_a_range_comes_with_the_total_size(session: FsspecToolResultStore) -> None:
    reference = session.write(key="r.txt", content="0123456789")
    assert session.read_range_and_size(reference, 2, 5) == (b"234", 10)
    assert session.read_range_and_size(reference, 8, 100) == (b"89", 10)
    assert session.read_range_and_size(reference, 4, 4) == (b"", 10)
    # At or past the end: no bytes, and still the size (S3 answers 416 here; the store asks for the size instead).
    assert session.read_range_and_size(reference, 10, 20) == (b"", 10)
    assert session.read_range_and_size(reference, 50, 60) == (b"", 10)


def test_an_empty_result_has_size_zero(session: FsspecToolResultStore) -> None:
    reference = session.write(key="e.txt", content="")
    assert session.read_range_and_size(reference, 0, 10) == (b"", 0)


async def test_the_async_twin_matches(session: FsspecToolResultStore) -> None:
    reference = await session.write_async(key="r.bin", content=b"\x00\x01\x02\x03")
    assert await session.read_range_and_size_async(reference, 1, 3) == (b"\x01\x02", 4)
    assert await session.read_range_and_size_async(reference, 9, 12) == (b"", 4)


def test_it_refuses_what_read_refuses(session: FsspecToolResultStore, store: FsspecToolResultStore) -> None:
    other = store.for_session("globex", "chat-1").write(key="s.txt", content="secret")
    with pytest.raises(ResultNotFoundError):
        session.read_range_and_size(other, 0, 6)
    for hostile in (f"globex/chat-1/{other}", f"../../globex/chat-1/{other}", "/etc/passwd", "s3://bucket/x"):
        with pytest.raises(InvalidReferenceError):
            session.read_range_and_size(hostile, 0, 6)
    with pytest.raises(ValueError, match="range"):
        session.read_range_and_size(other, 5, 2)
