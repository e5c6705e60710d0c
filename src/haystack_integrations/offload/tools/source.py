"""
Byte ranges of one stored result, from whichever store the run brought.

`RangedSource` serves stores with ranged reads, `FileSource` Haystack's `FileSystemToolResultStore`, and
`WholeSource` any other `ToolResultStore`; `drive` and `drive_async` serve the readers from them, and `ServedBytes`
adds up what a reader was served.
"""

import asyncio
import contextlib
import inspect
import os
import stat
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, TypeVar

from haystack.hooks.tool_result_offloading import FileSystemToolResultStore
from haystack.hooks.tool_result_offloading.types import ToolResultStore

from haystack_integrations.offload.compat import resolve_in_root
from haystack_integrations.offload.stores.names import parse_object_name
from haystack_integrations.offload.tools.binary import mime_from_key
from haystack_integrations.offload.tools.readahead import MAX_IN_FLIGHT, ReadAhead, ScanRange
from haystack_integrations.offload.types import RangedResults

Kind = Literal["text", "bytes"]
T = TypeVar("T")

# What the readers yield (a byte range to read, or one range of a sequential scan) and are sent back (the bytes and
# the result's total size).
RangeRequest = tuple[int, int] | ScanRange
RangeReply = tuple[bytes, int]
Reader = Generator[RangeRequest, RangeReply, T]

# A reply at least this large (a search chunk, an image) is processed in a worker thread in async runs: decoding and
# matching a megabyte takes milliseconds that the event loop should spend on other runs. A page is handled inline.
OFF_LOOP_BYTES = 256 * 1024


class ResultSource:
    """Byte ranges of one result, its kind (text or bytes) and the writer's key, when known."""

    kind: Kind | None = None
    key: str | None = None
    read_ahead = False
    """Whether a range costs a request to storage, so a scan is worth reading ahead (not for a result in memory)."""

    def open(self) -> None:
        """Do whatever must happen before `kind` is known (nothing, for ranged sources)."""

    async def open_async(self) -> None:
        """Async `open`."""

    def read(self, start: int, end: int) -> RangeReply:
        """
        Read a byte range.

        :param start: First byte.
        :param end: One past the last byte.
        :returns: The bytes (short at the end) and the result's total size.
        """
        raise NotImplementedError

    async def read_async(self, start: int, end: int) -> RangeReply:
        """
        Async `read`.

        :param start: First byte.
        :param end: One past the last byte.
        :returns: The bytes and the result's total size.
        """
        raise NotImplementedError


class RangedSource(ResultSource):
    """
    A result in a store with ranged reads (`RangedResults`), read range by range.

    The kind is a hint taken from the reference: `FsspecToolResultStore`'s names carry it (and the writer's key); any
    other reference is read as bytes when its extension names a non-text MIME type (``.png``), else as text, as
    `FileSource` does.
    """

    read_ahead = True

    def __init__(self, store: RangedResults, reference: str) -> None:
        """
        :param store: The run's store.
        :param reference: The reference, as the model gave it; the store validates it on every read.
        """
        self._store = store
        self._reference = reference
        # Only a hint for what to fetch: the store refuses anything that is not one of its names on the first read.
        parsed = parse_object_name(reference.rsplit("/", 1)[-1])
        if parsed is not None:
            self.kind, self.key = parsed.kind, parsed.key
        else:
            mime = mime_from_key(reference)
            self.kind = "bytes" if mime is not None and not textual_mime(mime) else "text"
            self.key = reference

    def read(self, start: int, end: int) -> RangeReply:
        """
        Read a byte range: one ranged GET on S3.

        :param start: First byte.
        :param end: One past the last byte.
        :returns: The bytes and the result's total size.
        """
        return self._store.read_range_and_size(self._reference, start, end)

    async def read_async(self, start: int, end: int) -> RangeReply:
        """
        Async `read`, never blocking the event loop.

        :param start: First byte.
        :param end: One past the last byte.
        :returns: The bytes and the result's total size.
        """
        return await self._store.read_range_and_size_async(self._reference, start, end)


