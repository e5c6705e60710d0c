"""Retries are for network backends: memory and local disk cannot fail transiently, so their I/O is not wrapped."""

import errno
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores.io import SyncFilesystemIO
from haystack_integrations.offload.stores.local_io import LocalIO, PathCheckedLocalIO
from haystack_integrations.offload.stores.s3fs_io import S3IO

_ZERO = {"retries": 0, "recovered": 0, "gave_up": 0, "causes": {}}


def test_only_network_backends_are_retried(backend: tuple[str, dict[str, Any]], request: pytest.FixtureRequest) -> None:
    url, storage_options = backend
    store = FsspecToolResultStore(url, storage_options=storage_options, **backend.store_kwargs)
    session = store.for_session("acme", "chat-1")
    reference = session.write(key="k.txt", content="hello")
    assert session.read(reference) == "hello"
    assert session.read_range_and_size(reference, 1, 3) == (b"el", 5)

    io = store._handle.io()
    kind = request.node.callspec.params["backend"]
    if kind == "s3":
        assert io.remote  # so the store retries its calls
        assert isinstance(io, S3IO) or type(io).__name__ == "ObstoreIO"
    else:
        assert not io.remote
        assert isinstance(io, {"memory": SyncFilesystemIO, "local": (LocalIO, PathCheckedLocalIO)}[kind])
    # Derived stores share the handle, so its (zero) counters stay readable everywhere.
    assert store.retry_stats.as_dict() == session.retry_stats.as_dict() == _ZERO


class _FlakyMemory(MemoryFileSystem):
    """Fails the first write as a network blip would; on memory there is no such thing to retry."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writes = 0

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        self.writes += 1
        if self.writes == 1:
            raise OSError(errno.ECONNRESET, "connection reset")
        super().pipe_file(path, value, mode=mode, **kwargs)


def test_a_memory_failure_is_reported_at_once_not_retried() -> None:
    fs = _FlakyMemory(skip_instance_cache=True)
    store = FsspecToolResultStore("/retry-scope", filesystem=fs)
    session = store.for_session("acme", "chat-1")
    with pytest.raises(OSError):  # the store's own mapping of the error is not what is tested here
        session.write(key="k.txt", content="x")
    assert fs.writes == 1
    assert store.retry_stats.as_dict() == _ZERO
    reference = session.write(key="k.txt", content="x")
    assert session.read(reference) == "x"
