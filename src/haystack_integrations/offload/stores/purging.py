"""
Deleting a scope's results and idle sessions' documents (`FsspecToolResultStore.purge`), and ending a session.

One purge for every caller: the store's `purge` and ``offload-haystack purge`` (through `operations.purge`) both choose
with `select_purge_async` (one listing) and delete with `delete_selection_async` (batched), so a preview shows exactly
what a purge deletes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from haystack_integrations.offload.stores.io import Listed
from haystack_integrations.offload.stores.layout import below, place
from haystack_integrations.offload.stores.names import PROBE_GRACE, TEMPORARY_GRACE, is_stale_temporary
from haystack_integrations.offload.stores.quotas import is_document
from haystack_integrations.offload.stores.result_objects import records_of
from haystack_integrations.offload.stores.retention import (
    DEFAULT_CLOCK_SKEW,
    IdleSessions,
    check_age,
    document_paths,
    read_activity_times_async,
    storage_times_async,
)
from haystack_integrations.offload.stores.sync_api import synced
from haystack_integrations.offload.stores.translate import storage_errors

if TYPE_CHECKING:
    from haystack_integrations.offload.stores.fsspec_store import FsspecToolResultStore

DELETE_BATCH = 1000
"""Objects per delete call: what one S3 DeleteObjects takes, so batching here adds no request."""


@dataclass(frozen=True)
class PurgeSelection:
    """What a purge of one scope deletes, chosen from one listing: paths below the scope's directory, with sizes."""

    results: dict[str, int]
    documents: dict[str, int]
    temporary_files: dict[str, int]
    """Temporary files of writers that died (and probe keys of killed checks): deleted, never counted."""
    listed: int
    """How many objects the listing found."""

    @property
    def counted(self) -> int:
        """How many objects a purge reports deleted: results and documents."""
        return len(self.results) + len(self.documents)

    def paths(self) -> list[str]:
        """
        :returns: Every path to delete, relative to the scope's directory.
        """
        return [*self.results, *self.documents, *self.temporary_files]


async def purge_scope_async(
    store: FsspecToolResultStore, older_than: timedelta | None, expired: bool, *, temporary_grace: timedelta
) -> int:
    """
    What `FsspecToolResultStore.purge_async` does (see there), with the grace a result write's temporary file gets.
    """
    selection = await select_purge_async(store, older_than, expired, temporary_grace=temporary_grace)
    await delete_selection_async(store, selection)
    return selection.counted


async def select_purge_async(
    store: FsspecToolResultStore,
    older_than: timedelta | None = None,
    expired: bool = False,
    *,
    documents: bool = False,
    temporary_grace: timedelta = TEMPORARY_GRACE,
) -> PurgeSelection:
    """
    Choose what a purge of the store's scope deletes, deleting nothing (see `FsspecToolResultStore.purge_async`).

    :param store: The store whose scope is purged.
    :param older_than: Only results created before ``now - older_than``, and inactive sessions' documents.
    :param expired: Only results past their retention, and the documents of sessions inactive that long.
    :param documents: With neither filter: every document of the scope too (the operator's purge of a tenant or a
        session), not only its results.
    :param temporary_grace: How old a result write's temporary file must be to go.
    :returns: The selection.
    :raises ValueError: As `purge_async` does, or if `documents` is combined with a filter.
    :raises StorageError: If the backend fails.
    """
    _check_purge(store, older_than, expired)
    if documents and (older_than is not None or expired):
        raise ValueError("documents=True purges every document of the scope: give no older_than or expired.")
    scope = store._scope_path()
    await store._handle.in_flight.wait_under(scope + "/")
    with storage_errors("list results", reference=None):
        # With each object's time (S3's LastModified): results are dated from the listing, not one HEAD each.
        listed = await store._handle.request("find", scope, lambda io: io.find_detailed_async(scope))
    found = {path: entry.size for path, entry in listed.items()}
    paths = await _purged_results_async(store, listed, older_than, expired)
    chosen = _every_document(store, found) if documents else []
    idle = _idle_sessions(store, found, older_than, expired)
    if idle is not None:
        idle.dated(await read_activity_times_async(store._handle.request, idle.to_read()))
        chosen += idle.documents()
    writes = store._handle.io().writes_temporary_files
    prefix = scope + "/"
    inside = {path: size for path, size in found.items() if path.startswith(prefix)}  # not a sibling 't/ab' of 't/a'
    stale = _stale_temporaries(inside, temporary_grace, writes=writes)

    def relative(paths: list[str]) -> dict[str, int]:
        return {path[len(prefix) :]: found[path] for path in paths}

    return PurgeSelection(relative(paths), relative(chosen), relative(stale), len(listed))


