"""
The engine contract: the async operations a store needs of its storage, the base of the sync-backed engines, and the
engine for memory and any other synchronous fsspec filesystem (each call runs the filesystem's sync method).
"""

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol, TypeAlias, TypeVar

from fsspec import AbstractFileSystem

from haystack_integrations.offload.stores.failures import network_failure
from haystack_integrations.offload.stores.sync_api import caller_is_waiting

T = TypeVar("T")

_EXCLUSIVE_CREATE_LOCK = threading.Lock()

# What `put_chunks` takes: bytes-like chunks (`ContentChunks` yields bytes and memoryviews).
Chunk: TypeAlias = bytes | bytearray | memoryview
# S3: content up to this size goes in one PUT even when given as chunks; above it, a multipart upload of parts of
# `MULTIPART_PART_BYTES` or a little more, at most `MULTIPART_PARTS_IN_FLIGHT` at a time (memory over upload speed:
# see docs/design.md and benchmarks/write_memory.py).
MULTIPART_THRESHOLD = 16 * 2**20
MULTIPART_PART_BYTES = 5 * 2**20  # S3's minimum (all parts but the last); 10,000 parts make 50 GiB
MULTIPART_PARTS_IN_FLIGHT = 2


class Listed(NamedTuple):
    """One object of a listing: its size, and when it was last written if the listing says (`find_detailed_async`)."""

    size: int
    modified: datetime | None
    """By the storage's clock (timezone-aware): S3's LastModified, a file's mtime; None where the listing is mute."""


class Children(NamedTuple):
    """What lies directly below a directory (`Engine.children_async`), by full path."""

    directories: list[str]
    """The subdirectories (S3's common prefixes), without a trailing separator, sorted."""
    objects: dict[str, int]
    """The directory's own objects, with their sizes."""