class FileSource(ResultSource):
    """
    A result in Haystack's `FileSystemToolResultStore`, read range by range from its file.

    The reference goes through the store's own containment check (`_resolve_in_root`, what its `read` uses) on every
    range, so exactly the references its `read` accepts are read, from the same file. The file is then opened without
    following a symlink in its last component and must be a regular file (a planted FIFO would otherwise block).

    The kind comes from the reference's extension, as Haystack's hook writes them: text blocks as ``.txt``, binary
    blocks with their MIME type's extension. Any extension of a non-text MIME type (``.png``, ``.bin``) is read as
    bytes, which are still paged as text when they turn out to be UTF-8; everything else is paged as text.
    """

    read_ahead = True

    def __init__(self, store: FileSystemToolResultStore, reference: str) -> None:
        """
        :param store: The run's store.
        :param reference: The reference, as the model gave it; the store's containment check runs on every read.
        """
        self._store = store
        self._reference = reference
        self.key = reference
        mime = mime_from_key(reference)
        self.kind = "bytes" if mime is not None and not textual_mime(mime) else "text"

    def read(self, start: int, end: int) -> RangeReply:
        """
        Read a byte range: one seek and one read of at most ``end - start`` bytes.

        :param start: First byte.
        :param end: One past the last byte.
        :returns: The bytes and the result's total size.
        :raises ValueError: If the reference resolves outside the store's root, or to something not a regular file.
        :raises FileNotFoundError: If no file is stored under the reference.
        """
        # Haystack's own containment check (a private method, through compat), so ours cannot drift from its read's.
        path = resolve_in_root(self._store, self._reference)
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        with open(os.open(path, flags), "rb") as file:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise ValueError("Result reference does not name a regular file.")
            file.seek(start)
            return file.read(max(0, end - start)), status.st_size

    async def read_async(self, start: int, end: int) -> RangeReply:
        """
        Async `read`, in a worker thread: disk reads block.

        :param start: First byte.
        :param end: One past the last byte.
        :returns: The bytes and the result's total size.
        """
        return await asyncio.to_thread(self.read, start, end)


def textual_mime(mime: str | None) -> bool:
    """
    Whether a MIME type names text that paging and search can show as it is.

    :param mime: A MIME type, or None.
    :returns: True for ``text/*``, JSON, XML and NDJSON.
    """
    return mime is not None and (
        mime.startswith("text/") or mime in {"application/json", "application/xml", "application/x-ndjson"}
    )


class WholeSource(ResultSource):
    """A result in any other `ToolResultStore`, read whole once and sliced in memory."""

    def __init__(self, store: ToolResultStore, reference: str) -> None:
        """
        :param store: The run's store.
        :param reference: The reference, as the model gave it; the store decides whether it may be read.
        """
        self._store = store
        self._reference = reference
        self._data = b""
        self.key = reference

    def _keep(self, content: str | bytes) -> None:
        if isinstance(content, str):
            self._data, self.kind = content.encode("utf-8", "surrogatepass"), "text"
        elif isinstance(content, bytes | bytearray | memoryview):
            self._data, self.kind = bytes(content), "bytes"
        else:
            raise TypeError(f"The store returned {type(content).__name__}, not text or bytes.")

    def open(self) -> None:
        """Read the whole result."""
        self._keep(self._store.read(self._reference))

    async def open_async(self) -> None:
        """Read the whole result with the store's `read_async` if it has one, else in a worker thread."""
        read_async: Any = getattr(self._store, "read_async", None)
        if read_async is not None and inspect.iscoroutinefunction(read_async):
            self._keep(await read_async(self._reference))
        else:
            self._keep(await asyncio.to_thread(self._store.read, self._reference))

    def read(self, start: int, end: int) -> RangeReply:
        """
        Slice the result read by `open`.

        :param start: First byte.
        :param end: One past the last byte.
        :returns: The bytes and the result's total size.
        """
        return self._data[start:end], len(self._data)

    async def read_async(self, start: int, end: int) -> RangeReply:
        """
        Async `read` (in memory: no I/O).

        :param start: First byte.
        :param end: One past the last byte.
        :returns: The bytes and the result's total size.
        """
        return self.read(start, end)