async def delete_selection_async(
    store: FsspecToolResultStore, selection: PurgeSelection, *, on_batch: Callable[[int], None] | None = None
) -> None:
    """
    Delete what `select_purge_async` chose for the store's scope, in batches of `DELETE_BATCH` (no request per object).

    :param store: The store the selection was made for.
    :param selection: The selection.
    :param on_batch: Called with the number of objects after each batch (for progress bars).
    :raises StorageError: If the backend fails; objects of earlier batches stay deleted.
    """
    scope = store._scope_path()
    doomed = [f"{scope}/{path}" for path in selection.paths()]
    try:
        for start in range(0, len(doomed), DELETE_BATCH):
            batch = doomed[start : start + DELETE_BATCH]
            await _delete_batch(store, scope, batch)
            if on_batch is not None:
                on_batch(len(batch))
    finally:
        store._handle.invalidate(store._scope)


async def _delete_batch(store: FsspecToolResultStore, scope: str, batch: list[str]) -> None:
    with storage_errors("purge results", reference=None):
        await store._handle.request("delete", scope, lambda io: io.delete_async(batch))


select_purge = synced(select_purge_async)
delete_selection = synced(delete_selection_async)


def _every_document(store: FsspecToolResultStore, found: Mapping[str, int]) -> list[str]:
    """Every session document of a listing of the store's scope (whatever its session)."""
    scope_path = store._scope_path()
    chosen = []
    for path in found:
        relative = below(path, scope_path)
        placed = place(relative, store._scope) if relative is not None else None
        if placed is not None and placed.namespace is not None and is_document("." + placed.namespace, placed.name):
            chosen.append(path)
    return chosen


def _check_purge(store: FsspecToolResultStore, older_than: timedelta | None, expired: bool) -> None:
    if older_than is not None and expired:
        raise ValueError("Give older_than or expired=True, not both.")
    if older_than is not None and older_than <= timedelta(0):
        raise ValueError(f"older_than must be positive, got {older_than}.")
    if older_than is not None:
        check_age(older_than, name="older_than")
    if expired and store.retention is None:
        raise ValueError("This store has no retention, so no result expires: pass retention=Retention(...).")


async def _purged_results_async(
    store: FsspecToolResultStore, listed: dict[str, Listed], older_than: timedelta | None, expired: bool
) -> list[str]:
    """
    The results of a listing that a purge deletes. Their names carry their writers' clocks: a name that says a
    result is old (or is stamped ahead of now) is checked against the storage's clock, so no writer's wrong clock
    gets a fresh result deleted (or keeps an old one for ever). That clock comes with the listing (S3's
    LastModified, a file's mtime); only where a listing carries no time is it asked of each such result.
    """
    now = datetime.now(UTC)
    retention = store.retention
    skew = retention.clock_skew if retention is not None else DEFAULT_CLOCK_SKEW

    def settled(created: datetime, tenant: str | None) -> bool:  # kept, by its name alone
        if older_than is not None:
            return now - older_than <= created <= now + skew
        return retention is not None and retention.live_by_name(created, tenant, now=now)

    def old(created: datetime, tenant: str | None) -> bool:
        if older_than is not None:
            return created < now - older_than
        return retention is None or retention.expired(created, tenant, now=now)

    everything = older_than is None and not expired  # no age to judge
    prefix = store._scope_path() + "/"
    candidates = {}
    sizes = {path: entry.size for path, entry in listed.items()}
    for record in records_of(store, sizes, include_expired=True):
        tenant = store._tenant_of(tuple(record.reference.split("/")))
        if everything or not settled(record.created, tenant):
            candidates[prefix + record.reference] = (record.created, tenant)
    if everything:
        return list(candidates)
    stored = {path: listed[path].modified for path in candidates}
    mute = [path for path, moment in stored.items() if moment is None]
    if mute:  # a listing without times (some fsspec filesystems): the storage is asked, of those results only
        asked = await storage_times_async(store._handle.request, mute)
        for path in mute:
            if path in asked:
                stored[path] = asked[path]
            else:
                del stored[path]  # gone meanwhile
    return [
        path
        for path, (named, tenant) in candidates.items()
        if path in stored and old(stored[path] or named, tenant)  # not in `stored`: gone meanwhile
    ]


