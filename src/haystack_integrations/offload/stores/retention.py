"""
Retention: how long results stay readable (per store, overridable per tenant), and ending a session.

A result's age is read from the creation time in its name where that shows it live (no request), else from the
storage's clock (a read: one HEAD; a purge: the time its listing carries); session documents go by whole sessions,
judged by each session's newest activity. `end_session` deletes a session's results at once. Numbered documents date
their session by *activity documents* (`activity_document_name`), whatever keeps them.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from haystack_integrations.offload.errors import ResultNotFoundError
from haystack_integrations.offload.stores.compact_documents import decompress_document
from haystack_integrations.offload.stores.layout import below, place
from haystack_integrations.offload.stores.names import parse_object_name
from haystack_integrations.offload.stores.quotas import is_document
from haystack_integrations.offload.stores.scope import validate_scope_id
from haystack_integrations.offload.stores.translate import storage_errors

if TYPE_CHECKING:
    from haystack_integrations.offload.stores.io import Requests

ACTIVITY_DOCUMENT = re.compile(r"(?P<series>[a-z][a-z0-9_-]*)\.(?P<number>\d{8})\.(?P<part>start|end)\.json")
"""The name of an activity document: a series, the step's number, and whether it records the step's start or end."""
_NAME_STAMP = re.compile(r"(?<![0-9])(?P<stamp>\d{8}T\d{12})Z")
T = TypeVar("T")
# Activity documents, or objects' times, read at once for a purge.
_CONCURRENT_READS = 16
DEFAULT_CLOCK_SKEW = timedelta(minutes=5)
"""How far writers' clocks may be off, by default: NTP keeps servers within a second; this covers a drifting one."""
MAX_AGE = timedelta(days=36_500)
"""The longest time to live or purge age (100 years): longer ones would carry dates past what `datetime` holds."""