class Engine:
    """
    The async operations a store needs of one filesystem: put, put from chunks, exclusive create, get, ranged get
    (with the size), size, modification time, find and delete.

    Paths are full paths in the filesystem's own form (``bucket/prefix/...`` for S3, absolute paths for local disk),
    built and validated by the store, which derives its sync API from these (`stores.sync_api`) and retries them
    (`stores.retry.retried`). Each engine, in its own module, subclasses this and raises `FileExistsError`,
    `FileNotFoundError`, `PermissionError` or `StorageRequestError` for the failures it recognises: `memory_io`,
    `local_io`, `async_fsspec_io`, `s3fs_io`, `obstore_io`.
    """

    # Whether calls touch a disk in a worker thread (memory and network engines do not block the loop).
    uses_worker_threads = False
    # Whether the storage is reached over a network, so that a failure may be transient and a retry may help.
    remote = False
    # Whether the retry loop must cut an attempt off itself: the engine's client has no time limit it keeps.
    needs_attempt_limit = False
    # Whether writes go through temporary files renamed into place (local disk), which a killed writer leaves behind.
    writes_temporary_files = False

    def __init__(self, fs: AbstractFileSystem) -> None:
        """
        :param fs: The fsspec filesystem to use (for an engine that does not go through fsspec, one for callers).
        """
        self.fs = fs

    async def warm_up_async(self) -> None:
        """Open whatever the backend opens lazily (a client)."""

    async def ready_async(self) -> None:
        """Make what async calls from the running loop need (a client), so no request's time limit pays for it."""

    async def put_async(self, path: str, data: bytes) -> None:
        """Store `data` at `path`, replacing any object there."""
        raise NotImplementedError

    async def put_chunks_async(self, path: str, chunks: Iterable[Chunk]) -> None:
        """
        Store the concatenation of `chunks` at `path`, replacing any object there; as `put_async`, without needing it
        whole. This base version joins the chunks; local disk writes them one by one, S3 uploads large content in parts.

        :param path: Where to store it.
        :param chunks: The content, in order. Iterated once per attempt: pass a re-iterable (`ContentChunks`) when
            the call may be retried.
        """
        await self.put_async(path, b"".join(chunks))

    async def put_exclusive_async(self, path: str, data: bytes) -> None:
        """Store `data` at `path` only if nothing is there yet; raise `FileExistsError` otherwise."""
        raise NotImplementedError

    async def get_async(self, path: str) -> bytes:
        """Return the whole object at `path`."""
        raise NotImplementedError

    async def get_range_async(self, path: str, start: int, end: int) -> bytes:
        """Return bytes `start` (inclusive) to `end` (exclusive) of the object at `path`; short at the object's end."""
        raise NotImplementedError

    async def get_range_and_size_async(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        """Return bytes `start` to `end` (exclusive) of the object at `path`, and the object's total size."""
        raise NotImplementedError

    async def size_async(self, path: str) -> int:
        """Return the size in bytes of the object at `path`."""
        raise NotImplementedError

    async def modified_async(self, path: str) -> datetime | None:
        """
        Return when the object at `path` was last written, by the storage's own clock (timezone-aware); None where the
        filesystem does not say.
        """
        return None

    async def find_async(self, path: str) -> dict[str, int]:
        """Return every object below the directory `path` (recursively) with its size; empty if there is none."""
        raise NotImplementedError

    async def find_detailed_async(self, path: str) -> dict[str, Listed]:
        """
        As `find_async`, with each object's modification time as the same listing gives it (S3 LIST pages carry
        LastModified), so that deciding by age costs no request per object (purges).

        This base version has no times (None each): a caller asks `modified_async` of those objects it needs.

        :param path: The directory.
        :returns: Every object below it, with its size and modification time.
        """
        return {name: Listed(size, None) for name, size in (await self.find_async(path)).items()}

    async def children_async(self, path: str) -> Children:
        """
        What lies directly below the directory `path`: its subdirectories and its own objects (S3: a LIST with a
        delimiter, one per 1000 of them). This base version derives both from `find_async`, a walk of everything below.

        :param path: The directory, without a trailing separator.
        :returns: The children, by full path.
        """
        prefix = path + "/"
        directories: set[str] = set()
        objects: dict[str, int] = {}
        for name, size in (await self.find_async(path)).items():
            if not name.startswith(prefix):
                continue
            child, separator, _ = name[len(prefix) :].partition("/")
            if separator:
                directories.add(prefix + child)
            else:
                objects[name] = size
        return Children(sorted(directories), objects)

    async def delete_async(self, paths: Iterable[str]) -> None:
        """
        Delete the objects at `paths`; a missing object is not an error.

        On S3, a batch refused as a whole is deleted key by key: Ceph RGW and moto authorise DeleteObjects against the
        bucket (AWS checks each key), so a principal allowed to delete only below its tenant's prefix is refused the
        batch and allowed each key's DeleteObject.
        """
        raise NotImplementedError


class SyncBackedIO(Engine):
    """
    A synchronous filesystem (memory, local disk, any other): the operations written as sync calls, each async one
    running its sync twin in a worker thread (or inline, when that is cheaper: see `inline_io_bytes`).
    """

    uses_worker_threads = True
    # Calls moving at most this many bytes run inline on the loop anyway (None: never).
    inline_io_bytes: int | None = None

    def put(self, path: str, data: bytes) -> None:
        """Store `data` at `path`, replacing any object there."""
        self.fs.pipe_file(path, data)

    def put_chunks(self, path: str, chunks: Iterable[Chunk]) -> None:
        """
        Store the concatenation of `chunks` at `path`, replacing any object there; as `put`, without needing it whole.

        This base version joins the chunks (memory, and other backends without a streaming write, hold it whole
        anyway); local disk writes them one by one, S3 uploads large content in parts.

        :param path: Where to store it.
        :param chunks: The content, in order. Iterated once per attempt: pass a re-iterable (`ContentChunks`) when
            the call may be retried.
        """
        self.put(path, b"".join(chunks))

    def put_exclusive(self, path: str, data: bytes) -> None:
        """Store `data` at `path` only if nothing is there yet; raise `FileExistsError` otherwise."""
        # fsspec's generic create mode checks and then writes; in one process the lock makes that atomic.
        with _EXCLUSIVE_CREATE_LOCK:
            self.fs.pipe_file(path, data, mode="create")

    def get(self, path: str) -> bytes:
        """Return the whole object at `path`."""
        return bytes(self.fs.cat_file(path))

    def get_range(self, path: str, start: int, end: int) -> bytes:
        """Return bytes `start` (inclusive) to `end` (exclusive) of the object at `path`; short at the object's end."""
        return bytes(self.fs.cat_file(path, start=start, end=end))

    def get_range_and_size(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        """Return bytes `start` to `end` (exclusive) of the object at `path`, and the object's total size."""
        size = self.size(path)
        return (self.get_range(path, start, end) if start < size else b""), size

    def size(self, path: str) -> int:
        """Return the size in bytes of the object at `path`."""
        return int(self.fs.info(path)["size"])

    def modified(self, path: str) -> datetime | None:
        """Return when the object at `path` was last written (fsspec's `modified`), timezone-aware; None if unknown."""
        try:
            return aware(self.fs.modified(path))
        except NotImplementedError:
            return None

    def find(self, path: str) -> dict[str, int]:
        """Return every object below the directory `path` (recursively) with its size; empty if there is none."""
        found = self.fs.find(path, detail=True)
        return {name: int(info.get("size") or 0) for name, info in found.items() if info.get("type") != "directory"}

    def find_detailed(self, path: str) -> dict[str, Listed]:
        """As `find`, with each object's modification time where the filesystem's listing gives one (`info_time`)."""
        found = self.fs.find(path, detail=True)
        return {
            name: Listed(int(info.get("size") or 0), info_time(info))
            for name, info in found.items()
            if info.get("type") != "directory"
        }

    def delete(self, paths: Iterable[str]) -> None:
        """Delete the objects at `paths`; a missing object is not an error."""
        for path in paths:
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                continue

    async def _in_thread(self, function: Callable[..., T], *args: Any, size: int | None = None) -> T:
        # `size`: the bytes the call moves, when known; a small enough call is cheaper inline than a thread hop. A sync
        # caller's operation running on that caller's own thread (`run_on_own_loop`) blocks nobody else: always inline.
        inline = not self.uses_worker_threads or (
            self.inline_io_bytes is not None and size is not None and size <= self.inline_io_bytes
        )
        try:
            if inline or caller_is_waiting():
                return function(*args)
            return await asyncio.to_thread(function, *args)
        except Exception as error:
            failure = network_failure(error)  # a remote synchronous filesystem (sftp, ...) can fail transiently
            if failure is None:
                raise
            raise failure from error

    async def put_async(self, path: str, data: bytes) -> None:
        """Async `put`."""
        await self._in_thread(self.put, path, data, size=len(data))

    async def put_exclusive_async(self, path: str, data: bytes) -> None:
        """Async `put_exclusive`."""
        await self._in_thread(self.put_exclusive, path, data, size=len(data))

    async def get_async(self, path: str) -> bytes:
        """Async `get`."""
        return await self._in_thread(self.get, path)

    async def get_range_async(self, path: str, start: int, end: int) -> bytes:
        """Async `get_range`."""
        return await self._in_thread(self.get_range, path, start, end, size=max(0, end - start))

    async def get_range_and_size_async(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        """Async `get_range_and_size`."""
        return await self._in_thread(self.get_range_and_size, path, start, end, size=max(0, end - start))

    async def size_async(self, path: str) -> int:
        """Async `size`."""
        return await self._in_thread(self.size, path, size=0)

    async def modified_async(self, path: str) -> datetime | None:
        """Async `modified`."""
        return await self._in_thread(self.modified, path, size=0)

    async def find_async(self, path: str) -> dict[str, int]:
        """Async `find`."""
        return await self._in_thread(self.find, path)

    async def find_detailed_async(self, path: str) -> dict[str, Listed]:
        """Async `find_detailed`."""
        return await self._in_thread(self.find_detailed, path)

    async def delete_async(self, paths: Iterable[str]) -> None:
        """Async `delete`."""
        await self._in_thread(self.delete, list(paths))


def aware(moment: datetime) -> datetime:
    """A filesystem's time as a timezone-aware one: a naive time is UTC (fsspec's local and memory filesystems)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# Where fsspec filesystems put an object's time in its info: s3fs LastModified, adlfs last_modified, gcsfs updated,
# local mtime, memory created (a memory file is written once, when it is created).
_TIME_KEYS = ("LastModified", "last_modified", "updated", "mtime", "created")


def info_time(info: Mapping[str, Any]) -> datetime | None:
    """
    When an fsspec info (or listing) entry says its object was last written.

    :param info: The entry.
    :returns: The time, timezone-aware; None if the entry carries none.
    """
    for key in _TIME_KEYS:
        moment = info.get(key)
        if isinstance(moment, str):
            try:
                moment = datetime.fromisoformat(moment)
            except ValueError:
                continue
        elif isinstance(moment, int | float):
            moment = datetime.fromtimestamp(moment, tz=UTC)
        if isinstance(moment, datetime):
            return aware(moment)
    return None


def drained(head: list[T], rest: Iterator[T]) -> Iterator[T]:
    """
    `head`'s items, each dropped from the list as it is yielded, then `rest`'s.

    ``itertools.chain(head, rest)`` would keep every item of `head` alive (the list holds them) until the whole upload
    ends: parts already sent would stay in memory.
    """
    head.reverse()
    while head:
        yield head.pop()
    yield from rest


class Requests(Protocol):
    """How callers beside the store send an engine call: through the store's retries (`retry.retried`)."""

    async def __call__(self, operation: str, path: str, call: Callable[[Engine], Awaitable[T]]) -> T:
        """
        :param operation: What the call does, for logs (``"put"``, ``"get"``, ``"find"``, ...).
        :param path: The path it concerns.
        :param call: The engine call, given the store's engine.
        :returns: What the call returned.
        """
        ...


# fsspec protocols served in this process: no network between the store and its bytes, so no transient failures.
IN_PROCESS_PROTOCOLS = frozenset({"memory", "file", "local"})


class SyncFilesystemIO(SyncBackedIO):
    """In-memory and other synchronous filesystems (a remote one, such as sftp, is retried: `remote`)."""

    def __init__(self, fs: AbstractFileSystem) -> None:
        """
        :param fs: The fsspec filesystem to use.
        """
        super().__init__(fs)
        protocols = protocols_of(fs)
        # fsspec's memory filesystem is a dict: calling it inline is cheaper than a thread hop.
        self.uses_worker_threads = "memory" not in protocols
        self.remote = not set(protocols) <= IN_PROCESS_PROTOCOLS


def protocols_of(fs: AbstractFileSystem) -> tuple[str, ...]:
    """The protocols an fsspec filesystem answers to (``fs.protocol`` is a string or a tuple)."""
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
