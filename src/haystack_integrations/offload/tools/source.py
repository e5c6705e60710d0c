"""
Byte ranges of one stored result, from whichever store the run brought.

- `RangedSource` serves an `FsspecToolResultStore`: every range is one `read_range_and_size` call (one ranged GET on
  S3), and the content kind (text or bytes) and the writer's key come from the reference itself, with no request.
- `WholeSource` serves any other Haystack `ToolResultStore`, which only has `read(reference)`: the result is read
  whole once per tool call and sliced in memory. Paging still works, it just moves the whole result each call.

Both hand the readers in `read_tool_result` the same ``(bytes, total_size)`` pairs, so paging and search are written
once (as generators that yield ranges, see `drive` and `drive_async`).
"""

import asyncio
import inspect
from collections.abc import Generator
from typing import Any, Literal, TypeVar

from haystack.hooks.tool_result_offloading.types import ToolResultStore

from haystack_integrations.offload.stores import FsspecToolResultStore
from haystack_integrations.offload.stores.names import parse_object_name

Kind = Literal["text", "bytes"]
T = TypeVar("T")

# What the readers yield (a byte range to read) and are sent back (the bytes and the result's total size).
RangeRequest = tuple[int, int]
RangeReply = tuple[bytes, int]
Reader = Generator[RangeRequest, RangeReply, T]

# A reply at least this large (a search chunk, an image) is processed in a worker thread in async runs: decoding and
# matching a megabyte takes milliseconds that the event loop should spend on other runs. A page is handled inline.
OFF_LOOP_BYTES = 256 * 1024


class ResultSource:
    """Byte ranges of one result, its kind (text or bytes) and the writer's key, when known."""

    kind: Kind | None = None
    key: str | None = None

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
    """A result in an `FsspecToolResultStore`, read range by range."""

    def __init__(self, store: FsspecToolResultStore, reference: str) -> None:
        """
        :param store: The run's store.
        :param reference: The reference, as the model gave it; the store validates it on every read.
        """
        self._store = store
        self._reference = reference
        # Only a hint for what to fetch: the store refuses anything that is not one of its names on the first read.
        parsed = parse_object_name(reference.rsplit("/", 1)[-1])
        self.kind = parsed.kind if parsed is not None else "text"
        self.key = parsed.key if parsed is not None else None

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
    :returns: A ranged source for an `FsspecToolResultStore`, a whole-read source for any other store.
    """
    if isinstance(store, FsspecToolResultStore):
        return RangedSource(store, reference)
    return WholeSource(store, reference)


def _step(reader: Reader[T], reply: RangeReply) -> tuple[bool, Any]:
    # StopIteration cannot cross a thread boundary (asyncio.to_thread), so the end of a reader becomes a flag.
    try:
        return False, reader.send(reply)
    except StopIteration as stop:
        return True, stop.value


def drive(reader: Reader[T], source: ResultSource) -> T:
    """
    Run a reader to completion, serving each range it asks for from `source`.

    :param reader: A generator that yields byte ranges and returns its result.
    :param source: Where the bytes come from.
    :returns: What the reader returns.
    """
    done, value = _first(reader)
    while not done:
        done, value = _step(reader, source.read(*value))
    result: T = value
    return result


async def drive_async(reader: Reader[T], source: ResultSource) -> T:
    """
    Async `drive`: each range is awaited, and large chunks (search) are decoded and matched in a worker thread, so the
    event loop keeps serving other runs meanwhile.

    :param reader: A generator that yields byte ranges and returns its result.
    :param source: Where the bytes come from.
    :returns: What the reader returns.
    """
    done, value = _first(reader)
    while not done:
        reply = await source.read_async(*value)
        if len(reply[0]) >= OFF_LOOP_BYTES:
            done, value = await asyncio.to_thread(_step, reader, reply)
        else:
            done, value = _step(reader, reply)
    result: T = value
    return result


def _first(reader: Reader[T]) -> tuple[bool, Any]:
    try:
        return False, next(reader)
    except StopIteration as stop:
        return True, stop.value
