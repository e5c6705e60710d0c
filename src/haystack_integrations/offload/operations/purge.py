"""
What to delete: a whole session (results and its history, approvals and audit), a whole tenant, or old results.

Selection is separate from deletion, so ``purge --dry-run`` shows exactly what ``purge`` would delete. Objects this
library did not write (``other`` in the inventory) are never selected.

Age filter: results carry their creation time in their names, so "older than 30 days" needs one LIST and no HEAD per
object. Documents (history, approval and audit records) go by whole sessions: every document of a session whose newest
activity is older than the age goes, and a session active since keeps all of its documents (deleting a live
conversation's old turns would corrupt it: its history is a checkpoint plus appended turns). A session's newest
activity is read from its object names where they carry a time, and from its newest history turn otherwise (one GET
per such session; see `stores.retention`).
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from haystack_integrations.offload.operations.inventory import StoredObject
from haystack_integrations.offload.stores import FsspecToolResultStore
from haystack_integrations.offload.stores.retention import IdleSessions, read_turn_times

_AGE = re.compile(r"\s*(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>s|m|h|d|w)\s*")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_age(text: str) -> timedelta:
    """
    Parse an age like ``90m``, ``12h``, ``30d`` or ``2w``.

    :param text: A number and a unit: s, m, h, d or w.
    :returns: The age.
    :raises ValueError: If the text is not an age, or the age is zero.
    """
    match = _AGE.fullmatch(text)
    if match is None:
        raise ValueError(f"Invalid age {text!r}: use a number and a unit (s, m, h, d, w), e.g. 30d or 12h.")
    age = timedelta(**{_UNITS[match["unit"]]: float(match["number"])})
    if age <= timedelta(0):
        raise ValueError(f"Invalid age {text!r}: it must be more than zero.")
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
    def bytes(self) -> int:
        """Their total size."""
        return sum(item.size for item in self.objects)

    def sessions(self) -> list[str]:
        """The ``tenant/session`` scopes touched, sorted."""
        return sorted({f"{item.tenant}/{item.session}" for item in self.objects})


def select_scope(objects: Iterable[StoredObject]) -> PurgePlan:
    """
    Select every result and document of a scan (a session's or a tenant's: scope the scan itself).

    :param objects: What `scan` found for the tenant or session.
    :returns: The plan.
    """
    return PurgePlan([item for item in objects if item.kind in ("result", "document")])


def select_older_than(
    objects: Iterable[StoredObject], age: timedelta, *, now: datetime, root: FsspecToolResultStore | None = None
) -> PurgePlan:
    """
    Select the results created before ``now - age``, and every document of each session inactive since then.

    :param objects: What `scan` found.
    :param age: How old a result, or a session's newest activity, must be to go.
    :param now: The current time (timezone-aware).
    :param root: The store `scan` walked, to read the newest history turn of sessions whose object names do not show
        them active (one GET each, a few at once). Without it, the documents of such sessions are kept.
    :returns: The plan.
    :raises StorageError: If reading a history turn fails.
    """
    cutoff = now - age
    chosen = [item for item in objects if item.kind in ("result", "document")]
    base = root._scope_path() if root is not None else "."
    idle = IdleSessions(
        {f"{base}/{item.path}": item.size for item in chosen}, base, scope=(), cutoff=lambda tenant: cutoff
    )
    if root is not None:
        idle.dated(read_turn_times(root._handle.io(), idle.to_read()))
    documents = {path[len(base) + 1 :] for path in idle.documents()}
    return PurgePlan(
        [
            item
            for item in chosen
            if (item.kind == "result" and item.created is not None and item.created < cutoff) or item.path in documents
        ]
    )
