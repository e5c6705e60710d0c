"""
What to delete: a whole session (results and its history, approvals and audit), a whole tenant, or old results.

Selection is separate from deletion, so ``purge --dry-run`` shows exactly what ``purge`` would delete. Objects this
library did not write (``other`` in the inventory) are never selected.

Age filter: results carry their creation time in their names, so "older than 30 days" needs one LIST and no HEAD per
object. Documents (history, approval and audit records) are kept by an age purge: they are the record of what
happened in a conversation and go with their session (``purge --tenant T --session S``) or with the bucket's lifecycle
rule.
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from haystack_integrations.offload.operations.inventory import StoredObject

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


def select_older_than(objects: Iterable[StoredObject], age: timedelta, *, now: datetime) -> PurgePlan:
    """
    Select the results created before ``now - age``.

    :param objects: What `scan` found.
    :param age: How old a result must be to go.
    :param now: The current time (timezone-aware).
    :returns: The plan.
    """
    cutoff = now - age
    return PurgePlan(
        [item for item in objects if item.kind == "result" and item.created is not None and item.created < cutoff]
    )
