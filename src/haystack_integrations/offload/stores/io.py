"""
The few storage operations a store needs, done with the fewest requests each backend allows.

fsspec does the I/O; this module only picks, per backend family, the call that meets the store's contract:

- `S3IO` (s3fs): one PUT per write, one GET per whole read (``_cat_file`` with ``max_concurrency=1``: the default
  adds a HEAD first), one ranged GET per page, batched DeleteObjects whose per-key errors are not ignored.
- `AsyncFilesystemIO`: any other async fsspec backend (gcsfs, adlfs, ...) through its coroutine methods.
- `LocalIO`: atomic writes (temporary file and rename, so a reader never sees half a result); every path reached
  through directory descriptors with ``O_NOFOLLOW``, so no symlink or planted hard link carries a read, write, delete
  or listing out of the store's root, however it races (`PathCheckedLocalIO` where the OS lacks those calls).
- `SyncFilesystemIO`: memory and any other synchronous backend.

Async fsspec filesystems created the usual way live on fsspec's own I/O thread and event loop. Their coroutines are
submitted to that loop and awaited from the caller's loop (`asyncio.wrap_future`), so no caller's loop ever blocks on
the network and none ever awaits a coroutine bound to another loop ("Event loop is closed"). For S3 filesystems the
store builds itself, async calls skip that hop: each caller's loop gets an ``asynchronous=True`` twin with the same
settings (`LoopLocal`, closed when that loop shuts down), which halves the thread hand-offs per request and keeps the
GIL from ping-ponging between the caller's thread and fsspec's. Those twins share one aiobotocore session (its loaded
service model and resolved credentials, `_SharedSessions`): only the client and its aiohttp connector, which belong
to one loop, are made per loop.

Local disk in async paths: a small write or read (up to `INLINE_IO_BYTES`) runs inline on the loop, a larger one in a
worker thread, so the loop never stalls on a big copy and small results skip the hop.

Large content is written from chunks (`put_chunks`, `stores.chunks.ContentChunks`) rather than from one whole
``bytes``: into the temporary file on local disk, as a multipart upload on S3 above `MULTIPART_THRESHOLD`.
"""

import asyncio
import contextlib
import errno
import functools
import logging
import os
import stat
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any, BinaryIO, Concatenate, ParamSpec, Self, TypeAlias, TypeVar

from fsspec import AbstractFileSystem
from fsspec.asyn import AsyncFileSystem

from haystack_integrations.offload.errors import InvalidReferenceError, StorageError, StoragePermissionError
from haystack_integrations.offload.stores.blocking import blocked_here
from haystack_integrations.offload.stores.loop_local import CrossLoopLock, LoopLocal
from haystack_integrations.offload.stores.names import is_temporary_name, new_temporary_name

T = TypeVar("T")
P = ParamSpec("P")

logger = logging.getLogger(__name__)

# DeleteObjects takes at most 1000 keys per request.
_S3_DELETE_BATCH = 1000
_EXCLUSIVE_CREATE_LOCK = threading.Lock()
# A multipart upload is aborted at most this many times while parts still show up (see `S3IO._abort_upload`).
_ABORT_ATTEMPTS = 5

# What `put_chunks` takes: bytes-like chunks (`ContentChunks` yields bytes and memoryviews).
Chunk: TypeAlias = bytes | bytearray | memoryview
# Local disk, async paths: writes and reads up to this size run inline on the loop. Writing 256 KiB into the page cache
# takes about as long as the hop to a worker thread and back costs (tens of microseconds to ~0.1 ms), so below it the
# hop is pure overhead, and above it the loop would stall for longer than a hop for every extra byte.
INLINE_IO_BYTES = 256 * 2**10
# S3: content up to this size goes in one PUT even when given as chunks; above it, a multipart upload of parts of
# `MULTIPART_PART_BYTES` or a little more, at most `MULTIPART_PARTS_IN_FLIGHT` at a time. Chosen for memory over upload
# speed (a large result is rare; its memory is what hurts a shared server): what a writer holds besides the content
# is the parts in flight, the HTTP client's copy of each (aiohttp copies botocore's body), the part being assembled
# and one chunk: 1.13x the content for 300 MB on s3fs, 1.07x on obstore (benchmarks/write_memory.py), against 1.2x
# with 8 MiB parts and 1.3x with 4 of them in flight.
MULTIPART_THRESHOLD = 16 * 2**20
MULTIPART_PART_BYTES = 5 * 2**20  # S3's minimum (all parts but the last); 10,000 parts make 50 GiB
MULTIPART_PARTS_IN_FLIGHT = 2


class StorageIO:
    """
    The async operations a store needs of one filesystem: put, put from chunks, exclusive create, get, ranged get
    (with the size), size, find and delete.

    Paths are full paths in the filesystem's own form (``bucket/prefix/...`` for S3, absolute paths for local disk),
    built and validated by the store, which derives its sync API from these (`stores.blocking`). Each engine
    subclasses this: `SyncBackedIO` for synchronous filesystems, `AsyncFilesystemIO` and `S3IO` for async fsspec,
    `ObstoreIO` for obstore.
    """

    # Whether calls touch a disk in a worker thread (memory and network engines do not block the loop).
    blocking = False

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

    async def find_async(self, path: str) -> dict[str, int]:
        """Return every object below the directory `path` (recursively) with its size; empty if there is none."""
        raise NotImplementedError

    async def delete_async(self, paths: Iterable[str]) -> None:
        """Delete the objects at `paths`; a missing object is not an error."""
        raise NotImplementedError


