"""
What a store's scopes use of their quota: usage from the scope's usage marks or a listing, admissions and charges.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from haystack_integrations.offload.stores.exclusive_creates import checked
from haystack_integrations.offload.stores.layout import scope_path
from haystack_integrations.offload.stores.names import parse_object_name
from haystack_integrations.offload.stores.pages import list_after_async, sizes_of
from haystack_integrations.offload.stores.quotas import (
    ListingStart,
    Reservation,
    SessionUsage,
    TenantTotal,
    usage_by_session,
)
from haystack_integrations.offload.stores.scope import validate_scope_id
from haystack_integrations.offload.stores.translate import storage_errors
from haystack_integrations.offload.stores.usage_marks import (
    KEPT_MARKS,
    MARKS_DIRECTORY,
    SESSION_MARKS_DIRECTORY,
    Mark,
    MarkedUsage,
    UsageMarks,
    following,
    is_mark_name,
)

Entries = list[tuple[str, int]]
# A session listed in one page (S3's LIST answers up to 1000 keys) is counted from it; one that fills it has marks.
SESSION_PAGE = 1000

if TYPE_CHECKING:
    from haystack_integrations.offload.stores.fsspec_store import FsspecToolResultStore


class ScopeUsage:
    """
    A store's quota plumbing, for its scope: what the tenant or session holds (the tenant's newest usage mark, or a
    listing), and admitting or charging a write against it. Made per call (it holds nothing but its store).
    """

    def __init__(self, store: FsspecToolResultStore) -> None:
        self._store = store

    def _counts(self, tenant: str, name: str) -> bool:
        """Whether an object name is a result that counts against quotas: a result, not past its retention."""
        parsed = parse_object_name(name)
        return parsed is not None and not (
            self._store.retention is not None and self._store.retention.expired(parsed.created, tenant)
        )

    def _usage_path(self, scope: tuple[str, ...]) -> str:
        return scope_path(self._store._handle.root_path(), scope)

    async def list_usage_async(self, scope: tuple[str, ...], reconcile: bool = False) -> SessionUsage | TenantTotal:
        if self.marks_usage(scope):
            return await self._marked_usage_async(scope, reconcile=reconcile)
        path = self._usage_path(scope)
        with storage_errors("check the quota", reference=None):
            found = await self._store._handle.request("find", path, lambda io: io.find_async(path))
        return usage_by_session(sizes_of(found), scope, path, self._counts)

    def marks_usage(self, scope: tuple[str, ...]) -> bool:
        # Marks need exclusive creates: where this process knows the store ignores them, scopes are listed instead.
        if self._store.quota is None or not self._store.quota.marks(scope):
            return False
        verdict = checked(self._store._handle.backend_key())
        return verdict is None or verdict.enforced

    def _usage_marks(self, scope: tuple[str, ...]) -> UsageMarks:
        directory = f"{self._usage_path(scope)}/{MARKS_DIRECTORY if len(scope) == 1 else SESSION_MARKS_DIRECTORY}"

        async def list_first(path: str) -> str | None:
            # After "0": marks start with a digit, a local write's temporary file with a dot.
            start = f"{path}/0"
            found = await self._store._handle.request("list", path, lambda io: list_after_async(io, path, start, 1))
            return found[0][0].rpartition("/")[2] if found else None

        async def get(path: str) -> bytes:
            return await self._store._handle.request("get", path, lambda io: io.get_async(path))

        async def create(path: str, data: bytes) -> None:
            await self._store._handle.request("put_exclusive", path, lambda io: io.put_exclusive_async(path, data))

        return UsageMarks(directory, list_first, get, create)

    async def _marked_usage_async(self, scope: tuple[str, ...], *, reconcile: bool) -> SessionUsage | TenantTotal:
        """
        A scope's usage from its newest usage mark (a tenant: one LIST, max-keys 1, and one GET), adding what this
        worker admitted since its last mark (one exclusive create); from a full listing when a refusal rests on it, no
        mark exists yet, or the last reconcile is older than `Quota.reconcile_seconds`. A session's first listing page
        comes first: while the session fits it and has no marks, the page is its usage, as exact as a listing.
        """
        assert self._store.quota is not None  # noqa: S101 - marks_usage checked it
        marks, tracker = self._usage_marks(scope), self._store._handle.quota_tracker()
        with storage_errors("check the quota", reference=None):
            first_page = None
            if len(scope) == 2:
                start, page = tracker.listing_began(scope), await self._first_page_async(scope)
                first_page = (start, page)
                newest = next((name for name in _marks_in(page, marks.directory) if is_mark_name(name)), None)
                if newest is None and len(page) < SESSION_PAGE:
                    return self._listed_session(scope, start, page)
            if reconcile:  # a refusal rests on it: the newest mark this worker knows will do to start from
                before = tracker.known_mark(scope)
                return await self._reconcile_usage_async(scope, marks, before, refusal=True, first_page=first_page)
            if len(scope) == 1:
                latest = await marks.latest_async()
            else:
                latest = await marks.read_async(newest) if newest is not None else None
            now = int(datetime.now(UTC).timestamp())
            if latest is None or now - latest.reconciled >= self._store.quota.reconcile_seconds:
                return await self._reconcile_usage_async(scope, marks, latest, first_page=first_page)
            pending = tracker.take_pending(scope)
            mark = latest
            if pending != (0, 0):
                try:
                    mark = await marks.append_async(lambda newest: following(newest, *pending), latest=latest)
                except BaseException:
                    tracker.restore_pending(scope, pending)
                    raise
            tracker.remember_mark(scope, mark)
            return TenantTotal(mark.results, mark.size)

    async def _first_page_async(self, scope: tuple[str, ...]) -> Entries:
        path = self._usage_path(scope)
        return await self._store._handle.request(
            "list", path, lambda io: list_after_async(io, path, None, SESSION_PAGE)
        )

    def _listed_session(self, scope: tuple[str, ...], start: ListingStart, page: Entries) -> SessionUsage:
        """A session's usage from a listing that holds all of it; what this worker is yet to mark is what it missed."""
        tracker = self._store._handle.quota_tracker()
        _, unlisted = tracker.take_unlisted(scope, start)
        tracker.restore_pending(scope, unlisted)
        path = self._usage_path(scope)
        return usage_by_session(dict(page), scope, path, self._counts)

    async def _reconcile_usage_async(
        self,
        scope: tuple[str, ...],
        marks: UsageMarks,
        before: Mark | None,
        *,
        refusal: bool = False,
        first_page: tuple[ListingStart, Entries] | None = None,
    ) -> TenantTotal:
        """
        List the tenant and write a mark of what the listing found, plus what it may have missed: what marks added
        while it ran, and this worker's writes in flight when it began or admitted since (they may or may not be in
        it: counted, to err on the side of more). This worker's writes that landed before it began are in it, and
        count once. For a refusal, a listing that agrees with the newest mark known here (and what this worker is yet
        to add) writes nothing: a refused write sends no PUT unless drift is corrected. A session's listing goes on
        from its first page, if one was just listed.
        """
        path = self._usage_path(scope)
        tracker = self._store._handle.quota_tracker()
        if first_page is not None:
            start, found = first_page[0], dict(first_page[1])
            if len(first_page[1]) >= SESSION_PAGE:
                last = first_page[1][-1][0]
                rest = await self._store._handle.request(
                    "list", path, lambda io: list_after_async(io, path, last, None)
                )
                found.update(rest)
        else:
            start = tracker.listing_began(scope)
            found = sizes_of(await self._store._handle.request("find", path, lambda io: io.find_async(path)))
        sessions = usage_by_session(found, scope, path, self._counts)
        listed = (sum(count for count, _ in sessions.values()), sum(size for _, size in sessions.values()))
        unmarked = tracker.pending(scope)
        if refusal and before is not None and listed == (before.results + unmarked[0], before.size + unmarked[1]):
            # The marks and what this worker has yet to add to them agree with the listing: no drift to correct.
            return TenantTotal(*listed, sessions=sessions)
        # All of this worker's unmarked writes are taken (the mark carries them), but only what the listing may have
        # missed is added to it.
        pending, unlisted = tracker.take_unlisted(scope, start)
        now = int(datetime.now(UTC).timestamp())

        def make(newest: Mark | None) -> Mark:
            # Marks written since the listing began (all of them, if there was none before it): what they added may
            # have landed after the listing passed it.
            added_results = added_size = 0
            if newest is not None:
                added_results = newest.results - (before.results if before is not None else 0)
                added_size = newest.size - (before.size if before is not None else 0)
            results = listed[0] + max(added_results, 0) + unlisted[0]
            size = listed[1] + max(added_size, 0) + unlisted[1]
            return Mark(following(newest, 0, 0).sequence, results, size, now)

        try:
            # Tried first as the mark after `before`: if none was written since, no LIST is needed to know it.
            mark = await marks.append_async(make, latest=before)
        except BaseException:
            tracker.restore_pending(scope, pending)
            raise
        tracker.remember_mark(scope, mark)
        if not refusal:
            await self._prune_marks_async(marks, mark)
        return TenantTotal(mark.results, mark.size, sessions=sessions)

    async def _prune_marks_async(self, marks: UsageMarks, mark: Mark) -> None:
        """
        Delete marks far older than `mark` (a LIST and a batched delete of up to 1000), so the log stays short: a
        reconcile (hourly at most) prunes what the marks of the hour before added.
        """
        if mark.sequence <= KEPT_MARKS:
            return
        directory, oldest_kept = marks.directory, Mark(mark.sequence - KEPT_MARKS, 0, 0, 0).name
        start = f"{directory}/{oldest_kept}"
        old = await self._store._handle.request(
            "list", directory, lambda io: list_after_async(io, directory, start, 1000)
        )
        doomed = [path for path, _ in old]
        if doomed:
            await self._store._handle.request("delete", directory, lambda io: io.delete_async(doomed))

    async def admit_async(self, size: int) -> Reservation | None:
        if self._store.quota is None or self._store.tenant is None or self._store.session is None:
            return None
        return await self._store._handle.quota_tracker().admit_async(
            self._store.quota, self._store.tenant, self._store.session, size, self.list_usage_async
        )

    async def charge_document_async(self, size: int, *, enforce: bool) -> Reservation | None:
        """Count a document's bytes against the quota: charged (never refused) by default, or admitted if `enforce`."""
        if self._store.quota is None or self._store.tenant is None or self._store.session is None:
            return None
        tracker = self._store._handle.quota_tracker()
        if not enforce:
            reservation = tracker.charge(self._store.quota, self._store.tenant, self._store.session, size)
            await self._mark_charges_async((self._store.tenant,), self._store.quota.tenant_bytes)
            await self._mark_charges_async((self._store.tenant, self._store.session), self._store.quota.session_bytes)
            return reservation
        return await tracker.admit_async(
            self._store.quota, self._store.tenant, self._store.session, size, self.list_usage_async, results=0
        )

    async def _mark_charges_async(self, scope: tuple[str, ...], bytes_limit: int | None) -> None:
        """
        Once the documents charged here in a scope pass its bytes allowance, add them to its usage marks now: a
        charge waits for no refresh, and other workers must not go more than an allowance without seeing them. A
        session not known here to have marks is listed, which shows them: no mark then.
        """
        quota, tracker = self._store.quota, self._store._handle.quota_tracker()
        if quota is None or bytes_limit is None or not self.marks_usage(scope):
            return
        if len(scope) == 2 and tracker.known_mark(scope) is None:
            return
        pending = tracker.pending(scope)
        if pending[1] <= quota.allowance(bytes_limit):
            return
        marks = self._usage_marks(scope)
        pending = tracker.take_pending(scope)
        try:
            mark = await marks.append_async(lambda newest: following(newest, *pending))
        except (OSError, RuntimeError):
            # A charge is never refused, so neither is it failed: the next refresh marks what this one could not.
            tracker.restore_pending(scope, pending)
            return
        except BaseException:
            tracker.restore_pending(scope, pending)
            raise
        tracker.remember_mark(scope, mark)

    async def marked_usage_async(self, tenant: str | None = None) -> MarkedUsage | None:
        tenant = validate_scope_id(tenant, field="tenant") if tenant is not None else self._store.tenant
        if tenant is None:
            raise ValueError("marked_usage needs a tenant: give one, or call it on a tenant or session store.")
        with storage_errors("read the tenant's usage mark", reference=None):
            mark = await self._usage_marks((tenant,)).latest_async()
        return MarkedUsage.of(mark) if mark is not None else None

    async def reconcile_usage_async(self, tenant: str | None = None) -> tuple[int, int]:
        tenant = validate_scope_id(tenant, field="tenant") if tenant is not None else self._store.tenant
        if tenant is None or not self.marks_usage((tenant,)):
            raise ValueError("reconcile_usage needs a tenant and a quota with tenant_usage='marks'.")
        marks = self._usage_marks((tenant,))
        with storage_errors("reconcile the quota's usage", reference=None):
            total = await self._reconcile_usage_async((tenant,), marks, await marks.latest_async())
        self._store._handle.quota_tracker().invalidate((tenant,))
        return total.results, total.size


def _marks_in(page: Entries, directory: str) -> list[str]:
    """The names of a listing page's objects in a marks directory (newest mark first: they sort first)."""
    prefix = f"{directory}/"
    return [path[len(prefix) :] for path, _ in page if path.startswith(prefix)]