class Retention(BaseModel):
    """
    How long results stay readable: a time to live for the store, and per-tenant exceptions.

    A result older than its tenant's time to live is refused by `read` with `ResultExpiredError` (the model is told
    the result expired), left out of `list`, and deleted by ``purge(expired=True)``. A result's name carries its
    writer's clock, which settles a live result at no cost; a name that says expired (or is stamped more than
    `clock_skew` ahead) is checked against the storage's own clock before `read` refuses it (one HEAD) or `purge`
    deletes it (the time in the purge's own listing), so a writer's wrong clock never costs a fresh result. `list`
    and quotas go by the name alone.

    ```python
    from datetime import timedelta
    from haystack_integrations.offload import FsspecToolResultStore, Retention

    results = FsspecToolResultStore(
        "s3://acme-agent-results/prod",
        retention=Retention(ttl=timedelta(days=30), tenants={"trial-org": timedelta(days=1), "archive-org": None}),
    )
    results.purge(expired=True)  # e.g. nightly, from a scheduled job or `offload-haystack purge`
    ```

    Multi-user use: set it on the root store; every session store derived from it applies its tenant's time to live.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttl: timedelta | None = Field(default=None, description="Time to live of every result; None keeps them.")
    tenants: dict[str, timedelta | None] = Field(
        default_factory=dict, description="Per-tenant time to live, replacing `ttl` (None keeps that tenant's)."
    )
    clock_skew: timedelta = Field(
        default=DEFAULT_CLOCK_SKEW,
        description="How far writers' clocks may be off from the reader's without shortening a result's life.",
    )

    @field_validator("ttl")
    @classmethod
    def _positive(cls, ttl: timedelta | None) -> timedelta | None:
        if ttl is not None and ttl <= timedelta(0):
            raise ValueError("A time to live must be positive.")
        if ttl is not None and ttl > MAX_AGE:
            raise ValueError(
                f"A time to live of {ttl.days} days is beyond what dates can hold (at most {MAX_AGE.days} days); "
                "use None to keep results."
            )
        return ttl

    @field_validator("tenants")
    @classmethod
    def _valid_tenants(cls, tenants: Mapping[str, timedelta | None]) -> dict[str, timedelta | None]:
        for tenant, ttl in tenants.items():
            validate_scope_id(tenant, field="tenant")
            cls._positive(ttl)
        return dict(tenants)

    @field_validator("clock_skew")
    @classmethod
    def _valid_skew(cls, clock_skew: timedelta) -> timedelta:
        if clock_skew < timedelta(0) or clock_skew > MAX_AGE:
            raise ValueError(f"clock_skew must be between 0 and {MAX_AGE.days} days, got {clock_skew}.")
        return clock_skew

    def ttl_for(self, tenant: str | None) -> timedelta | None:
        """
        :param tenant: The tenant, or None for results outside any tenant.
        :returns: The tenant's time to live (its own, else the store's), or None when its results are kept.
        """
        if tenant is not None and tenant in self.tenants:
            return self.tenants[tenant]
        return self.ttl

    def live_by_name(self, created: datetime, tenant: str | None, *, now: datetime) -> bool:
        """
        Whether the time a result's name carries (its writer's clock) shows it live without asking the storage: less
        than its time to live plus `clock_skew` old, and no more than `clock_skew` ahead of now.

        :param created: The time the result's name carries.
        :param tenant: Its tenant.
        :param now: The time to judge at.
        :returns: True if the name settles it; False if the storage's clock must decide (`expired` with the object's
            modification time).
        """
        ttl = self.ttl_for(tenant)
        return ttl is None or -self.clock_skew <= now - created < ttl + self.clock_skew

    def expired(self, created: datetime, tenant: str | None, *, now: datetime | None = None) -> bool:
        """
        Whether a result written at `created` is past its time to live.

        A result is live while that time is less than its time to live plus `clock_skew` away from now, in either
        direction: a clock off by up to `clock_skew` costs its results nothing, and a time ahead of now is believed
        no further than a result could live, so a clock hours fast never keeps its results for ever.

        :param created: When the result was written (timezone-aware): by the storage's clock where it says, else by
            the result's name.
        :param tenant: Its tenant.
        :param now: The time to judge at; the current time by default.
        :returns: Whether the result has outlived its time to live.
        """
        ttl = self.ttl_for(tenant)
        # Differences of dates, never a date plus a time to live: no sum can pass datetime's range.
        return ttl is not None and abs((now or datetime.now(UTC)) - created) >= ttl + self.clock_skew

    def cutoff(self, tenant: str | None, *, now: datetime) -> datetime | None:
        """
        :param tenant: The tenant.
        :param now: The current time.
        :returns: The time before which the tenant's sessions count as inactive (their time to live and the clock skew
            ago), or None when they are kept.
        """
        ttl = self.ttl_for(tenant)
        return None if ttl is None else now - ttl - self.clock_skew

    def expiry_message(
        self, reference: object, created: datetime, tenant: str | None, *, now: datetime, by_storage: bool = False
    ) -> str:
        """
        :param reference: The expired result's reference.
        :param created: The time it was written.
        :param tenant: Its tenant.
        :param now: The time it was judged at.
        :param by_storage: Whether `created` is the storage's own clock, not the result's name.
        :returns: Why the result cannot be read, for the model and the logs.
        """
        kept = _duration(self.ttl_for(tenant))
        if by_storage:
            return (
                f"The stored result {reference!r} has expired: results are kept for {kept}, and the storage says this "
                f"one was written on {created:%Y-%m-%d %H:%M} UTC. It can no longer be read."
            )
        if created > now:
            return (
                f"The stored result {reference!r} has expired: it is stamped {created:%Y-%m-%d %H:%M} UTC, "
                f"{_duration(created - now)} ahead of this clock, more than results are kept for ({kept}); its "
                "writer's clock is wrong. It can no longer be read."
            )
        return (
            f"The stored result {reference!r} has expired: results are kept for {kept}, and this one was stored on "
            f"{created:%Y-%m-%d %H:%M} UTC (if it was stored just now, its writer's clock is behind by more than the "
            f"{_duration(self.clock_skew)} allowed). It can no longer be read."
        )


def check_age(age: timedelta, *, name: str) -> timedelta:
    """
    Refuse an age no date arithmetic can hold, before it is used.

    :param age: An age such as ``purge(older_than=...)``.
    :param name: The parameter's name, for the message.
    :returns: `age`.
    :raises ValueError: If `age` is longer than `MAX_AGE`.
    """
    if age > MAX_AGE:
        raise ValueError(f"{name} of {age.days} days is beyond what dates can hold (at most {MAX_AGE.days} days).")
    return age


def _duration(span: timedelta | None) -> str:
    """A span in words: exact in the largest unit that divides it ("36 hours"), else rounded ("about 2 hours")."""
    if span is None:
        return "ever"
    units = ((timedelta(days=1), "day"), (timedelta(hours=1), "hour"), (timedelta(minutes=1), "minute"))
    for unit, name in units:
        if span >= unit and span % unit == timedelta(0):
            count = span // unit
            return f"{count} {name}{'s' if count != 1 else ''}"
    for unit, name in units:
        if span >= unit:
            count = round(span / unit)
            return f"about {count} {name}{'s' if count != 1 else ''}"
    return f"{span.total_seconds():g} seconds"


def document_paths(found: Mapping[str, int], scope_path: str) -> builtins.list[str]:
    """
    Pick the documents (``.<namespace>/<name>``) out of a listing of a session's directory.

    :param found: Paths and sizes from the listing.
    :param scope_path: The session's directory.
    :returns: The documents' paths.
    """
    prefix = scope_path.rstrip("/") + "/"
    paths = []
    for path in found:
        parts = path[len(prefix) :].split("/") if path.startswith(prefix) else []
        if len(parts) == 2 and is_document(*parts):
            paths.append(path)
    return paths


def name_time(name: str) -> datetime | None:
    """
    The time an object's name carries: a result's creation, an audit event's.

    :param name: An object name (a result's, or a document's within its namespace).
    :returns: The time, or None if the name carries none (numbered documents: activity documents, approval records).
    """
    parsed = parse_object_name(name)
    if parsed is not None:
        return parsed.created
    match = _NAME_STAMP.search(name)
    if match is None:
        return None
    try:
        return datetime.strptime(match["stamp"], "%Y%m%dT%H%M%S%f").replace(tzinfo=UTC)
    except ValueError:
        return None


def activity_document_name(series: str, number: int, part: str) -> str:
    """
    The name of an activity document, which retention reads to date its session (see the module docstring).

    :param series: What the documents record, e.g. ``"turn"`` (lowercase letters, digits, ``_`` and ``-``).
    :param number: The step's number in its series, from 0 to 99,999,999.
    :param part: ``"start"`` (its JSON says ``started_at``) or ``"end"`` (``ended_at``).
    :returns: ``<series>.<number, 8 digits>.<part>.json``.
    :raises ValueError: If the name would not be one retention recognises.
    """
    name = f"{series}.{number:08d}.{part}.json"
    if not 0 <= number <= 99_999_999 or ACTIVITY_DOCUMENT.fullmatch(name) is None:
        raise ValueError(f"Not an activity document: series {series!r}, number {number}, part {part!r}.")
    return name


def activity_time(data: bytes) -> datetime | None:
    """
    When an activity document says its step ended (or, for a start, began).

    :param data: The document: a step's end (``ended_at``) or start (``started_at``).
    :returns: The time, or None if the document says neither.
    """
    try:
        record = json.loads(decompress_document(data))
        stamp = record.get("ended_at") or record.get("started_at")
        found = datetime.fromisoformat(stamp) if isinstance(stamp, str) else None
    except (ValueError, AttributeError):
        return None
    return found if found is not None and found.tzinfo is not None else None


@dataclass
class _Session:
    documents: builtins.list[str] = field(default_factory=builtins.list)
    moments: builtins.list[datetime] = field(default_factory=builtins.list)
    """The times its object names carry (writers' clocks)."""
    activity: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    """Activity documents: path -> (namespace/series, number, part)."""

    def saw(self, moment: datetime | None) -> None:
        if moment is not None:
            self.moments.append(moment)

    def newest(self, believable: datetime) -> datetime | None:
        # A time past `believable` is a clock far ahead (or a planted name): it must not keep the session for ever.
        return max((moment for moment in self.moments if moment <= believable), default=None)

    def newest_activity(self) -> builtins.list[str]:
        # Per series, the newest step's end if it has one (it ended after it started), else its start (still running).
        newest: dict[str, tuple[int, bool, str]] = {}
        for path, (series, number, part) in self.activity.items():
            rank = (number, part == "end", path)
            if series not in newest or rank > newest[series]:
                newest[series] = rank
        return sorted(path for _, _, path in newest.values())


class IdleSessions:
    """
    Which sessions of one listing have been inactive since a cutoff, so that their documents go whole.

    Build it from a listing, read the documents `to_read` names (`FsspecToolResultStore.activity_times`), then take
    `documents()`.

    ```python
    idle = IdleSessions(store.find_objects(), "", scope=("acme",), cutoff=lambda tenant: now - timedelta(days=30))
    idle.dated(store.activity_times(idle.to_read()))
    paths = idle.documents()
    ```
    """

    def __init__(
        self,
        found: Mapping[str, int],
        scope_path: str,
        *,
        scope: tuple[str, ...],
        cutoff: Callable[[str], datetime | None],
        now: datetime | None = None,
    ) -> None:
        """
        Times are writers' clocks: one further ahead of `now` than the cutoff is behind it is not believed (it says
        nothing about the session), so a clock far ahead, or a planted name, cannot keep a session's documents for ever.

        :param found: Paths and sizes from one listing of `scope_path`.
        :param scope_path: The listed directory: the root's, a tenant's or a session's (``""``: `found` is relative
            to it already).
        :param scope: What `scope_path` is below the root: ``()``, ``(tenant,)`` or ``(tenant, session)``.
        :param cutoff: Given a tenant, the time before which its sessions count as inactive (None: keep them).
        :param now: The current time (timezone-aware; default: the clock's).
        """
        self._cutoff = cutoff
        self._now = now or datetime.now(UTC)
        self._sessions: dict[tuple[str, str], _Session] = {}
        self._times: dict[str, datetime | None] = {}
        for path in found:
            relative = below(path, scope_path)
            placed = place(relative, scope) if relative is not None else None
            if placed is None:
                continue  # not a session's result or document: an operator's own files are never touched
            key = (placed.tenant, placed.session)
            if placed.namespace is None:
                parsed = parse_object_name(placed.name)
                if parsed is not None:
                    self._sessions.setdefault(key, _Session()).saw(parsed.created)
                continue
            if not is_document("." + placed.namespace, placed.name):
                continue
            session = self._sessions.setdefault(key, _Session())
            session.documents.append(path)
            activity = ACTIVITY_DOCUMENT.fullmatch(placed.name)
            if activity is not None:
                series = f"{placed.namespace}/{activity['series']}"
                session.activity[path] = (series, int(activity["number"]), activity["part"])
            else:
                session.saw(name_time(placed.name))

    def _believable(self, cutoff: datetime) -> datetime:
        # As far ahead of now as the cutoff is behind it (for an age purge, the age): the mirror of what counts as old.
        return self._now + (self._now - cutoff)

    def to_read(self) -> builtins.list[str]:
        """
        :returns: The activity documents to read: the newest of each series, in each session with documents whose
            names do not already show it active after its cutoff.
        """
        paths: builtins.list[str] = []
        for (tenant, _), session in self._sessions.items():
            cutoff = self._cutoff(tenant)
            if not session.documents or cutoff is None:
                continue
            newest = session.newest(self._believable(cutoff))
            if newest is not None and newest >= cutoff:
                continue
            paths.extend(path for path in session.newest_activity() if path not in self._times)
        return paths

    def dated(self, times: Mapping[str, datetime | None]) -> None:
        """
        :param times: What `activity_times` found for (some of) the paths `to_read` named.
        """
        self._times.update(times)

    def documents(self) -> builtins.list[str]:
        """
        :returns: Every document of every session whose newest activity is older than its cutoff. A session whose
            newest activity documents were not all read, or whose age cannot be told, is kept.
        """
        paths = []
        for (tenant, _), session in self._sessions.items():
            cutoff = self._cutoff(tenant)
            if not session.documents or cutoff is None:
                continue
            believable = self._believable(cutoff)
            newest = session.newest(believable)
            activity = session.newest_activity()
            if any(path not in self._times for path in activity):
                continue
            for path in activity:
                moment = self._times[path]
                if moment is not None and moment <= believable and (newest is None or moment > newest):
                    newest = moment
            if newest is not None and newest < cutoff:
                paths.extend(session.documents)
        return paths


async def read_activity_times_async(request: Requests, paths: Iterable[str]) -> dict[str, datetime | None]:
    """
    Read activity documents and the time each says (a few at once).

    :param request: How the store sends an engine call.
    :param paths: The documents' full paths.
    :returns: Each path's time; None for a document gone meanwhile or saying no time.
    :raises StorageError: If the backend fails.
    """

    async def one(path: str) -> datetime | None:
        try:
            with storage_errors("read an activity document", reference=path):
                return activity_time(await request("get", path, lambda io: io.get_async(path)))
        except ResultNotFoundError:
            return None

    return await _each(paths, one)


async def storage_times_async(request: Requests, paths: Iterable[str]) -> dict[str, datetime | None]:
    """
    When the storage says each object was written (one HEAD each on S3, a few at once): the clock that settles a
    result whose name says it is old, since its writer's clock may be wrong. Purges take it from their listing
    (`Engine.find_detailed_async`) and ask this only of a filesystem whose listing carries no time.

    :param request: How the store sends an engine call.
    :param paths: The objects' full paths.
    :returns: Each path's time, None where the storage does not say; a path gone meanwhile is left out.
    :raises StorageError: If the backend fails.
    """

    async def one(path: str) -> tuple[bool, datetime | None]:
        try:
            with storage_errors("read when an object was written", reference=path):
                return True, await request("modified", path, lambda io: io.modified_async(path))
        except ResultNotFoundError:
            return False, None

    return {path: moment for path, (present, moment) in (await _each(paths, one)).items() if present}


async def _each(paths: Iterable[str], one: Callable[[str], Awaitable[T]]) -> dict[str, T]:
    """`one` of each path, `_CONCURRENT_READS` at a time: each path's answer."""
    limit = asyncio.Semaphore(_CONCURRENT_READS)

    async def bounded(path: str) -> T:
        async with limit:
            return await one(path)

    chosen = builtins.list(paths)
    return dict(zip(chosen, await asyncio.gather(*(bounded(path) for path in chosen)), strict=True))