def source_for(store: ToolResultStore, reference: str) -> ResultSource:
    """
    Pick how to read a result from the run's store.

    :param store: The run's store.
    :param reference: The reference the model gave.
    :returns: A ranged source for a store with ranged reads (`RangedResults`: `FsspecToolResultStore`, or a third
        party's) or Haystack's `FileSystemToolResultStore`, a whole-read source for any other store.
    """
    if isinstance(store, RangedResults):
        return RangedSource(store, reference)
    # A subclass that changes how a result is read (decrypting, say) keeps its own read: only the file as written is
    # known to be the result.
    if isinstance(store, FileSystemToolResultStore) and type(store).read is FileSystemToolResultStore.read:
        return FileSource(store, reference)
    return WholeSource(store, reference)


class ServedBytes:
    """The bytes of a result one reader was served: what one read-back call read for the model (for its metrics)."""

    def __init__(self) -> None:
        self.total = 0

    def tally(self, reader: Reader[T]) -> Reader[T]:
        """
        Pass `reader`'s ranges and their replies through unchanged, adding up the bytes of each reply.

        Counted as the reader gets them, not as fetched: bytes read ahead that a search never reached, or the rest of a
        result a whole-read store returned, are not part of what the call read.

        :param reader: The reader to serve.
        :returns: A reader that asks for the same ranges and returns what `reader` returns.
        """
        try:
            request = next(reader)
        except StopIteration as stop:
            result: T = stop.value
            return result
        while True:
            reply = yield request
            self.total += len(reply[0])
            try:
                request = reader.send(reply)
            except StopIteration as stop:
                result = stop.value
                return result


def _step(reader: Reader[T], reply: RangeReply) -> tuple[bool, Any]:
    # StopIteration cannot cross a thread boundary (asyncio.to_thread), so the end of a reader becomes a flag.
    try:
        return False, reader.send(reply)
    except StopIteration as stop:
        return True, stop.value


def drive(reader: Reader[T], source: ResultSource) -> T:
    """
    Run a reader to completion, serving each range it asks for from `source`.

    A scan's ranges are read ahead in a small thread pool (see `ThreadedScan`) while this thread decodes and matches.

    :param reader: A generator that yields byte ranges and returns its result.
    :param source: Where the bytes come from.
    :returns: What the reader returns.
    """
    with ThreadedScan(source) as ranges:
        done, value = _first(reader)
        while not done:
            done, value = _step(reader, ranges.read(value))
    result: T = value
    return result


async def drive_async(reader: Reader[T], source: ResultSource) -> T:
    """
    Async `drive`: each range is awaited (a scan's ranges read ahead as tasks, see `TaskScan`), and large chunks
    (search) are decoded and matched in a worker thread, so the event loop keeps serving other runs meanwhile.

    :param reader: A generator that yields byte ranges and returns its result.
    :param source: Where the bytes come from.
    :returns: What the reader returns.
    """
    ranges = TaskScan(source)
    try:
        done, value = _first(reader)
        while not done:
            reply = await ranges.read(value)
            if len(reply[0]) >= OFF_LOOP_BYTES:
                done, value = await asyncio.to_thread(_step, reader, reply)
            else:
                done, value = _step(reader, reply)
    finally:
        await ranges.close()
    result: T = value
    return result


def _first(reader: Reader[T]) -> tuple[bool, Any]:
    try:
        return False, next(reader)
    except StopIteration as stop:
        return True, stop.value


