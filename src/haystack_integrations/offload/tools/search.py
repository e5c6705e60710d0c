"""
Search through a stored text result in ranged chunks, without holding the whole result in memory.

`StreamSearch` is a small state machine with no I/O of its own, so the sync and async tools drive the same logic.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from haystack_integrations.offload.tools.paging import complete_length, decode_text, leading_continuations

StopReason = Literal["end", "max_matches", "scan_limit", "timeout", "not_text"]


@dataclass(frozen=True)
class Match:
    """One match, with a little context on each side."""

    position: int
    """Byte position where the match starts (a valid `offset` for reading the page there)."""
    before: str
    text: str
    after: str


@dataclass
class SearchOutcome:
    """What a search found and where it stopped."""

    matches: list[Match]
    start: int
    """Byte position the search started from."""
    scanned_to: int
    """Every match starting before this byte position has been reported (or counted against the bound)."""
    total: int
    reason: StopReason
    resume: int | None = None
    """Where to search again for more, when the search stopped early."""


@dataclass
class StreamSearch:
    """
    Find matches of a compiled `regex` pattern in a UTF-8 result fed to it in byte chunks.

    :param pattern: A pattern compiled with the `regex` module.
    :param start: Byte position to start searching from.
    :param max_matches: Stop after this many matches.
    :param context_chars: Characters of context to keep on each side of a match.
    :param max_match_chars: The longest match guaranteed to be found across a chunk edge.
    :param chunk_bytes: Bytes to read per chunk.
    :param max_scan_bytes: Stop after reading this many bytes (the model can resume from where it stopped).
    :param timeout: Seconds of CPU time the regular expression may run in total.
    """

    pattern: Any
    start: int
    max_matches: int
    context_chars: int
    max_match_chars: int
    chunk_bytes: int
    max_scan_bytes: int
    timeout: float
    matches: list[Match] = field(default_factory=list)
    _position: int = field(init=False, default=0)
    _total: int | None = field(init=False, default=None)
    _window: str = field(init=False, default="")
    _window_byte: int = field(init=False, default=0)
    _scan_from: int = field(init=False, default=0)
    _scanned_bytes: int = field(init=False, default=0)
    _time_used: float = field(init=False, default=0.0)
    _reason: StopReason | None = field(init=False, default=None)
    _resume: int | None = field(init=False, default=None)
    _scanned_to: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._position = self.start
        self._window_byte = self.start
        self._scanned_to = self.start

    @property
    def _keep_chars(self) -> int:
        return self.max_match_chars + 2 * self.context_chars

    def next_range(self) -> tuple[int, int] | None:
        """
        Return the next byte range to read, or None when the search is over.

        :returns: ``(start, end)`` with `end` exclusive.
        """
        if self._reason is not None:
            return None
        return self._position, self._position + self.chunk_bytes

    def feed(self, data: bytes, total: int) -> None:
        """
        Search the bytes read for the range `next_range` gave.

        :param data: The bytes read (short or empty at the end of the result).
        :param total: The result's total size in bytes.
        """
        self._total = total
        if self._position == self.start and self.start > 0:
            # The start position may fall inside a character: begin at the next one.
            skipped = leading_continuations(data)
            data = data[skipped:]
            self._position += skipped
            self._window_byte += skipped
            self._scanned_to += skipped
        at_end = self._position + len(data) >= total
        usable = data if at_end else data[: complete_length(data)]
        text, exact = decode_text(usable)
        if not exact:
            # Report what the text before these bytes still held (matches waiting for this chunk), then stop.
            self._scan(final=True)
            if self._reason is None:
                self._stop("not_text", resume=None)
            return
        self._position += len(usable)
        self._scanned_bytes += len(usable)
        self._window += text
        at_end = at_end or not usable  # nothing usable left to read: the result ended (or shrank) under us
        self._scan(final=at_end)
        if self._reason is not None:
            return
        if at_end:
            self._stop("end", resume=None)
        elif self._scanned_bytes >= self.max_scan_bytes:
            self._stop("scan_limit", resume=self._scanned_to)

    def _scan(self, *, final: bool) -> None:
        window = self._window
        # Match starts at or after `limit` wait for the next chunk, which will hold them whole with their context.
        limit = len(window) if final else len(window) - self._keep_chars + self.context_chars
        if limit <= self._scan_from:
            return
        byte_cursor = (0, self._window_byte)  # (char index, byte position) to encode prefixes incrementally
        remaining = max(self.timeout - self._time_used, 0.001)
        # The budget counts this thread's CPU time, not wall time: ranges read ahead in other threads (and other runs
        # on a busy server) would otherwise use up a harmless pattern's budget while it waits for a core. The
        # `regex` module's own per-call timeout (wall time, the remaining budget) still stops a runaway match.
        started = time.thread_time()
        try:
            for found in self.pattern.finditer(window, self._scan_from, timeout=remaining):
                begin, finish = found.span()
                if begin >= limit:
                    break
                if finish == begin:
                    continue  # an empty match says nothing
                byte_cursor = (begin, byte_cursor[1] + _utf8_length(window[byte_cursor[0] : begin]))
                self.matches.append(
                    Match(
                        position=byte_cursor[1],
                        before=window[max(0, begin - self.context_chars) : begin],
                        text=found.group(0),
                        after=window[finish : finish + self.context_chars],
                    )
                )
                self._scan_from = finish
                if len(self.matches) >= self.max_matches:
                    resume = byte_cursor[1] + _utf8_length(window[begin:finish])
                    self._scanned_to = resume
                    self._stop("max_matches", resume=resume)
                    return
        except TimeoutError:
            self._time_used = self.timeout
            self._stop("timeout", resume=self._byte_at(self._scan_from))
            return
        self._time_used += time.thread_time() - started
        self._scan_from = max(self._scan_from, limit)
        self._scanned_to = self._byte_at(self._scan_from)
        if not final:
            self._slide()

    def _byte_at(self, index: int) -> int:
        # The window always ends at `_position` (whole characters only), so count back from there: the tail after
        # `index` is short, encoding the megabyte before it again would not be.
        return self._position - _utf8_length(self._window[index:])

    def _slide(self) -> None:
        """Drop the part of the window no later match or context can need."""
        cut = max(0, min(len(self._window) - self._keep_chars, self._scan_from - self.context_chars))
        if cut:
            self._window_byte = self._byte_at(cut)
            self._window = self._window[cut:]
            self._scan_from -= cut

    def _stop(self, reason: StopReason, *, resume: int | None) -> None:
        self._reason = reason
        self._resume = resume

    def outcome(self) -> SearchOutcome:
        """
        Return what the search found; call once `next_range` returns None.

        :returns: The matches, how far the search got and why it stopped.
        """
        return SearchOutcome(
            matches=self.matches,
            start=self.start,
            scanned_to=self._scanned_to if self._reason != "end" else (self._total or 0),
            total=self._total or 0,
            reason=self._reason or "end",
            resume=self._resume,
        )


def _utf8_length(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
