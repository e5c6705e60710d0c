"""
What a store's scopes use of their quota: usage from the tenant's usage marks or a listing, admissions and charges.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from haystack_integrations.offload.stores.exclusive_creates import checked
from haystack_integrations.offload.stores.layout import scope_path
from haystack_integrations.offload.stores.names import parse_object_name
from haystack_integrations.offload.stores.pages import list_after_async, sizes_of
from haystack_integrations.offload.stores.quotas import Reservation, SessionUsage, TenantTotal, usage_by_session
from haystack_integrations.offload.stores.scope import validate_scope_id
from haystack_integrations.offload.stores.translate import storage_errors
from haystack_integrations.offload.stores.usage_marks import (
    KEPT_MARKS,
    MARKS_DIRECTORY,
    Mark,
    MarkedUsage,
    UsageMarks,
    following,
)

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
        if len(scope) == 1 and self.marks_usage():
            return await self._tenant_usage_async(scope[0], reconcile=reconcile)
        path = self._usage_path(scope)
        with storage_errors("check the quota", reference=None):
            found = await self._store._handle.request("find", path, lambda io: io.find_async(path))
        return usage_by_session(sizes_of(found), scope, path, self._counts)

    def marks_usage(self) -> bool:
        # Marks need exclusive creates: where this process knows the store ignores them, tenants are listed instead.
        if self._store.quota is None or self._store.quota.tenant_usage != "marks":
            return False
        verdict = checked(self._store._handle.backend_key())
        return verdict is None or verdict.enforced

    def _usage_marks(self, tenant: str) -> UsageMarks:
        directory = f"{self._usage_path((tenant,))}/{MARKS_DIRECTORY}"

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

    async def _tenant_usage_async(self, tenant: str, *, reconcile: bool) -> TenantTotal:
        """
        A tenant's usage from its newest usage mark (one LIST, max-keys 1, and one GET), adding what this worker
        admitted since its last mark (one exclusive create); from a full listing when a refusal rests on it, no mark
        exists yet, or the last reconcile is older than `Quota.reconcile_seconds`.
        """
        assert self._store.quota is not None  # noqa: S101 - marks_usage checked it
        marks, tracker = self._usage_marks(tenant), self._store._handle.quota_tracker()
        with storage_errors("check the quota", reference=None):
            if reconcile:  # a refusal rests on it: the newest mark this worker knows will do to start from
                return await self._reconcile_usage_async(tenant, marks, tracker.known_mark(tenant), refusal=True)
            latest = await marks.latest_async()
            now = int(datetime.now(UTC).timestamp())
            if latest is None or now - latest.reconciled >= self._store.quota.reconcile_seconds:
                return await self._reconcile_usage_async(tenant, marks, latest)
            pending = tracker.take_pending(tenant)
            mark = latest
            if pending != (0, 0):
                try:
                    mark = await marks.append_async(lambda newest: following(newest, *pending), latest=latest)
                except BaseException:
                    tracker.restore_pending(tenant, pending)
                    raise
            tracker.remember_mark(tenant, mark)
            return TenantTotal(mark.results, mark.size)

    async def _reconcile_usage_async(
        self, tenant: str, marks: UsageMarks, before: Mark | None, *, refusal: bool = False
    ) -> TenantTotal:
        """
        List the tenant and write a mark of what the listing found, plus what it may have missed: what marks added
        while it ran, and this worker's writes in flight when it began or admitted since (they may or may not be in
        it: counted, to err on the side of more). This worker's writes that landed before it began are in it, and
        count once. For a refusal, a listing that agrees with the newest mark known here (and what this worker is yet
        to add) writes nothing: a refused write sends no PUT unless drift is corrected.
        """
        scope = (tenant,)
        path = self._usage_path(scope)
        tracker = self._store._handle.quota_tracker()
        start = tracker.listing_began(tenant)
        found = await self._store._handle.request("find", path, lambda io: io.find_async(path))
        sessions = usage_by_session(sizes_of(found), scope, path, self._counts)
        listed = (sum(count for count, _ in sessions.values()), sum(size for _, size in sessions.values()))
        unmarked = tracker.pending(tenant)
        if refusal and before is not None and listed == (before.results + unmarked[0], before.size + unmarked[1]):
            # The marks and what this worker has yet to add to them agree with the listing: no drift to correct.
            return TenantTotal(*listed, sessions=sessions)
        # All of this worker's unmarked writes are taken (the mark carries them), but only what the listing may have
        # missed is added to it.
        pending, unlisted = tracker.take_unlisted(tenant, start)
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
            tracker.restore_pending(tenant, pending)
            raise
        tracker.remember_mark(tenant, mark)
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
            await self._mark_charges_async(self._store.tenant)
            return reservation
        return await tracker.admit_async(
            self._store.quota, self._store.tenant, self._store.session, size, self.list_usage_async, results=0
        )

    async def _mark_charges_async(self, tenant: str) -> None:
        """
        Once the documents charged here in a tenant pass its bytes allowance, add them to its usage marks now: a
        charge waits for no refresh, and other workers must not go more than an allowance without seeing them.
        """
        quota, tracker = self._store.quota, self._store._handle.quota_tracker()
        if quota is None or quota.tenant_bytes is None or not self.marks_usage():
            return
        pending = tracker.pending(tenant)
        if pending[1] <= quota.allowance(quota.tenant_bytes):
            return
        marks = self._usage_marks(tenant)
        pending = tracker.take_pending(tenant)
        try:
            mark = await marks.append_async(lambda newest: following(newest, *pending))
        except (OSError, RuntimeError):
            # A charge is never refused, so neither is it failed: the next refresh marks what this one could not.
            tracker.restore_pending(tenant, pending)
            return
        except BaseException:
            tracker.restore_pending(tenant, pending)
            raise
        tracker.remember_mark(tenant, mark)

    async def marked_usage_async(self, tenant: str | None = None) -> MarkedUsage | None:
        tenant = validate_scope_id(tenant, field="tenant") if tenant is not None else self._store.tenant
        if tenant is None:
            raise ValueError("marked_usage needs a tenant: give one, or call it on a tenant or session store.")
        with storage_errors("read the tenant's usage mark", reference=None):
            mark = await self._usage_marks(tenant).latest_async()
        return MarkedUsage.of(mark) if mark is not None else None

    async def reconcile_usage_async(self, tenant: str | None = None) -> tuple[int, int]:
        tenant = validate_scope_id(tenant, field="tenant") if tenant is not None else self._store.tenant
        if tenant is None or not self.marks_usage():
            raise ValueError("reconcile_usage needs a tenant and a quota with tenant_usage='marks'.")
        marks = self._usage_marks(tenant)
        with storage_errors("reconcile the quota's usage", reference=None):
            total = await self._reconcile_usage_async(tenant, marks, await marks.latest_async())
        self._store._handle.quota_tracker().invalidate((tenant,))
        return total.results, total.size
