"""
Read-ahead for a sequential scan (search): a few larger ranges in flight, their bytes handed back in order.

`ReadAhead` plans and assembles and does no I/O itself: `drive` fetches its ranges in a small thread pool and
`drive_async` as tasks on the running loop (see `source`).
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

# The largest range read ahead, and how many ranges may be held at once (in flight or waiting to be consumed).
MAX_RANGE_BYTES = 16 << 20
MAX_IN_FLIGHT = 3
# The first range read ahead (the chunk before it was read alone); each next one is twice as large, up to the maximum.
FIRST_AHEAD_BYTES = 2 << 20


class Cancellable(Protocol):
    """A fetch in progress: a `concurrent.futures.Future` or an `asyncio.Task`."""

    def cancel(self) -> bool:
        """Stop the fetch if it has not finished; its result will not be used."""
        ...


H = TypeVar("H", bound=Cancellable)


@dataclass(frozen=True)
class ScanRange:
    """
    A range a sequential scan asks for: bytes ``start`` to ``end``, and a promise that it will read on from about
    ``end``, range after range, up to ``until`` at most. The driver may read ahead to ``until``, never further.
    """

    start: int
    end: int
    until: int


@dataclass(frozen=True)
class Segment(Generic[H]):
    """One range of the window: bytes ``start`` to ``end``, and the fetch that brings them."""

    start: int
    end: int
    fetch: H


class ReadAhead(Generic[H]):
    """
    The ranges fetched ahead of one scan, contiguous from the lowest byte the scan may still ask for.

    :param start_fetch: Starts fetching a range (in a thread, or as a task) and returns a handle to it.
    :param start: Where the scan's first range, read directly, started.
    :param first: That read's reply: its bytes stay in the window, since the scan's next range may start a few bytes
        before their end (a character the range cut).
    :param done: Wraps a reply in a finished handle (a `Future` with its result set).
    :param until: The reader's bound: nothing at or past it is read ahead.
    """

    def __init__(
        self,
        start_fetch: Callable[[int, int], H],
        *,
        start: int,
        first: tuple[bytes, int],
        done: Callable[[tuple[bytes, int]], H],
        until: int,
    ) -> None:
        self._start_fetch = start_fetch
        self._frontier = start + len(first[0])
        self.total = first[1]
        self._limit = min(until, self.total)
        self._next_size = FIRST_AHEAD_BYTES
        self._segments: deque[Segment[H]] = deque([Segment(start, self._frontier, done(first))])
        self.broken = False

    def plan(self, start: int, end: int) -> list[Segment[H]] | None:
        """
        Make sure bytes ``start`` to ``end`` are being fetched, top the read-ahead up, and return the segments that
        hold them, in order.

        :param start: First byte the scan asks for.
        :param end: One past the last byte it asks for.
        :returns: The segments to wait for, or None if this window cannot serve the range (it asks for bytes behind
            the window, or an earlier reply came back short): the caller then reads it directly.
        """
        lowest = self._segments[0].start if self._segments else self._frontier
        if self.broken or not lowest <= start <= self._frontier:
            return None
        end = min(end, self.total)
        while self._segments and self._segments[0].end <= start:
            self._segments.popleft()  # consumed: a scan never asks for bytes behind its current range
        # Read ahead first: the first range ahead then covers this request too (no extra small request for it).
        while len(self._segments) < MAX_IN_FLIGHT and self._frontier < self._limit:
            self._add(min(self._next_size, self._limit - self._frontier))
            self._next_size = min(2 * self._next_size, MAX_RANGE_BYTES)
        if self._frontier < end:
            # Past the reader's bound (a last chunk that goes a little beyond it), or all slots busy: fetch what is
            # asked for, as today, rather than make the scan wait.
            self._add(end - self._frontier)
        return [segment for segment in self._segments if segment.start < end and segment.end > start]

    def _add(self, size: int) -> None:
        begin = self._frontier
        self._frontier += size
        self._segments.append(Segment(begin, self._frontier, self._start_fetch(begin, self._frontier)))

    def assemble(self, start: int, end: int, replies: list[tuple[Segment[H], tuple[bytes, int]]]) -> tuple[bytes, int]:
        """
        Cut bytes ``start`` to ``end`` out of the segments' replies.

        :param start: First byte asked for.
        :param end: One past the last byte asked for.
        :param replies: The segments `plan` returned, each with its reply ``(bytes, total)``.
        :returns: The bytes (short if the result turned out shorter than its first reply said) and the total size.
        """
        parts: list[bytes] = []
        total = self.total
        for segment, (data, reply_total) in replies:
            parts.append(data[max(start, segment.start) - segment.start : min(end, segment.end) - segment.start])
            if len(data) < segment.end - segment.start:
                # The result changed under the scan: what follows this reply is not to be trusted, read directly.
                total = reply_total
                self.broken = True
                break
        return b"".join(parts), total

    def pending(self) -> list[H]:
        """
        Forget every segment and return their fetches, to cancel them: the scan has stopped.

        :returns: The fetches of the segments still held.
        """
        fetches = [segment.fetch for segment in self._segments]
        self._segments.clear()
        return fetches
