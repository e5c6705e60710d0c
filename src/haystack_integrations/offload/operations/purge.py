"""
What to delete: a whole session (results and its history, approvals and audit), a whole tenant, or old results.

`plan_purge` asks the store's own purge what it would delete (`stores.purging.select_purge`), and `carry_out` deletes
that through the store's purge (`stores.purging.delete_selection`): one purge, so ``purge --dry-run`` shows exactly
what ``purge`` deletes, and what the store's `purge` would.
"""

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from haystack_integrations.offload.operations.inventory import StoredObject, classify, require_root, scope_below
from haystack_integrations.offload.stores import FsspecToolResultStore
from haystack_integrations.offload.stores.names import TEMPORARY_GRACE, is_stale_temporary
from haystack_integrations.offload.stores.purging import PurgeSelection, delete_selection, select_purge
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
    selection: PurgeSelection | None = field(default=None, repr=False, compare=False)
    """What the store's purge chose (`plan_purge`), for `carry_out`; None for a plan made from a scan."""
    store: FsspecToolResultStore | None = field(default=None, repr=False, compare=False)
    """The scoped store `selection` was made for."""

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
        # A probe key left in a root's or a tenant's own directory belongs to no session.
        return sorted({f"{item.tenant}/{item.session}" for item in self.objects if item.session is not None})


def plan_purge(
    root: FsspecToolResultStore,
    *,
    tenant: str | None = None,
    session: str | None = None,
    older_than: timedelta | None = None,
) -> PurgePlan:
    """
    What the store's own purge of a scope deletes, deleting nothing (one listing; see `FsspecToolResultStore.purge`).

    Without `older_than`: every result and every document of the tenant or session (``purge(documents=True)``); with
    it: results older than that by the storage's clock, and the documents of sessions inactive that long (the store's
    ``purge(older_than=...)``). Either way, the temporary files of writers that died.

    :param root: An unscoped store.
    :param tenant: Limit the purge to this tenant.
    :param session: Limit it to this session of `tenant`.
    :param older_than: The age; None to take the whole scope (which then needs a tenant).
    :returns: The plan, with paths relative to the root, sorted; `carry_out` deletes it.
    :raises ValueError: If `root` is scoped, `session` is given without `tenant`, neither a tenant nor an age is given,
        or the age is not one the store's purge takes.
    :raises InvalidScopeIdError: If an id is not a safe path segment.
    :raises StorageError: If the backend fails.
    """
    require_root(root)
    below = scope_below(tenant, session)
    if not below and older_than is None:
        raise ValueError("Purging a whole root takes an age: give a tenant, or older_than.")
    scope = root.for_session(*below) if len(below) == 2 else root.for_tenant(*below) if below else root
    selection = select_purge(scope, older_than, documents=older_than is None, temporary_grace=TEMPORARY_GRACE)
    prefix = "".join(f"{segment}/" for segment in below)
    chosen = [
        _placed(prefix + path, size, kind)
        for kind, paths in (
            ("result", selection.results),
            ("document", selection.documents),
            ("temporary", selection.temporary_files),
        )
        for path, size in paths.items()
    ]
    return PurgePlan(sorted(chosen, key=lambda item: item.path), selection=selection, store=scope)


def _placed(path: str, size: int, kind: str) -> StoredObject:
    """An object of a plan, as `classify` names it, of the kind the store's purge took it for."""
    item = classify(path, size)
    # The same but for a root's own results, or a probe key outside any session, which no session layout places.
    return item if item.kind == kind else replace(item, kind=kind)  # type: ignore[arg-type]


def carry_out(plan: PurgePlan, *, on_batch: Callable[[int], None] | None = None) -> int:
    """
    Delete what `plan_purge` planned, as the store's purge deletes (batched: no request per object).

    :param plan: A plan from `plan_purge`.
    :param on_batch: Called with the number of objects after each batch (for progress bars).
    :returns: How many objects were deleted (asked to be; one gone meanwhile is not an error), temporary files included.
    :raises ValueError: If the plan was made from a scan (`select_scope`, `select_older_than`): delete it with `delete`.
    :raises StorageError: If the backend fails; objects of earlier batches stay deleted.
    """
    if plan.selection is None or plan.store is None:
        raise ValueError("This plan was made from a scan, not by plan_purge: delete its objects with delete().")
    delete_selection(plan.store, plan.selection, on_batch=on_batch)
    return len(plan.objects)


def select_scope(objects: Iterable[StoredObject], *, now: datetime | None = None) -> PurgePlan:
    """
    Select every result and document of a scan (a session's or a tenant's: scope the scan itself), and the temporary
    files of local writes whose writer died. For a script holding a scan; ``purge`` asks the store (`plan_purge`).

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

    A scan carries no storage times, so results go by their names' times here; ``purge --older-than`` and the
    store's ``purge(older_than=...)`` check those against the storage's clock (`plan_purge`).

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
