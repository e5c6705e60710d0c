"""
A tenant's (or a large session's) usage kept incrementally: a log of marks, tiny objects carrying running totals.

    <root>/<tenant>/.usage/<countdown>.json              {"results": ..., "bytes": ..., "reconciled": ...}
    <root>/<tenant>/<session>/.-usage/<countdown>.json   the same, for a session that outgrew one listing page

The newest mark is one LIST (max-keys 1, names count down) and one GET, whatever the scope holds; the next one is an
exclusive create named by its sequence alone, so one writer wins each (`UsageMarks`). ``.usage`` is no session id;
``.-usage`` is no document namespace, and sorts before everything else a session holds.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

MARKS_DIRECTORY = ".usage"
SESSION_MARKS_NAMESPACE = "-usage"
SESSION_MARKS_DIRECTORY = "." + SESSION_MARKS_NAMESPACE
KEPT_MARKS = 1000
"""Marks a reconcile keeps (the newest); older ones are deleted. A worker whose newest known mark is older than these
may write a mark no reader sees (its unmarked allowance, within the drift reconciles correct)."""
_DIGITS = 15
_TOP = 10**_DIGITS - 1
_MARK = re.compile(rf"(?P<countdown>\d{{{_DIGITS}}})\.json")
# Exclusive creates lost in a row before giving up: each loss means another worker's mark landed, so this is only
# reached under a storm of writers, whose refresh then fails like a failed listing would.
MAX_RACES = 50

ListFirst = Callable[[str], Awaitable[str | None]]
"""The first (newest) object name below a directory, from one LIST with max-keys 1; None if there is none."""
Get = Callable[[str], Awaitable[bytes]]
"""Read an object whole (one GET)."""
CreateExclusive = Callable[[str, bytes], Awaitable[None]]
"""Create an object at a path, raising `FileExistsError` if one is there."""


@dataclass(frozen=True)
class Mark:
    """The tenant's totals as of one mark."""

    sequence: int
    results: int
    size: int
    reconciled: int
    """When the last reconcile wrote its mark (Unix seconds)."""
    writer: str = ""
    """A token unique to the create that wrote it: a writer whose answer was lost knows its own mark by it."""

    @property
    def name(self) -> str:
        """The mark's object name: its sequence alone, so that one writer wins each sequence."""
        return f"{_TOP - self.sequence:0{_DIGITS}d}.json"

    def content(self) -> bytes:
        """The mark's object content."""
        fields = {"results": self.results, "bytes": self.size, "reconciled": self.reconciled, "writer": self.writer}
        return json.dumps(fields).encode()


@dataclass(frozen=True)
class MarkedUsage:
    """
    A tenant's usage as its newest usage mark says: what quota'd writers admitted and charged, as of their last
    marks. Deletes, purges and expiry show only after the next reconcile (a full listing: hourly while quota'd
    writers write, or `FsspecToolResultStore.reconcile_usage`).
    """

    results: int
    size: int
    """Bytes of results and session documents."""
    mark: int
    """The mark's sequence number (how many marks the tenant has had, less one)."""
    reconciled: datetime | None
    """When a reconcile last set the marks to a full listing (None: never; the first mark counted from zero)."""

    @classmethod
    def of(cls, mark: Mark) -> MarkedUsage:
        """
        :param mark: A usage mark.
        :returns: Its figures.
        """
        reconciled = datetime.fromtimestamp(mark.reconciled, UTC) if mark.reconciled else None
        return cls(results=mark.results, size=mark.size, mark=mark.sequence, reconciled=reconciled)


def is_mark_name(name: str) -> bool:
    """
    :param name: An object name (its last path segment).
    :returns: Whether it is a mark's name.
    """
    return _MARK.fullmatch(name) is not None


def parse_mark(name: str, data: bytes) -> Mark | None:
    """
    :param name: An object name below a tenant's ``.usage`` directory.
    :param data: The object's content.
    :returns: The mark, or None if it is not one.
    """
    match = _MARK.fullmatch(name)
    if match is None:
        return None
    try:
        fields = json.loads(data)
        return Mark(
            sequence=_TOP - int(match["countdown"]),
            results=int(fields["results"]),
            size=int(fields["bytes"]),
            reconciled=int(fields["reconciled"]),
            writer=str(fields.get("writer", "")),  # marks written before writers were told apart have none
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class UsageMarks:
    """One tenant's log of marks: the newest one in one LIST, the next one in one exclusive create."""

    def __init__(self, directory: str, list_first: ListFirst, get: Get, create: CreateExclusive) -> None:
        """
        :param directory: The scope's marks directory, full path (``<root>/<tenant>/.usage``, or
            ``<root>/<tenant>/<session>/.-usage``).
        :param list_first: Lists the newest object name below a directory (one LIST, max-keys 1).
        :param get: Reads an object.
        :param create: Creates an object exclusively.
        """
        self.directory = directory
        self._list_first = list_first
        self._get = get
        self._create = create

    async def latest_async(self) -> Mark | None:
        """
        The newest mark: one LIST (max-keys 1) and one GET.

        :returns: The newest mark, or None if the tenant has none yet (or the newest object is not a mark).
        """
        name = await self._list_first(self.directory)
        return await self.read_async(name) if name is not None else None

    async def read_async(self, name: str) -> Mark | None:
        """
        One mark, by the name a listing gave: one GET.

        :param name: The mark's object name.
        :returns: The mark, or None if the name is no mark's or the mark is gone.
        """
        if _MARK.fullmatch(name) is None:
            return None
        try:
            data = await self._get(f"{self.directory}/{name}")
        except FileNotFoundError:
            return None  # deleted since it was listed: none known, so a listing reconciles
        return parse_mark(name, data)

    async def append_async(self, make: Callable[[Mark | None], Mark], *, latest: Mark | None = None) -> Mark:
        """
        Write the mark that follows the newest one, as `make` computes it from that one, retrying on a race.

        :param make: Given the newest mark (None: there is none), the next one (its sequence one more).
        :param latest: The newest mark, if just read (saves a LIST on the first try).
        :returns: The mark written.
        :raises RuntimeError: If the race was lost `MAX_RACES` times in a row.
        """
        known = latest is not None
        for _ in range(MAX_RACES):
            if not known:
                latest = await self.latest_async()
            known = False
            mark = dataclasses.replace(make(latest), writer=secrets.token_hex(8))
            path = f"{self.directory}/{mark.name}"
            try:
                await self._create(path, mark.content())
            except FileExistsError:
                # This very create may have landed, its answer lost and its retry refused: then the mark is ours.
                if await self._holds(path, mark):
                    return mark
                continue  # another worker's mark took this sequence: read it and add to it
            return mark
        raise RuntimeError(f"Could not write a usage mark below {self.directory}: {MAX_RACES} races lost in a row.")

    async def _holds(self, path: str, mark: Mark) -> bool:
        try:
            return await self._get(path) == mark.content()
        except FileNotFoundError:
            return False


def following(latest: Mark | None, results: int, size: int, *, reconciled: int | None = None) -> Mark:
    """
    :param latest: The newest mark (None: none yet).
    :param results: Results to add.
    :param size: Bytes to add.
    :param reconciled: A new reconcile time; None keeps the newest mark's.
    :returns: The next mark.
    """
    if latest is None:
        return Mark(0, max(results, 0), max(size, 0), reconciled or 0)
    return Mark(
        latest.sequence + 1,
        max(latest.results + results, 0),
        max(latest.size + size, 0),
        latest.reconciled if reconciled is None else reconciled,
    )
