"""A result larger than `STREAMED_WRITE_BYTES` is written from chunks: never encoded whole, the same bytes stored."""

import tracemalloc
from pathlib import Path

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores.fsspec_store import STREAMED_WRITE_BYTES
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

pytestmark = [pytest.mark.engines, pytest.mark.slow]

# Just over the threshold, with multi-byte characters (and a lone surrogate) spread through it.
UNIT = "ünïcödé 中文 🦜 "
LARGE_TEXT = UNIT * (STREAMED_WRITE_BYTES // len(UNIT) + 1000) + "\ud800 end"


def test_a_large_text_result_round_trips(store: FsspecToolResultStore) -> None:
    session = store.for_session("acme", "chat-1")
    reference = session.write(key="big.txt", content=LARGE_TEXT, tool_name="fetch")
    assert session.read(reference) == LARGE_TEXT
    assert session.info(reference).size == len(LARGE_TEXT.encode("utf-8", "surrogatepass"))


def test_a_large_bytes_result_round_trips(store: FsspecToolResultStore) -> None:
    data = bytes(range(256)) * (STREAMED_WRITE_BYTES // 256 + 7)
    session = store.for_session("acme", "chat-1")
    assert session.read(session.write(key="big.bin", content=data)) == data


@pytest.mark.s3
def test_on_s3_a_large_result_is_a_multipart_upload(s3_server: LocalS3Server, s3_requests: RequestLog) -> None:
    session = FsspecToolResultStore(f"{s3_server.bucket_url}/streamed", storage_options=s3_server.storage_options())
    session = session.for_session("acme", "chat-1")
    s3_requests.clear()
    reference = session.write(key="big.txt", content=LARGE_TEXT)
    assert s3_requests.filter(method="POST", query_contains="uploads")  # initiated a multipart upload
    assert len(s3_requests.filter(method="PUT", query_contains="partNumber")) >= 2
    assert session.read(reference) == LARGE_TEXT


def test_a_large_local_write_never_holds_a_second_whole_copy(tmp_path: Path) -> None:
    session = FsspecToolResultStore(str(tmp_path / "results")).for_session("acme", "chat-1")
    text = "x" * (64 * 2**20)
    tracemalloc.start()
    try:
        session.write(key="big.txt", content=text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Encoding the whole text would allocate another 64 MiB; chunks are a few MiB each.
    assert peak < len(text) // 4