class ThreadedScan(contextlib.AbstractContextManager["ThreadedScan"]):
    """
    Serve a reader's ranges in a sync run, a scan's from ranges read ahead in a thread pool of `MAX_IN_FLIGHT`.

    Threads rather than sequential larger ranges: a ranged GET's time is mostly waiting (a round trip, then a
    connection's share of bandwidth), which only overlapping requests hides, and the scan's decoding and matching runs
    on this thread meanwhile. The store is already called from several threads at once (Haystack's `ToolInvoker` runs
    a step's sync tool calls in a thread pool), and on s3fs a sync call only waits for fsspec's I/O thread. The pool
    starts with the scan's second range, so a page or a one-chunk search starts no thread.
    """

    def __init__(self, source: ResultSource) -> None:
        """
        :param source: Where the bytes come from.
        """
        self._source = source
        self._pool: ThreadPoolExecutor | None = None
        self._window: ReadAhead[Future[RangeReply]] | None = None

    def read(self, request: RangeRequest) -> RangeReply:
        """
        Read what a reader asked for.

        :param request: A range, or a range of a scan.
        :returns: The bytes and the result's total size.
        """
        if not isinstance(request, ScanRange):
            return self._source.read(*request)
        if not self._source.read_ahead:
            return self._source.read(request.start, request.end)
        segments = self._window.plan(request.start, request.end) if self._window is not None else None
        if segments is None or self._window is None:
            # The scan's first range (or one the window cannot serve): read alone; the reply gives the size.
            self._cancel()
            reply = self._source.read(request.start, request.end)
            self._window = ReadAhead(self._submit, start=request.start, first=reply, done=_done, until=request.until)
            return reply
        return self._window.assemble(request.start, request.end, [(s, s.fetch.result()) for s in segments])

    def _submit(self, start: int, end: int) -> "Future[RangeReply]":
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=MAX_IN_FLIGHT, thread_name_prefix="offload-read-ahead")
        return self._pool.submit(self._source.read, start, end)

    def _cancel(self) -> None:
        if self._window is not None:
            for fetch in self._window.pending():
                fetch.cancel()  # a read already running finishes in its thread, unused
            self._window = None

    def __exit__(self, *exc_info: object) -> None:
        self._cancel()
        if self._pool is not None:
            # Do not wait for a read that is no longer needed: the tool's reply goes out now.
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class TaskScan:
    """Serve a reader's ranges in an async run, a scan's from ranges read ahead as tasks (`MAX_IN_FLIGHT` at most)."""

    def __init__(self, source: ResultSource) -> None:
        """
        :param source: Where the bytes come from.
        """
        self._source = source
        self._window: ReadAhead[asyncio.Future[RangeReply]] | None = None

    async def read(self, request: RangeRequest) -> RangeReply:
        """
        Read what a reader asked for.

        :param request: A range, or a range of a scan.
        :returns: The bytes and the result's total size.
        """
        if not isinstance(request, ScanRange):
            return await self._source.read_async(*request)
        if not self._source.read_ahead:
            return await self._source.read_async(request.start, request.end)
        segments = self._window.plan(request.start, request.end) if self._window is not None else None
        if segments is None or self._window is None:
            await self.close()
            reply = await self._source.read_async(request.start, request.end)
            self._window = ReadAhead(
                self._start, start=request.start, first=reply, done=_done_async, until=request.until
            )
            return reply
        return self._window.assemble(request.start, request.end, [(s, await s.fetch) for s in segments])

    def _start(self, start: int, end: int) -> "asyncio.Future[RangeReply]":
        return asyncio.ensure_future(self._source.read_async(start, end))

    async def close(self) -> None:
        """Cancel the reads ahead that are no longer needed (the scan stopped, or failed), and wait until they end."""
        if self._window is not None:
            pending = list(self._window.pending())
            self._window = None
            for task in pending:
                task.cancel()
            # Awaited, not left to run down: a task still cancelling when its loop closes is destroyed mid-request
            # (aiobotocore then fails to reset its context). A read that failed before it was cancelled is dropped here.
            await asyncio.gather(*pending, return_exceptions=True)


def _done(reply: RangeReply) -> "Future[RangeReply]":
    future: Future[RangeReply] = Future()
    future.set_result(reply)
    return future


def _done_async(reply: RangeReply) -> "asyncio.Future[RangeReply]":
    future: asyncio.Future[RangeReply] = asyncio.get_running_loop().create_future()
    future.set_result(reply)
    return future