class SyncBackedIO(StorageIO):
    """
    A synchronous filesystem (memory, local disk, any other): the operations written as sync calls, each async one
    running its sync twin in a worker thread (or inline, when that is cheaper: see `inline_io_bytes`).
    """

    blocking = True
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

    def find(self, path: str) -> dict[str, int]:
        """Return every object below the directory `path` (recursively) with its size; empty if there is none."""
        found = self.fs.find(path, detail=True)
        return {name: int(info.get("size") or 0) for name, info in found.items() if info.get("type") != "directory"}

    def delete(self, paths: Iterable[str]) -> None:
        """Delete the objects at `paths`; a missing object is not an error."""
        for path in paths:
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                continue

    async def _in_thread(self, function: Callable[..., T], *args: Any, size: int | None = None) -> T:
        # `size`: the bytes the call moves, when known; a small enough call is cheaper inline than a thread hop. A sync
        # caller's operation running on that caller's own thread (`blocking_here`) blocks nobody else: always inline.
        if (
            self.blocking
            and (self.inline_io_bytes is None or size is None or size > self.inline_io_bytes)
            and not blocked_here()
        ):
            return await asyncio.to_thread(function, *args)
        return function(*args)

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

    async def find_async(self, path: str) -> dict[str, int]:
        """Async `find`."""
        return await self._in_thread(self.find, path)

    async def delete_async(self, paths: Iterable[str]) -> None:
        """Async `delete`."""
        await self._in_thread(self.delete, list(paths))


class SyncFilesystemIO(SyncBackedIO):
    """In-memory and other synchronous filesystems."""

    def __init__(self, fs: AbstractFileSystem) -> None:
        """
        :param fs: The fsspec filesystem to use.
        """
        super().__init__(fs)
        # fsspec's memory filesystem is a dict: calling it inline is cheaper than a thread hop.
        self.blocking = "memory" not in _protocols(fs)


class _LocalDiskIO(SyncBackedIO):
    """
    Async calls for local disk: small writes and reads inline on the loop, large ones (and listings) in a thread.

    A thread hop costs more CPU than writing or reading a small file through the page cache (issue 14 measured a
    10-result step at 571-888 us of CPU per result with the hop, 457 us inline); a large copy inline would stall every
    other task on the loop, so above `INLINE_IO_BYTES` the hop is worth it (`StorageIO._in_thread`). Each async call
    runs the very sync method (or, for a whole read, the very checked open) the sync API runs, so the two cannot differ
    in what they refuse.
    """

    inline_io_bytes = INLINE_IO_BYTES

    async def put_chunks_async(self, path: str, chunks: Iterable[Chunk]) -> None:
        """Async `put_chunks`, in a worker thread (streaming is for large content), which iterates the chunks."""
        await self._in_thread(self.put_chunks, path, chunks)

    def _open_for_read(self, path: str) -> BinaryIO:
        """Open `path` for reading with the same checks as `get`."""
        raise NotImplementedError

    async def get_async(self, path: str) -> bytes:
        """Async `get`: opened (and checked) inline; read inline when small, else in a worker thread."""
        file = self._open_for_read(path)
        handed_over = False
        try:
            if os.fstat(file.fileno()).st_size <= INLINE_IO_BYTES or blocked_here():
                return file.read()
            handed_over = True
        finally:
            if not handed_over:
                file.close()
        # The thread owns the file from here and closes it, even if this await is cancelled: its descriptor is never
        # closed (and its number reused) under a read still running.
        return await asyncio.to_thread(_read_and_close, file)


