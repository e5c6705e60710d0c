"""Storage failures map to built-in exceptions, chained to the backend's own, and never look like 'not found'."""

import socket
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from haystack_integrations.offload import (
    FsspecToolResultStore,
    ResultNotFoundError,
    StorageError,
    StoragePermissionError,
)
from haystack_integrations.offload.testing.local_s3 import LocalS3Server


class _RefusingFilesystem(MemoryFileSystem):
    """A real fsspec backend whose server says no: every write and read is refused like an IAM deny."""

    protocol = "refusing"

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        raise PermissionError(13, "Access Denied", f"refusing://{path}")

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        raise PermissionError(13, "Access Denied", f"refusing://{path}")


class _BrokenFilesystem(MemoryFileSystem):
    """A backend that fails with a non-OSError, as botocore and aiohttp do for network trouble."""

    protocol = "broken"

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        raise RuntimeError(f"connection to bucket-of-acme at {path} reset")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_permission_denied_maps_to_permission_error() -> None:
    session = FsspecToolResultStore("/results", filesystem=_RefusingFilesystem()).for_session("acme", "chat-1")
    with pytest.raises(StoragePermissionError) as caught:
        session.write(key="k.txt", content="x")
    assert isinstance(caught.value, PermissionError)
    assert isinstance(caught.value.__cause__, PermissionError)
    with pytest.raises(StoragePermissionError):
        session.read("20261129T213400123456Z-5f3a9c1e.t.search.k.txt")


def test_other_backend_failures_map_to_storage_error_without_leaking_paths() -> None:
    session = FsspecToolResultStore("/results", filesystem=_BrokenFilesystem()).for_session("acme", "chat-1")
    with pytest.raises(StorageError) as caught:
        session.write(key="k.txt", content="x")
    assert isinstance(caught.value, OSError)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert "bucket-of-acme" not in str(caught.value)
    assert "RuntimeError" in str(caught.value)


async def test_async_failures_map_the_same_way() -> None:
    session = FsspecToolResultStore("/results", filesystem=_RefusingFilesystem()).for_session("acme", "chat-1")
    with pytest.raises(StoragePermissionError):
        await session.write_async(key="k.txt", content="x")


@pytest.mark.s3
def test_missing_bucket_is_a_storage_error_on_write_and_list(s3_server: LocalS3Server) -> None:
    store = FsspecToolResultStore("s3://no-such-bucket/prefix", storage_options=s3_server.storage_options())
    session = store.for_session("acme", "chat-1")
    with pytest.raises(StorageError, match="does not exist"):
        session.write(key="k.txt", content="x")
    with pytest.raises(ResultNotFoundError):
        session.read("20261129T213400123456Z-5f3a9c1e.t.search.k.txt")


@pytest.mark.s3
@pytest.mark.slow
async def test_unreachable_endpoint_is_a_chained_storage_error() -> None:
    options = {
        "endpoint_url": f"http://127.0.0.1:{_free_port()}",
        "key": "testing",
        "secret": "testing",
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1},
        "client_kwargs": {"region_name": "us-east-1"},
    }
    session = FsspecToolResultStore("s3://bucket/prefix", storage_options=options).for_session("acme", "chat-1")
    with pytest.raises(StorageError) as caught:
        await session.write_async(key="k.txt", content="x")
    assert caught.value.__cause__ is not None
    with pytest.raises(StorageError):
        session.write(key="k.txt", content="x")


def test_unknown_protocol_and_bad_urls_fail_clearly() -> None:
    with pytest.raises(ValueError, match="not known"):
        FsspecToolResultStore("nosuchproto://x")
    with pytest.raises(ValueError, match="has no path"):
        FsspecToolResultStore("s3://")
    with pytest.raises(ValueError, match="needs a tenant"):
        FsspecToolResultStore("memory://x", session="chat-1")


@pytest.mark.parametrize("content", [None, 42, ["list"], {"dict": 1}])
def test_write_rejects_content_that_is_neither_text_nor_bytes(content: Any) -> None:
    session = FsspecToolResultStore("memory://types").for_session("acme", "chat-1")
    with pytest.raises(TypeError, match="content must be str or bytes"):
        session.write(key="k.txt", content=content)
    assert session.list() == []
