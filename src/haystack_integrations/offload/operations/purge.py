"""
What to delete: a whole session (results and its history, approvals and audit), a whole tenant, or old results.

Selection is separate from deletion, so ``purge --dry-run`` shows exactly what ``purge`` would delete.
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from haystack_integrations.offload.operations.inventory import StoredObject
from haystack_integrations.offload.stores import FsspecToolResultStore
from haystack_integrations.offload.stores.names import is_stale_temporary
from haystack_integrations.offload.stores.retention import MAX_AGE, IdleSessions

_AGE = re.compile(r"\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>s|m|h|d|w)\s*")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_age(text: str) -> timedelta:
    """
    Parse an age like ``90m``, ``12h``, ``30d`` or ``2w``.

    :param text: A number and a unit: s, m, h, d or w.
    :returns: The age.
    :raises ValueError: If the text is not an age, or the age is zero or longer than `MAX_AGE` (100 years).
    """
    match = _AGE.fullmatch(text)
    shown = text if len(text) <= 40 else f"{text[:20]}...{text[-10:]}"  # an error line stays one short line
    if match is None:
        raise ValueError(f"Invalid age {shown!r}: use a number and a unit (s, m, h, d, w), e.g. 30d or 12h.")
    number = float(match["number"])  # digits only, so never NaN; "9" * 400 is inf, which the bound below refuses
    # Compared as seconds before a timedelta is built: past about 2.7 million years timedelta itself overflows.
    if number * _UNIT_SECONDS[match["unit"]] > MAX_AGE.total_seconds():
        raise ValueError(f"Invalid age {shown!r}: at most {MAX_AGE.days} days (100 years).")
    age = timedelta(**{_UNITS[match["unit"]]: number})
    if age <= timedelta(0):
        raise ValueError(f"Invalid age {shown!r}: it must be more than zero.")
    return age


@dataclass(frozen=True)
class PurgePlan:
    """The objects a purge deletes, and what they add up to."""

    objects: list[StoredObject]

    @property
    def results(self) -> int:
        """How many results."""
        return sum(1 for item in self.objects if item.kind == "result")

    @property
    def documents(self) -> int:
        """How many documents."""
        return sum(1 for item in self.objects if item.kind == "document")

    @property
    def temporary_files(self) -> int:
        """How many temporary files of local writes whose writer died."""
        return sum(1 for item in self.objects if item.kind == "temporary")

    @property
    def bytes(self) -> int:
        """Their total size."""
        return sum(item.size for item in self.objects)

    def sessions(self) -> list[str]:
        """The ``tenant/session`` scopes touched, sorted."""
        return sorted({f"{item.tenant}/{item.session}" for item in self.objects})


def select_scope(objects: Iterable[StoredObject], *, now: datetime | None = None) -> PurgePlan:
    """
    Select every result and document of a scan (a session's or a tenant's: scope the scan itself), and the temporary
    files of local writes whose writer died.

    :param objects: What `scan` found for the tenant or session.
    :param now: The time to judge temporary files at; the current time by default.
    :returns: The plan.
    """
    return PurgePlan([item for item in objects if item.kind in ("result", "document") or _stale(item, now)])


def _stale(item: StoredObject, now: datetime | None) -> bool:
    """Whether an object is a temporary file whose writer died (a write still running keeps its file)."""
    return item.kind == "temporary" and is_stale_temporary(item.path.rsplit("/", 1)[-1], now=now)


def select_older_than(
    objects: Iterable[StoredObject], age: timedelta, *, now: datetime, root: FsspecToolResultStore | None = None
) -> PurgePlan:
    """
    Select the results created before ``now - age``, every document of each session inactive since then, and the
    temporary files of local writes whose writer died (whatever `age`, as every store purge removes them).

    :param objects: What `scan` found.
    :param age: How old a result, or a session's newest activity, must be to go.
    :param now: The current time (timezone-aware).
    :param root: The store `scan` walked, to read the newest history turn of sessions whose object names do not show
        them active (one GET each, a few at once). Without it, the documents of such sessions are kept.
    :returns: The plan.
    :raises StorageError: If reading a history turn fails.
    """
    cutoff = now - age
    listed = list(objects)
    chosen = [item for item in listed if item.kind in ("result", "document")]
    # Paths relative to the root, as the store names them (`find_objects`, `activity_times`).
    idle = IdleSessions({item.path: item.size for item in chosen}, "", scope=(), cutoff=lambda tenant: cutoff, now=now)
    if root is not None:
        idle.dated(root.activity_times(idle.to_read()))
    documents = set(idle.documents())
    return PurgePlan(
        [
            item
            for item in listed
            if (item.kind == "result" and item.created is not None and item.created < cutoff)
            or item.path in documents
            or _stale(item, now)
        ]
    )