def _idle_sessions(
    store: FsspecToolResultStore, found: dict[str, int], older_than: timedelta | None, expired: bool
) -> IdleSessions | None:
    """The sessions of a listing whose documents an age or retention purge may take (None: no such purge)."""
    now = datetime.now(UTC)
    retention = store.retention
    if older_than is not None:
        cutoff = now - older_than
        return IdleSessions(found, store._scope_path(), scope=store._scope, cutoff=lambda tenant: cutoff, now=now)
    if expired and retention is not None:

        def by_tenant(tenant: str) -> datetime | None:
            return retention.cutoff(tenant, now=now)

        return IdleSessions(found, store._scope_path(), scope=store._scope, cutoff=by_tenant, now=now)
    return None


async def delete_documents_async(store: FsspecToolResultStore) -> int:
    """Delete every document of the store's scope (a session's, when it ends)."""
    scope_path = store._scope_path()
    try:
        with storage_errors("delete documents", reference=None):
            found = await store._handle.request("find", scope_path, lambda io: io.find_async(scope_path))
            paths = document_paths(found, scope_path)
            await store._handle.request("delete", scope_path, lambda io: io.delete_async(paths))
    finally:
        store._handle.invalidate(store._scope)
    return len(paths)


async def end_session_async(store: FsspecToolResultStore, *, documents: bool = False) -> int:
    """
    Delete a session's results now, when the application ends the session.

    ```python
    from haystack_integrations.offload import end_session

    end_session(results.for_session(tenant=user.org_id, session=chat_id))
    ```

    :param store: A session store (from `for_session`).
    :param documents: Also delete the session's documents (approval requests and decisions, claims, audit, history).
        By default they are kept: they record what happened, and they go with the session once it has been inactive
        for its retention (``purge(expired=True)``), or with the bucket's lifecycle rule.
    :returns: How many objects were deleted (besides the temporary files of unfinished local writes, which go too).
    :raises ValueError: If `store` is not scoped to a session.
    :raises StorageError: If the backend fails; what was not deleted yet stays.
    """
    _require_session(store)
    # The session is over: a result write still unfinished (or whose writer died) goes with it, whatever its age.
    deleted = await purge_scope_async(store, None, False, temporary_grace=timedelta(0))
    if documents:
        deleted += await delete_documents_async(store)
    return deleted


end_session = synced(end_session_async)


def _require_session(store: FsspecToolResultStore) -> None:
    if store.session is None:
        raise ValueError("end_session needs a session store: pass root.for_session(tenant, session).")


def _stale_temporaries(found: Mapping[str, int], grace: timedelta, *, writes: bool) -> list[str]:
    """
    The temporary files of a listing whose writers died: a local write's, or a killed prober's probe key (the only
    temporary files on backends that write objects whole).

    :param found: Paths and sizes from a listing.
    :param grace: How old a result write's temporary file must be to go. A document write's always gets
        `TEMPORARY_GRACE`: ending a session keeps its documents, and their writes may still be running.
    :param writes: Whether the backend writes temporary files; if not, every one is a probe key, gone after
        `PROBE_GRACE` whatever `grace` says.
    :returns: Their paths.
    """
    now = datetime.now(UTC)
    stale = []
    for path in found:
        directory, _, name = path.rpartition("/")
        in_documents = directory.rpartition("/")[2].startswith(".")
        # A probe key may belong to a probe running now, whatever the purge (ending a session included).
        allowed = (TEMPORARY_GRACE if in_documents else grace) if writes else PROBE_GRACE
        if is_stale_temporary(name, now=now, grace=allowed):
            stale.append(path)
    return stale