class LocalIO(_LocalDiskIO):
    """
    Local disk, safe against whoever else can write in the store's directory (another process, a tenant's sandbox).

    Every path is reached one component at a time from ``/``: each directory is opened with ``O_NOFOLLOW`` relative to
    its parent's descriptor, and the file with ``O_NOFOLLOW`` relative to its directory's. A symlink anywhere along the
    path is refused (`InvalidReferenceError`) by the very call that would have followed it, so there is no window
    between a check and an open for a swap to use (the store's root is a real path already). Writes, deletes and
    listings go through the same descriptors: a write or delete lands in the directory that was checked, whatever is
    renamed meanwhile, and a listing never descends into a symlink.

    What a read opens must be a regular file with a single link. A hard link planted in a session can name another
    tenant's file and cannot be told apart from it, so any file with more links is refused, results and documents
    alike, with one exception: a conditional create publishes a document by linking its temporary file into place and
    then unlinking the temporary file, so a document whose only other link is a ``.tmp-*`` file beside it is being
    published, not planted (`_check_links`). Listings still show hard-linked files, so purges remove them.

    Writes go through a temporary file beside the target (renamed into place, or linked for a conditional create), so a
    reader sees a whole result or none. A writer killed mid-write leaves its temporary file; its name carries its time
    (`names.new_temporary_name`) so purges remove it once it is older than `names.TEMPORARY_GRACE`.
    """

    def put(self, path: str, data: bytes) -> None:
        """Write `data` to a temporary file beside `path`, then rename it into place (atomic)."""
        self.put_chunks(path, (data,))

    def put_chunks(self, path: str, chunks: Iterable[Chunk]) -> None:
        """Write the chunks one by one to a temporary file beside `path`, then rename it into place (atomic)."""
        directory, name = os.path.split(path)
        parent = _open_directory(directory, create=True)
        try:
            temporary = _write_temporary(parent, chunks)
            try:
                os.replace(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                _unlink_quietly(parent, temporary)
                raise
        finally:
            os.close(parent)

    def put_exclusive(self, path: str, data: bytes) -> None:
        """Write a temporary file, then hard-link it into place: the link fails if the name exists (any process)."""
        directory, name = os.path.split(path)
        parent = _open_directory(directory, create=True)
        try:
            temporary = _write_temporary(parent, (data,))
            try:
                # link() is atomic and never replaces: readers see the whole document or nothing.
                os.link(temporary, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
            finally:
                _unlink_quietly(parent, temporary)
        finally:
            os.close(parent)

    def _open_for_read(self, path: str) -> BinaryIO:
        return _open_file(path)

    def get(self, path: str) -> bytes:
        """Return the file's content, opened without following any symlink."""
        with _open_file(path) as file:
            return file.read()

    def get_range(self, path: str, start: int, end: int) -> bytes:
        """Return part of the file, opened without following any symlink."""
        with _open_file(path) as file:
            file.seek(start)
            return file.read(max(0, end - start))

    def get_range_and_size(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        """Return part of the file and its size, from one open file (no window for a swap between the two)."""
        with _open_file(path) as file:
            size = os.fstat(file.fileno()).st_size
            file.seek(start)
            return file.read(max(0, end - start)), size

    def size(self, path: str) -> int:
        """Return the file's size, opened (and checked) as for a read."""
        with _open_file(path) as file:
            return os.fstat(file.fileno()).st_size

    def find(self, path: str) -> dict[str, int]:
        """Walk the directory through descriptors, never into a symlink; only regular files are listed."""
        try:
            top = _open_directory(path)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        found: dict[str, int] = {}
        try:
            # fwalk opens each subdirectory relative to its parent's descriptor and checks it is the one it listed.
            for directory, _subdirectories, files, directory_fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                base = path if directory == "." else f"{path}/{directory[2:]}"
                for name in files:
                    try:
                        status = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # a concurrent write's temporary file, renamed away between listing and stat
                    if stat.S_ISREG(status.st_mode):
                        found[f"{base}/{name}"] = status.st_size
        finally:
            os.close(top)
        return found

    def delete(self, paths: Iterable[str]) -> None:
        """Delete the files, then the directories they leave empty (never the store's root)."""
        directories: set[str] = set()
        for path in paths:
            directory, name = os.path.split(path)
            try:
                parent = _open_directory(directory)
            except FileNotFoundError:
                continue
            try:
                # unlinkat never follows: a planted symlink goes, not its target.
                os.unlink(name, dir_fd=parent)
            except FileNotFoundError:
                continue
            finally:
                os.close(parent)
            directories.add(directory)
        # Deepest first, so a session directory goes before its tenant directory.
        for directory in sorted(directories, key=len, reverse=True):
            _remove_empty_directory(directory)


class PathCheckedLocalIO(_LocalDiskIO):
    """
    Local disk where the OS lacks the descriptor-relative calls `LocalIO` needs (Windows): a check, then the call.

    The real path must be the path built, or the access is refused; a swap between the check and the open can still
    redirect it, so give a store on such a system a directory nobody else writes to.
    """

    def put(self, path: str, data: bytes) -> None:
        """Write `data` to a temporary file beside `path`, then rename it into place (atomic on POSIX and Windows)."""
        self.put_chunks(path, (data,))

    def put_chunks(self, path: str, chunks: Iterable[Chunk]) -> None:
        """Write the chunks to a temporary file beside `path`, then rename it into place."""
        with _temporary_beside(path, chunks) as temporary:
            os.replace(temporary, path)

    def put_exclusive(self, path: str, data: bytes) -> None:
        """Write a temporary file, then hard-link it into place: the link fails if the name exists (any process)."""
        with _temporary_beside(path, (data,)) as temporary:
            os.link(temporary, path)

    def _open_for_read(self, path: str) -> BinaryIO:
        _refuse_redirected(path)
        return open(path, "rb")

    def get(self, path: str) -> bytes:
        """Return the file's content after checking that no symlink redirects the path."""
        _refuse_redirected(path)
        with open(path, "rb") as file:
            return file.read()

    def get_range(self, path: str, start: int, end: int) -> bytes:
        """Return part of the file after checking that no symlink redirects the path."""
        _refuse_redirected(path)
        with open(path, "rb") as file:
            file.seek(start)
            return file.read(max(0, end - start))

    def get_range_and_size(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        """Return part of the file and its size, from one open file."""
        _refuse_redirected(path)
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            file.seek(start)
            return file.read(max(0, end - start)), size

    def size(self, path: str) -> int:
        """Return the file's size after checking that no symlink redirects the path."""
        _refuse_redirected(path)
        return os.stat(path).st_size

    def find(self, path: str) -> dict[str, int]:
        """Walk the directory without following symlinks; symlinks themselves are skipped."""
        found: dict[str, int] = {}
        if not os.path.isdir(path):
            return found
        _refuse_redirected(path)
        for directory, _subdirectories, files in os.walk(path, followlinks=False):
            for name in files:
                full = os.path.join(directory, name)
                if not os.path.islink(full):
                    try:
                        found[full] = os.stat(full).st_size
                    except FileNotFoundError:
                        continue
        return found

    def delete(self, paths: Iterable[str]) -> None:
        """Delete the files (after the same check as reads), then the directories they leave empty."""
        directories: set[str] = set()
        for path in paths:
            _refuse_redirected(os.path.dirname(path))
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            directories.add(os.path.dirname(path))
        for directory in sorted(directories, key=len, reverse=True):
            try:
                os.rmdir(directory)
            except OSError:
                continue


class AsyncFilesystemIO(StorageIO):
    """Async fsspec filesystems: coroutines run on the caller's loop (a twin's) or on the filesystem's own loop."""

    def __init__(self, fs: AsyncFileSystem, *, loop_twins: LoopLocal[Self] | None = None) -> None:
        """
        :param fs: The async fsspec filesystem to use.
        :param loop_twins: Where async calls find a twin of this I/O on the caller's own loop (an
            ``asynchronous=True`` filesystem with the same settings), to use instead of hopping to `fs`'s loop; `None`
            to always run on `fs`'s loop.
        """
        super().__init__(fs)
        self.async_fs = fs
        self._loop_twins = loop_twins

    async def _run_async(
        self, operation: Callable[Concatenate[Self, P], Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        # On the caller's own loop with the loop's twin when there is one; else on the filesystem's loop.
        twins = self._twins_for_running_loop()
        if twins is not None:
            return await operation(await twins.get(), *args, **kwargs)
        return await self._on_fs_loop(operation(self, *args, **kwargs))

    def _twins_for_running_loop(self) -> LoopLocal[Self] | None:
        # fsspec's own loop (a sync call's coroutine, or a caller running there) keeps the filesystem's client.
        if self._loop_twins is not None and self.async_fs.loop is not asyncio.get_running_loop():
            return self._loop_twins
        return None

    async def _on_fs_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self.async_fs.asynchronous:
            # An `asynchronous=True` filesystem belongs to the loop its caller awaits it from (fsspec's contract).
            return await coroutine
        loop = self.async_fs.loop
        if loop is asyncio.get_running_loop():
            return await coroutine
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))

    async def _warm_up(self) -> None:
        set_session = getattr(self.async_fs, "set_session", None)
        if set_session is not None:
            await set_session()

    async def warm_up_async(self) -> None:
        """Create the client async calls from this loop use (s3fs makes it on first request otherwise)."""
        await self._run_async(type(self)._warm_up)

    async def ready_async(self) -> None:
        """Create the client async calls from the running loop use: the loop's own twin's, or the filesystem's."""
        twins = self._twins_for_running_loop()
        if twins is not None:
            await (await twins.get())._warm_up()
        else:
            # On fsspec's loop (every sync call runs there) the filesystem's own client serves: make it here too, or
            # the first sync call's time limit pays for creating it (seen: a first attempt timed out on a busy machine).
            await self._on_fs_loop(self._warm_up())

    async def _put(self, path: str, data: bytes) -> None:
        await self.async_fs._pipe_file(path, data)

    async def _put_exclusive(self, path: str, data: bytes) -> None:
        # s3fs sends If-None-Match: * (S3 answers 412 and s3fs raises FileExistsError when the key exists).
        await self.async_fs._pipe_file(path, data, mode="create")

    async def _get(self, path: str) -> bytes:
        return bytes(await self.async_fs._cat_file(path))

    async def _get_range(self, path: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        return bytes(await self.async_fs._cat_file(path, start=start, end=end))

    async def _size(self, path: str) -> int:
        return int((await self.async_fs._info(path))["size"])

    async def _get_range_and_size(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        size = await self._size(path)
        return (await self._get_range(path, start, end) if start < size else b""), size

    async def _find(self, path: str) -> dict[str, int]:
        found = await self.async_fs._find(path, detail=True)
        return {name: int(info.get("size") or 0) for name, info in found.items() if info.get("type") != "directory"}

    async def _delete(self, paths: list[str]) -> None:
        for path in paths:
            try:
                await self.async_fs._rm_file(path)
            except FileNotFoundError:
                continue

    async def _put_chunks(self, path: str, chunks: Iterable[Chunk]) -> None:
        # Backends other than S3: fsspec has no async streaming write to build on; one whole write.
        await self._put(path, b"".join(chunks))

    async def put_async(self, path: str, data: bytes) -> None:
        """Async `put`, on the caller's loop or the filesystem's."""
        await self._run_async(type(self)._put, path, data)

    async def put_chunks_async(self, path: str, chunks: Iterable[Chunk]) -> None:
        """Async `put_chunks`, on the caller's loop or the filesystem's (the chunks are iterated there)."""
        await self._run_async(type(self)._put_chunks, path, chunks)

    async def put_exclusive_async(self, path: str, data: bytes) -> None:
        """Async `put_exclusive`, on the caller's loop or the filesystem's."""
        await self._run_async(type(self)._put_exclusive, path, data)

    async def get_async(self, path: str) -> bytes:
        """Async `get`, on the caller's loop or the filesystem's."""
        return await self._run_async(type(self)._get, path)

    async def get_range_async(self, path: str, start: int, end: int) -> bytes:
        """Async `get_range`, on the caller's loop or the filesystem's."""
        return await self._run_async(type(self)._get_range, path, start, end)

    async def get_range_and_size_async(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        """Async `get_range_and_size`, on the caller's loop or the filesystem's."""
        return await self._run_async(type(self)._get_range_and_size, path, start, end)

    async def size_async(self, path: str) -> int:
        """Async `size`, on the caller's loop or the filesystem's."""
        return await self._run_async(type(self)._size, path)

    async def find_async(self, path: str) -> dict[str, int]:
        """Async `find`, on the caller's loop or the filesystem's."""
        return await self._run_async(type(self)._find, path)

    async def delete_async(self, paths: Iterable[str]) -> None:
        """Async `delete`, on the caller's loop or the filesystem's."""
        await self._run_async(type(self)._delete, list(paths))


class S3IO(AsyncFilesystemIO):
    """
    S3 through s3fs, held to one request per write, whole read or page.

    A write from chunks (`put_chunks`) above `MULTIPART_THRESHOLD` is a multipart upload through s3fs's client (as
    s3fs's own ``_pipe_file`` does it for large ``bytes``), its parts made from the chunks as they come, so the whole
    content never exists twice; a failed or cancelled upload is aborted.
    """

    async def _put_chunks(self, path: str, chunks: Iterable[Chunk]) -> None:
        parts = _parts(chunks, MULTIPART_PART_BYTES)
        head, rest = _leading(parts, MULTIPART_THRESHOLD)
        if rest is None:
            # Up to MULTIPART_THRESHOLD: one PUT (joining the parts is a copy of at most that much).
            await self._put(path, b"".join(head))
            return
        await self._multipart_upload(path, drained(head, rest))

    async def _multipart_upload(self, path: str, parts: Iterable[bytes]) -> None:
        fs = self.async_fs
        bucket, key, _ = fs.split_path(path)
        upload_id = (await fs._call_s3("create_multipart_upload", Bucket=bucket, Key=key))["UploadId"]
        sent: list[dict[str, Any]] = []

        async def send(number: int, body: bytes) -> None:
            answer = await fs._call_s3(
                "upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
            )
            sent.append({"PartNumber": number, "ETag": answer["ETag"]})

        running: set[asyncio.Future[None]] = set()
        try:
            for number, body in enumerate(parts, start=1):
                # At most MULTIPART_PARTS_IN_FLIGHT parts in memory at once; the first failure stops the upload.
                while len(running) >= MULTIPART_PARTS_IN_FLIGHT:
                    finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    for task in finished:
                        task.result()
                running.add(asyncio.ensure_future(send(number, body)))
                del body  # the task holds it; nothing here should keep a sent part alive
            while running:
                finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    task.result()
            sent.sort(key=lambda part: int(part["PartNumber"]))
            await fs._call_s3(
                "complete_multipart_upload",
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": sent},
            )
        except BaseException:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await self._abort_upload(bucket, key, upload_id)
            raise
        finally:
            fs.invalidate_cache(path)

    async def _abort_upload(self, bucket: str, key: str, upload_id: str) -> None:
        # Uploaded parts are billed until aborted, and a part request cancelled on our side may still land after the
        # abort (AWS: abort again until ListParts shows none). Bounded: what is left goes to the lifecycle rule.
        fs = self.async_fs
        for attempt in range(_ABORT_ATTEMPTS):
            with contextlib.suppress(Exception):
                await fs._call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
            try:
                listed = await fs._call_s3("list_parts", Bucket=bucket, Key=key, UploadId=upload_id)
            except FileNotFoundError:
                return  # NoSuchUpload: aborted, no part left
            except Exception:
                listed = None  # could not look: abort again
            if listed is not None and not listed.get("Parts"):
                return
            await asyncio.sleep(0.05 * 2**attempt)
        logger.warning(
            "Could not abort the multipart upload of %s/%s: its parts are left to the lifecycle rule.", bucket, key
        )

    async def _put_exclusive(self, path: str, data: bytes) -> None:
        # Always one PUT, whatever the size: s3fs sends a large conditional create as a multipart upload, and some
        # servers (Ceph RGW) ignore If-None-Match on CompleteMultipartUpload. The status decides "exists": s3fs
        # raises FileExistsError only when the 412's body names the condition, which RGW's does not.
        bucket, key, _ = self.async_fs.split_path(path)
        try:
            await self.async_fs._call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except OSError as error:
            if s3_status(error) == 412:
                raise FileExistsError(errno.EEXIST, "The object already exists.") from error
            raise
        finally:
            self.async_fs.invalidate_cache(path)

    async def _size(self, path: str) -> int:
        # One HEAD, never s3fs's listing cache: another worker may have written or deleted the key since we listed.
        return int((await self.async_fs._info(path, refresh=True))["size"])

    async def _get(self, path: str) -> bytes:
        # With s3fs's default max_concurrency (10), `_cat_file` first HEADs the object to plan parallel ranged reads.
        # A tool result is read whole in one GET.
        return bytes(await self.async_fs._cat_file(path, max_concurrency=1))

    async def _get_range_and_size(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        # The total size comes back in the ranged GET's own Content-Range header ("bytes 0-9999/209715200"), so a page
        # with its "of N bytes" costs one request, not a HEAD and a GET.
        if end > start:
            bucket, key, _ = self.async_fs.split_path(path)
            try:
                response = await self.async_fs._call_s3(
                    "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}"
                )
            except OSError as error:
                if not _is_unsatisfiable_range(error):
                    raise
                # 416: the range starts at or past the end (or the object is empty); only the size is left to learn.
            else:
                try:
                    data = bytes(await response["Body"].read())
                finally:
                    response["Body"].close()
                total = _content_range_total(response.get("ContentRange"))
                if total is not None:
                    return data, total
                # No Content-Range: the server ignored the Range header and sent the whole object.
                return data[start:end], len(data)
        return b"", await self._size(path)

    async def _delete(self, paths: list[str]) -> None:
        for start in range(0, len(paths), _S3_DELETE_BATCH):
            batch = paths[start : start + _S3_DELETE_BATCH]
            bucket = self.async_fs.split_path(batch[0])[0]
            objects = [{"Key": self.async_fs.split_path(path)[1]} for path in batch]
            # s3fs's `_bulk_delete` drops per-key errors; a purge that silently keeps data is worse than one that fails.
            response = await self.async_fs._call_s3(
                "delete_objects", Bucket=bucket, Delete={"Objects": objects, "Quiet": True}
            )
            errors = response.get("Errors") or []
            if errors:
                codes = sorted({str(error.get("Code")) for error in errors})
                message = f"{len(errors)} of {len(batch)} objects could not be deleted ({', '.join(codes)})."
                if "AccessDenied" in codes:
                    raise StoragePermissionError(message)
                raise StorageError(message)
            for path in batch:
                self.async_fs.invalidate_cache(path)


def _parts(chunks: Iterable[Chunk], part_bytes: int) -> Iterator[bytes]:
    """
    Group `chunks` into parts of `part_bytes` to ``2 * part_bytes`` bytes (the last may be smaller), copying little.

    A `bytes` chunk that makes a part by itself is passed on as it is (an encoded text chunk of `part_bytes` or more
    does); a larger one is cut into ``part_bytes`` slices; smaller pieces are joined (one copy of one part). Parts are
    `bytes`: aiohttp warns about (and the suite fails on) large `bytearray` bodies.
    """
    pieces: list[memoryview] = []
    size = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        for start in range(0, view.nbytes, part_bytes):
            piece = view[start : start + part_bytes]
            pieces.append(piece)
            size += piece.nbytes
            if size >= part_bytes:
                yield _joined(pieces)
                pieces, size = [], 0
    if pieces:
        yield _joined(pieces)


def _joined(pieces: list[memoryview]) -> bytes:
    # One piece covering a whole bytes object is that object: no copy.
    if len(pieces) == 1 and isinstance(pieces[0].obj, bytes) and pieces[0].nbytes == len(pieces[0].obj):
        return pieces[0].obj
    return b"".join(pieces)


def _leading(parts: Iterator[bytes], limit: int) -> tuple[list[bytes], Iterator[bytes] | None]:
    """
    The first parts while they total at most `limit` bytes, and the rest (None when there is no more).

    Decides between one PUT and a multipart upload without knowing the total: at most `limit` plus one part is read
    ahead.
    """
    head: list[bytes] = []
    size = 0
    for part in parts:
        head.append(part)
        size += len(part)
        if size > limit:
            return head, parts
    return head, None


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


def _protocols(fs: AbstractFileSystem) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _content_range_total(content_range: object) -> int | None:
    """Return the total size from a ``Content-Range: bytes 0-9/100`` value, or None when absent or unknown (``*``)."""
    if not isinstance(content_range, str) or "/" not in content_range:
        return None
    total = content_range.rsplit("/", 1)[1].strip()
    return int(total) if total.isdigit() else None


def s3_status(error: BaseException) -> int | None:
    """
    The HTTP status behind an s3fs error (s3fs maps several statuses to one errno, and some by the body's text).

    :param error: An exception s3fs raised, chained to botocore's ``ClientError``.
    :returns: The status, or None if the error carries no S3 answer.
    """
    response = getattr(error.__cause__, "response", None) or getattr(error, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def _is_unsatisfiable_range(error: OSError) -> bool:
    """Whether s3fs's error is S3's 416 InvalidRange (s3fs maps it to a plain EINVAL, shared with other codes)."""
    response = getattr(error.__cause__, "response", None) or {}
    return bool(s3_status(error) == 416 or response.get("Error", {}).get("Code") == "InvalidRange")


# Descriptor-relative calls LocalIO needs (os.replace takes the same dir_fd arguments as os.rename).
_AT_CALLS = (
    all(hasattr(os, flag) for flag in ("O_DIRECTORY", "O_NOFOLLOW", "O_CLOEXEC"))
    and {os.open, os.stat, os.mkdir, os.rmdir, os.unlink, os.rename, os.link} <= os.supports_dir_fd
    and os.link in os.supports_follow_symlinks  # a temporary file swapped for a symlink is linked as the symlink
    and hasattr(os, "fwalk")
)
# O_PATH (Linux): walking a directory needs only search permission on it, as path resolution does, and a symlink
# opens as itself, so fstat tells a symlink from a file without a second look that a swap could race. Elsewhere
# O_DIRECTORY | O_NOFOLLOW fails on a symlink (ELOOP).
_O_PATH = getattr(os, "O_PATH", 0)
_DIRECTORY_FLAGS = getattr(os, "O_NOFOLLOW", 0) | (_O_PATH or os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
# O_NONBLOCK: opening a FIFO planted under a result's name must not hang the reader (it is then refused).
_FILE_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_SYMLINK_REFUSED = "The path of this result passes through a symlink; refusing to follow it."


def _open_directory(path: str, *, create: bool = False) -> int:
    """
    Open the directory `path` (absolute) from ``/``, one component at a time, never following a symlink.

    :param path: The directory.
    :param create: Create missing directories on the way.
    :returns: A descriptor of the directory; the caller closes it.
    :raises InvalidReferenceError: If a component is a symlink (or ``.``/``..``).
    :raises FileNotFoundError: If a component is missing (and `create` is false).
    """
    descriptor = os.open("/", _DIRECTORY_FLAGS | os.O_CLOEXEC)
    try:
        for name in path.split("/"):
            if not name:
                continue
            if name in {".", ".."}:
                raise InvalidReferenceError("A local path must not contain '.' or '..' components.")
            child = _open_child_directory(descriptor, name, create=create)
            os.close(descriptor)
            descriptor = child
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _open_child_directory(parent: int, name: str, *, create: bool) -> int:
    try:
        return _open_directory_at(parent, name)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):  # another writer made it first
        os.mkdir(name, dir_fd=parent)
    return _open_directory_at(parent, name)  # checked again: it may have been swapped since the mkdir


def _open_directory_at(parent: int, name: str) -> int:
    try:
        descriptor = os.open(name, _DIRECTORY_FLAGS | os.O_CLOEXEC, dir_fd=parent)
    except OSError as error:
        _refuse_symlink(parent, name, error)
        raise
    if _O_PATH:
        # O_PATH opened whatever the name is: a symlink itself, a file, a directory. Only a directory goes on.
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISDIR(mode):
            os.close(descriptor)
            if stat.S_ISLNK(mode):
                raise InvalidReferenceError(_SYMLINK_REFUSED)
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), name)
    return descriptor


def _refuse_symlink(directory: int, name: str, error: OSError) -> None:
    """Raise `InvalidReferenceError` from `error` when `name` is a symlink: what ``O_NOFOLLOW`` just refused."""
    if error.errno == errno.ELOOP:
        raise InvalidReferenceError(_SYMLINK_REFUSED) from error
    try:
        status = os.stat(name, dir_fd=directory, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISLNK(status.st_mode):
        raise InvalidReferenceError(_SYMLINK_REFUSED) from error


def _open_file(path: str) -> BinaryIO:
    """
    Open a file for reading without following a symlink anywhere along `path`, and check what was opened.

    :param path: The file's absolute path.
    :returns: The open file.
    :raises InvalidReferenceError: If the path passes through a symlink, or the file is not a regular file with one
        link (see `LocalIO`).
    :raises FileNotFoundError: If there is no such file.
    """
    directory, name = os.path.split(path)
    parent = _open_directory(directory)
    try:

        def opener(file: str, flags: int) -> int:
            try:
                return os.open(file, flags | _FILE_FLAGS, dir_fd=parent)
            except OSError as error:
                _refuse_symlink(parent, file, error)
                raise

        file = open(name, "rb", opener=opener)  # noqa: SIM115 - returned to the caller, who closes it
        try:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise InvalidReferenceError("This result is not a regular file; refusing to read it.")
            _check_links(file.fileno(), parent, status)
        except BaseException:
            file.close()
            raise
    finally:
        os.close(parent)
    return file


def _check_links(descriptor: int, directory: int, status: os.stat_result) -> None:
    """Refuse a hard-linked file, unless its only other link is a conditional create's temporary file beside it."""
    if status.st_nlink == 1:
        return
    # Publishing: put_exclusive links its temporary file into place, then unlinks it. Look for that temporary file,
    # and if it is gone, ask again: its unlink may have happened since the first look.
    if status.st_nlink == 2 and (_has_temporary_twin(directory, status) or os.fstat(descriptor).st_nlink == 1):
        return
    raise InvalidReferenceError("This result is a hard link to another file; refusing to read it.")


def _has_temporary_twin(directory: int, status: os.stat_result) -> bool:
    listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=directory)
    try:
        names = os.listdir(listing)
    finally:
        os.close(listing)
    for name in names:
        if not is_temporary_name(name):
            continue
        try:
            other = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if (other.st_dev, other.st_ino) == (status.st_dev, status.st_ino):
            return True
    return False


def _write_temporary(directory: int, chunks: Iterable[Chunk]) -> str:
    """Write `chunks` to a fresh temporary file in `directory` and return its name."""
    # A leading dot keeps the temporary file out of listings: it is not a valid result name.
    name = new_temporary_name()

    def opener(file: str, flags: int) -> int:
        return os.open(file, flags | _FILE_FLAGS, 0o666, dir_fd=directory)

    try:
        with open(name, "xb", opener=opener) as file:
            for chunk in chunks:
                file.write(chunk)
    except BaseException:
        _unlink_quietly(directory, name)
        raise
    return name


def _read_and_close(file: BinaryIO) -> bytes:
    with file:
        return file.read()


def _unlink_quietly(directory: int, name: str) -> None:
    # After a rename there is nothing left to remove; after a link or a failure there is.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=directory)


def _remove_empty_directory(path: str) -> None:
    parent_path, name = os.path.split(path)
    try:
        parent = _open_directory(parent_path)
    except (OSError, InvalidReferenceError):
        return
    try:
        os.rmdir(name, dir_fd=parent)  # fails on a symlink or a directory that is not empty: both are kept
    except OSError:
        pass
    finally:
        os.close(parent)


@contextlib.contextmanager
def _temporary_beside(path: str, chunks: Iterable[Chunk]) -> Iterator[str]:
    """Write `chunks` to a fresh temporary file in `path`'s directory, yield its name, and remove it afterwards."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    _refuse_redirected(directory)
    temporary = os.path.join(directory, new_temporary_name())
    try:
        with open(temporary, "xb") as file:
            for chunk in chunks:
                file.write(chunk)
        yield temporary
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _refuse_redirected(path: str) -> None:
    """Refuse a local path that a symlink anywhere along it sends elsewhere (the root itself is already real)."""
    if os.path.realpath(path) != path:
        raise InvalidReferenceError(_SYMLINK_REFUSED)


def s3_io_with_loop_twins(fs: AsyncFileSystem, make_twin: Callable[[], AsyncFileSystem]) -> S3IO:
    """
    An `S3IO` whose async calls run on the caller's own loop, each loop with its own client.

    The twins share one aiobotocore session (`_SharedSessions`): a new loop's client then skips loading and parsing
    botocore's S3 model and resolving credentials again, which is most of what a first call on a new loop costs. Only
    the client, whose aiohttp connector belongs to its loop, is made per loop.

    :param fs: The s3fs filesystem for sync calls (and calls from fsspec's own loop).
    :param make_twin: Builds an ``asynchronous=True`` s3fs filesystem with the same settings, for the running loop.
    :returns: The I/O.
    """
    sessions = _SharedSessions()
    twins: LoopLocal[S3IO] = LoopLocal(
        lambda: S3IO(sessions.attach(make_twin())), _close_s3_client, _close_s3_client_now
    )
    return S3IO(fs, loop_twins=twins)


class _SharedSessions:
    """Gives every loop twin of one store the same aiobotocore session, made from the first twin's settings."""

    def __init__(self) -> None:
        self._session: Any = None
        self._lock = threading.Lock()

    def attach(self, fs: AsyncFileSystem) -> AsyncFileSystem:
        """Set `fs`'s session to the shared one, unless it has one already (a ``session`` storage option)."""
        if getattr(fs, "session", _NO_SESSION_ATTRIBUTE) is not None:
            return fs  # not s3fs, or the caller's own session: used as given
        with self._lock:
            if self._session is None:
                # What s3fs itself would make (its extra keyword arguments, e.g. ``profile``, go to the session).
                self._session = _shared_session_class()(**getattr(fs, "kwargs", {}))
            session = self._session
        fs.session = session
        fs._session_is_owned = False  # so s3fs never replaces it with one of the twin's own
        return fs


_NO_SESSION_ATTRIBUTE = object()


@functools.cache
def _shared_session_class() -> type:
    """An aiobotocore session that clients on several event loops (and threads) may share."""
    from aiobotocore.credentials import AioRefreshableCredentials  # s3fs's dependency: only needed with s3fs
    from aiobotocore.session import AioSession

    class SharedAioSession(AioSession):  # type: ignore[misc]
        """
        `AioSession`, made safe to share across loops.

        Client creation is serialized (botocore sessions are not safe to build clients from concurrently: lazily made
        components race), and refreshable credentials, shared by every client, get a `CrossLoopLock` instead of
        their `asyncio.Lock`, which would bind to the first loop that waits on a refresh and fail on any other.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._creating_client = CrossLoopLock()

        async def _create_client(self, *args: Any, **kwargs: Any) -> Any:
            async with self._creating_client:
                return await super()._create_client(*args, **kwargs)

        async def get_credentials(self) -> Any:
            credentials = await super().get_credentials()
            if isinstance(credentials, AioRefreshableCredentials) and isinstance(
                getattr(credentials, "_refresh_lock", None), asyncio.Lock
            ):
                credentials._refresh_lock = CrossLoopLock()
            return credentials

    return SharedAioSession


async def _close_s3_client(io: StorageIO) -> None:
    creator = getattr(io.fs, "_s3creator", None)  # set by s3fs once the client exists
    if creator is not None:
        await creator.__aexit__(None, None, None)


def _close_s3_client_now(io: StorageIO, loop: asyncio.AbstractEventLoop) -> None:
    creator = getattr(io.fs, "_s3creator", None)
    if creator is not None:
        # s3fs's own finalizer for its sync instances: closes the connection pool without the (closed) loop.
        type(io.fs).close_session(loop, creator)


def storage_io_for(fs: AbstractFileSystem) -> StorageIO:
    """
    Pick the I/O strategy for a filesystem.

    :param fs: An fsspec filesystem.
    :returns: The `StorageIO` that serves it.
    """
    protocols = _protocols(fs)
    if "s3" in protocols:
        return S3IO(fs)
    if isinstance(fs, AsyncFileSystem):
        return AsyncFilesystemIO(fs)
    if "file" in protocols or "local" in protocols:
        return LocalIO(fs) if _AT_CALLS else PathCheckedLocalIO(fs)
    return SyncFilesystemIO(fs)
