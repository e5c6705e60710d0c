"""
Quotas: per-session and per-tenant limits on stored results and bytes, checked before a write sends anything.

Results count against the results and bytes limits, session documents against the bytes limits (charged, refused only
where their writer asks). Each worker admits writes against its last view of a scope plus what it admitted since;
across W workers usage stays within ``limit + (W - 1) x allowance``. A tenant's view is, by default, its newest usage
mark (`stores.usage_marks`), reconciled by a listing; a session's, a listing while it fits one page, then its own marks
(see `QuotaTracker`).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

from haystack_integrations.offload.errors import QuotaExceededError
from haystack_integrations.offload.stores.layout import below, place
from haystack_integrations.offload.stores.usage_marks import SESSION_MARKS_NAMESPACE, Mark

ScopeKey = tuple[str, ...]
# What a listing of a tenant (or of one session) found: results and bytes per session.
SessionUsage = dict[str, tuple[int, int]]


@dataclass(frozen=True)
class TenantTotal:
    """A tenant's (or a session's) usage as its newest usage mark gives it, and per session when a listing was made."""

    results: int
    size: int
    sessions: SessionUsage | None = None
    """Per session, from the reconcile's listing (None: a mark only, no listing)."""


Usage: TypeAlias = SessionUsage | TenantTotal
AsyncLister = Callable[[ScopeKey, bool], Awaitable[Usage]]
"""Lists a scope's usage; the flag asks for a full listing (a refusal rests on it) rather than a usage mark."""

# Scopes tracked per worker; the least recently used idle one is forgotten beyond this (and listed again when needed).
MAX_TRACKED_SCOPES = 10_000


class Quota(BaseModel):
    """
    Limits on what each session and each tenant may store, checked before a write sends anything.

    A write that would pass a limit raises `QuotaExceededError` and stores nothing; `OffloadHook` then keeps that
    result in the conversation and logs the refusal once, with the tenant and the session.

    ```python
    from haystack_integrations.offload import FsspecToolResultStore, Quota

    results = FsspecToolResultStore(
        "s3://acme-agent-results/prod",
        quota=Quota(session_results=500, session_bytes=200 * 2**20, tenant_bytes=20 * 2**30),
    )
    ```

    Multi-user use: set the quota on the root store at start-up; every `for_session` store derived from it shares one
    usage tracker per worker process. Across worker processes the limit holds within a bounded overshoot (see the
    module documentation): ``limit + (workers - 1) x slack x limit``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_results: int | None = Field(default=None, ge=0, description="Results one session may hold.")
    session_bytes: int | None = Field(default=None, ge=0, description="Bytes of results one session may hold.")
    tenant_results: int | None = Field(default=None, ge=0, description="Results one tenant may hold, all sessions.")
    tenant_bytes: int | None = Field(default=None, ge=0, description="Bytes of results one tenant may hold.")
    refresh_seconds: float = Field(
        default=60.0, gt=0, description="A worker lists a scope again when its listing is older than this."
    )
    slack: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Share of a limit a worker may admit between two listings of a scope (the cross-worker overshoot).",
    )
    recheck_seconds: float = Field(
        default=1.0,
        ge=0,
        description="A write is refused only on a listing at most this old (0: one begun after the write asked).",
    )
    tenant_usage: Literal["marks", "listing"] = Field(
        default="marks",
        description="How a worker learns a tenant's usage: its newest usage mark (one LIST with max-keys 1), or a "
        "listing of the whole tenant (a LIST per 1000 objects).",
    )
    session_usage: Literal["marks", "listing"] = Field(
        default="marks",
        description="How a worker learns a session's usage: a listing while the session fits one LIST page, then "
        "its newest usage mark (the same LIST, and a GET); or a listing of the whole session (a LIST per 1000 "
        "objects).",
    )
    reconcile_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="Usage marks are reconciled with a full listing at least this often (drift from crashed "
        "workers and deletes lasts no longer).",
    )

    def limits(self, level: Literal["session", "tenant"]) -> tuple[int | None, int | None]:
        """
        :param level: ``"session"`` or ``"tenant"``.
        :returns: The results and bytes limits at that level (None: no limit).
        """
        if level == "session":
            return self.session_results, self.session_bytes
        return self.tenant_results, self.tenant_bytes

    def marks(self, scope: tuple[str, ...]) -> bool:
        """
        :param scope: ``(tenant,)`` or ``(tenant, session)``.
        :returns: Whether usage at that level is kept by usage marks.
        """
        return (self.tenant_usage if len(scope) == 1 else self.session_usage) == "marks"

    def allowance(self, limit: int) -> int:
        """
        :param limit: A results or bytes limit.
        :returns: How much a worker may admit against it between two listings (at least 1).
        """
        return max(1, math.floor(self.slack * limit))


@dataclass
class _Entry:
    """One reservation: a write admitted and not yet known to be in a listing."""

    sequence: int
    results: int
    size: int
    settled_event: int = 0
    """When the write finished, on the tracker's event clock (0 while in flight)."""


@dataclass
class _ScopeState:
    """What one worker knows about one scope's usage."""

    baseline_results: int = 0
    baseline_bytes: int = 0
    listed: bool = False
    listed_at: float = 0.0
    """When the listing began: what a refusal's freshness is judged by."""
    arrived_at: float = 0.0
    """When the listing came back: what the next periodic refresh counts from, so a slow listing is not stale on
    arrival (listed again at once, for ever when listing takes longer than `Quota.refresh_seconds`)."""
    listed_event: int = 0
    stale: bool = False
    marked: bool = False
    """The view is a usage mark, not a listing: a refusal does not rest on it."""
    in_flight: dict[int, _Entry] = field(default_factory=dict)
    settled: list[_Entry] = field(default_factory=list)
    refreshing: Future[None] | None = None
    changed: Future[None] = field(default_factory=Future)

    def unverified(self) -> tuple[int, int]:
        entries = itertools.chain(self.in_flight.values(), self.settled)
        results = size = 0
        for entry in entries:
            results += entry.results
            size += entry.size
        return results, size

    def usage(self) -> tuple[int, int]:
        results, size = self.unverified()
        return self.baseline_results + results, self.baseline_bytes + size

    def notify(self) -> None:
        changed, self.changed = self.changed, Future()
        _resolve(changed)

    def idle(self) -> bool:
        return not self.in_flight and self.refreshing is None


@dataclass(frozen=True)
class ListingStart:
    """What a tenant's reconcile listing may miss of this worker's writes, noted as it began (`listing_began`)."""

    admitted: tuple[int, int]
    """Results and bytes ever admitted or charged here in the tenant, as the listing began."""
    in_flight: tuple[int, int]
    """Results and bytes of the writes in flight as the listing began: they may land before or after it passes."""


@dataclass(frozen=True)
class _Refresh:
    scope: ScopeKey
    event: int
    """When the listing began, on the tracker's event clock: every write settled before it is in the listing."""
    started: float
    done: Future[None]
    reconcile: bool = False
    """A refusal rests on it: a full listing, not a usage mark."""


@dataclass(frozen=True)
class _Wait:
    future: Future[None]


class Reservation:
    """A write admitted under a quota; `settle` it once the write has finished, whatever the outcome."""

    def __init__(self, tracker: QuotaTracker, scopes: tuple[ScopeKey, ...], entry: _Entry) -> None:
        self._tracker = tracker
        self._scopes = scopes
        self._entry = entry
        self._settled = False

    def settle(self) -> None:
        """
        Record that the write finished. It keeps counting until the next listing, landed or not (a failed write may
        have landed), so the tracker never counts less than what is stored.
        """
        if not self._settled:
            self._settled = True
            self._tracker._settle(self._scopes, self._entry)


@dataclass(frozen=True)
class _Admission:
    quota: Quota
    tenant: str
    session: str
    size: int
    results: int
    """Results the write adds: 1 for a result, 0 for a document."""
    began: int
    """When the admission began, on the tracker's event clock: a listing begun later was made for this write."""


class QuotaTracker:
    """
    One worker's view of the usage of the scopes it writes to; shared by a root store and every store derived from it.

    Tenant usage marks: at each refresh of a tenant a worker reads the newest mark (a LIST with max-keys 1 and a GET,
    however large the tenant) and adds what it admitted and charged since its last mark (one exclusive create), so a
    worker's first quota'd write costs its PUT and those two requests at any tenant size. The bound holds as with
    listings: what a worker has admitted and not marked is at most its allowance (it refreshes, and so marks, before
    going past it; charged documents are marked once they pass the bytes allowance). Marks drift where nothing marks
    a change: a worker that dies leaves up to one allowance per tenant unmarked (usage undercounted by that much);
    deletes, purges and expiry leave usage overcounted. Drift lasts until a reconcile, a full listing of the tenant
    that rewrites the newest mark: before any refusal (a refusal never rests on a mark, only on a listing at most
    `Quota.recheck_seconds` old, as before), on the first refresh after `Quota.reconcile_seconds`, and on
    `FsspecToolResultStore.reconcile_usage`. Where this process knows the store ignores exclusive creates, or with
    ``Quota(tenant_usage="listing")``, tenants are listed instead.

    Session marks: a session is listed while its listing fits one page (one LIST, exact, as before); the first refresh
    that finds more reconciles it into marks of its own, which sort first in its listing, so that same LIST says
    whether it has them. From then on its refreshes cost that LIST and a GET (and a create for what this worker
    admitted since), whatever it holds. What a worker admitted between its last listing and the first mark may count
    twice (at most its allowance, on the side of more).

    Thread-safe and usable from any number of event loops: decisions are taken under a lock with no I/O, listings and
    waits happen outside it.
    """

    def __init__(self, max_scopes: int = MAX_TRACKED_SCOPES) -> None:
        """
        :param max_scopes: How many scopes to keep track of before forgetting the least recently used idle one.
        """
        self._lock = threading.Lock()
        self._states: OrderedDict[ScopeKey, _ScopeState] = OrderedDict()
        # Per tenant: the per-session usage its latest listing found, to start session states without a LIST.
        self._tenant_sessions: dict[str, SessionUsage] = {}
        # One clock orders admissions, settlements and listing starts, so a listing knows which writes it includes.
        self._events = itertools.count(1)
        self._max_scopes = max_scopes
        # Per scope kept by usage marks: results and bytes admitted or charged here and not yet in a mark (for a
        # session still listed: not yet in a listing), and the newest mark this worker has seen (a reconcile tries to
        # write the one after it without listing the marks).
        self._pending: dict[ScopeKey, tuple[int, int]] = {}
        # Per scope: everything ever added to its pending, so a reconcile knows what was admitted after its listing
        # began (what may be missing from the listing) apart from what landed before (what the listing holds).
        self._admitted: dict[ScopeKey, tuple[int, int]] = {}
        self._marks: dict[ScopeKey, Mark] = {}

    # Admission

    async def admit_async(
        self, quota: Quota, tenant: str, session: str, size: int, lister: AsyncLister, *, results: int = 1
    ) -> Reservation:
        """
        Admit a write of `size` bytes to `tenant`/`session`, listing scopes with `lister` when needed; waits and lists
        without blocking the event loop. The store's sync writes run it on their loop too: there is no sync twin.

        :param quota: The limits.
        :param tenant: The writing store's tenant.
        :param session: The writing store's session.
        :param size: The bytes the write will store.
        :param lister: Lists a scope's usage.
        :param results: The results the write adds: 1 for a result, 0 for a document.
        :returns: The reservation to settle when the write is done.
        :raises QuotaExceededError: If the write would pass a limit.
        :raises StorageError: If a listing needed for the decision failed.
        """
        admission = self._begin(quota, tenant, session, size, results)
        while True:
            step = self._decide(admission)
            if isinstance(step, Reservation):
                return step
            if isinstance(step, _Wait):
                # Shielded: a cancelled waiter must not cancel the future every other waiter shares.
                await asyncio.shield(asyncio.wrap_future(step.future))
                continue
            try:
                usage = await lister(step.scope, step.reconcile)
            except BaseException:
                self._refresh_failed(step)
                raise
            self._refreshed(step, usage)

    def charge(self, quota: Quota, tenant: str, session: str, size: int) -> Reservation:
        """
        Count a write of `size` bytes (a document that must not be refused) without deciding anything: no listing, no
        wait, no refusal. It counts like an admitted write until a listing that includes it, so the writes that follow
        see it.

        :param quota: The limits (only the levels that have limits are tracked).
        :param tenant: The writing store's tenant.
        :param session: The writing store's session.
        :param size: The bytes the write will store.
        :returns: The reservation to settle when the write is done.
        """
        scopes = tuple(scope for _, scope in _levels(quota, tenant, session))
        with self._lock:
            entry = _Entry(sequence=next(self._events), results=0, size=size)
            for scope in scopes:
                self._state(scope).in_flight[entry.sequence] = entry
            self._add_pending(quota, scopes, 0, size)
            return Reservation(self, scopes, entry)

    # Usage marks: what this worker has to add to its scopes' marks

    def take_pending(self, scope: ScopeKey) -> tuple[int, int]:
        """
        Take what this worker admitted and charged in `scope` since its last usage mark, to write it in the next.

        :param scope: ``(tenant,)`` or ``(tenant, session)``.
        :returns: Results and bytes; `restore_pending` them if the mark is not written.
        """
        with self._lock:
            return self._pending.pop(scope, (0, 0))

    def restore_pending(self, scope: ScopeKey, pending: tuple[int, int]) -> None:
        """
        Put back what `take_pending` took, the mark that was to carry it not written.

        :param scope: ``(tenant,)`` or ``(tenant, session)``.
        :param pending: Results and bytes.
        """
        with self._lock:
            results, size = self._pending.get(scope, (0, 0))
            self._pending[scope] = (results + pending[0], size + pending[1])

    def listing_began(self, scope: ScopeKey) -> ListingStart:
        """
        Note what a listing of `scope`, beginning now, may miss of this worker's writes: those in flight (they may land
        before or after the listing passes them) and, through `take_unlisted`, those admitted later.

        :param scope: ``(tenant,)`` or ``(tenant, session)``.
        :returns: What to give `take_unlisted` once the listing is back.
        """
        with self._lock:
            state = self._states.get(scope)
            results = size = 0
            for entry in state.in_flight.values() if state is not None else ():
                results += entry.results
                size += entry.size
            return ListingStart(admitted=self._admitted.get(scope, (0, 0)), in_flight=(results, size))

    def take_unlisted(self, scope: ScopeKey, start: ListingStart) -> tuple[tuple[int, int], tuple[int, int]]:
        """
        Take what this worker has not marked in `scope` (as `take_pending`), for a mark written from a listing, and
        say how much of it the listing may miss: what was in flight when it began and what was admitted since. What
        settled before it began is in it and must not count twice.

        :param scope: ``(tenant,)`` or ``(tenant, session)``.
        :param start: What `listing_began` returned when the listing began.
        :returns: What was taken (`restore_pending` it if the mark is not written), and what to add to the listing.
        """
        with self._lock:
            taken = self._pending.pop(scope, (0, 0))
            admitted = self._admitted.get(scope, (0, 0))
            # Admitted since the listing began and still unmarked: at most what was taken (a mark written meanwhile
            # carries the rest, and is counted as marks added during the listing).
            since_results = min(taken[0], admitted[0] - start.admitted[0])
            since_size = min(taken[1], admitted[1] - start.admitted[1])
            return taken, (since_results + start.in_flight[0], since_size + start.in_flight[1])

    def pending(self, scope: ScopeKey) -> tuple[int, int]:
        """
        :param scope: ``(tenant,)`` or ``(tenant, session)``.
        :returns: Results and bytes admitted or charged here and not yet in a usage mark.
        """
        with self._lock:
            return self._pending.get(scope, (0, 0))

    def known_mark(self, scope: ScopeKey) -> Mark | None:
        """
        :param scope: ``(tenant,)`` or ``(tenant, session)``.
        :returns: The newest usage mark this worker has read or written for the scope, if any.
        """
        with self._lock:
            return self._marks.get(scope)

    def remember_mark(self, scope: ScopeKey, mark: Mark) -> None:
        """
        :param scope: ``(tenant,)`` or ``(tenant, session)``.
        :param mark: A usage mark just read or written.
        """
        with self._lock:
            known = self._marks.get(scope)
            if known is None or known.sequence <= mark.sequence:
                self._marks[scope] = mark

    def _add_pending(self, quota: Quota, scopes: tuple[ScopeKey, ...], results: int, size: int) -> None:
        for scope in scopes:
            if quota.marks(scope):
                pending_results, pending_size = self._pending.get(scope, (0, 0))
                self._pending[scope] = (pending_results + results, pending_size + size)
                admitted_results, admitted_size = self._admitted.get(scope, (0, 0))
                self._admitted[scope] = (admitted_results + results, admitted_size + size)

    def invalidate(self, scope: ScopeKey) -> None:
        """
        Forget what is known about `scope` and every scope below or above it: the next write there lists again.

        Called after deletes and purges, so freed quota is seen at once by this worker.

        :param scope: ``()`` for everything, ``(tenant,)`` or ``(tenant, session)``.
        """
        with self._lock:
            for key, state in self._states.items():
                if key[: len(scope)] == scope or scope[: len(key)] == key:
                    state.stale = True
            for tenant in list(self._tenant_sessions):
                if not scope or scope[0] == tenant:
                    del self._tenant_sessions[tenant]

    def usage(self, tenant: str, session: str | None = None) -> tuple[int, int] | None:
        """
        What this worker currently counts for a scope (for metrics and tests).

        :param tenant: The tenant.
        :param session: A session of the tenant, or None for the whole tenant.
        :returns: Results and bytes, or None if the scope is not tracked.
        """
        with self._lock:
            state = self._states.get((tenant,) if session is None else (tenant, session))
            return state.usage() if state is not None and state.listed else None

    # Decisions, under the lock

    def _begin(self, quota: Quota, tenant: str, session: str, size: int, results: int) -> _Admission:
        with self._lock:
            return _Admission(quota, tenant, session, size, results, began=next(self._events))

    def _decide(self, admission: _Admission) -> Reservation | _Refresh | _Wait:
        quota, size, adding = admission.quota, admission.size, admission.results
        levels = _levels(quota, admission.tenant, admission.session)
        now = time.monotonic()
        with self._lock:
            states = []
            for level, scope in levels:
                state = self._state(scope)
                if state.refreshing is not None:
                    return _Wait(state.refreshing)
                # A listing begun after this write asked was made for it: never too old for it, however long it took.
                aged = now - state.arrived_at >= quota.refresh_seconds and state.listed_event < admission.began
                if not state.listed or state.stale or aged:
                    return self._start_refresh(scope, state, now)
                results_limit, bytes_limit = quota.limits(level)
                used_results, used_bytes = state.usage()
                # A document adds no result, so only the bytes limit can refuse it.
                over = (_over(results_limit, used_results, adding, "results") if adding else None) or _over(
                    bytes_limit, used_bytes, size, "bytes"
                )
                if over is not None:
                    # A refusal rests on a recent listing, or one begun after this write asked (by it or a concurrent
                    # write: that one always counts, or a slow listing would refresh forever).
                    recent = now - state.listed_at <= quota.recheck_seconds and not state.marked
                    if (state.listed_event < admission.began or state.marked) and not recent:
                        return self._start_refresh(scope, state, now, reconcile=True)
                    raise _refusal(admission, level, over, used_results if over[0] == "results" else used_bytes)
                unverified_results, unverified_bytes = state.unverified()
                beyond = (
                    results_limit is not None
                    and adding > 0
                    and unverified_results + adding > quota.allowance(results_limit)
                ) or (
                    bytes_limit is not None
                    and unverified_bytes > 0
                    and unverified_bytes + size > quota.allowance(bytes_limit)
                )
                if beyond:
                    # This worker has admitted its allowance since it last looked: others may have written too.
                    if state.in_flight:
                        return _Wait(state.changed)
                    return self._start_refresh(scope, state, now)
                states.append(state)
            sequence = next(self._events)
            entry = _Entry(sequence=sequence, results=adding, size=size)
            for state in states:
                state.in_flight[sequence] = entry
            scopes = tuple(scope for _, scope in levels)
            self._add_pending(quota, scopes, adding, size)
            return Reservation(self, scopes, entry)

    def _state(self, scope: ScopeKey) -> _ScopeState:
        state = self._states.get(scope)
        if state is None:
            self._forget_idle()
            state = _ScopeState()
            self._seed_from_tenant(scope, state)
            self._states[scope] = state
        else:
            self._states.move_to_end(scope)
        return state

    def _seed_from_tenant(self, scope: ScopeKey, state: _ScopeState) -> None:
        # A new session of a tenant listed recently starts from that listing: no LIST of its own.
        if len(scope) != 2:
            return
        tenant_state = self._states.get(scope[:1])
        sessions = self._tenant_sessions.get(scope[0])
        if tenant_state is None or sessions is None or not tenant_state.listed or tenant_state.stale:
            return
        state.baseline_results, state.baseline_bytes = sessions.get(scope[1], (0, 0))
        state.listed, state.listed_at, state.arrived_at = True, tenant_state.listed_at, tenant_state.arrived_at
        state.listed_event = tenant_state.listed_event

    def _forget_idle(self) -> None:
        while len(self._states) >= self._max_scopes:
            for key, state in self._states.items():
                if state.idle():
                    del self._states[key]
                    # Its writes since the tenant listing are forgotten with it: that listing may not seed it again.
                    self._tenant_sessions.pop(key[0], None)
                    if len(key) == 2:
                        # Sessions come and go: what this worker had yet to mark of one goes with it (drift of at
                        # most an allowance, as a worker that dies leaves, until the session's next reconcile).
                        for kept in (self._pending, self._admitted, self._marks):
                            kept.pop(key, None)
                    break
            else:
                return

    def _start_refresh(self, scope: ScopeKey, state: _ScopeState, now: float, *, reconcile: bool = False) -> _Refresh:
        state.refreshing = Future()
        return _Refresh(scope=scope, event=next(self._events), started=now, done=state.refreshing, reconcile=reconcile)

    # Listings and settlements

    def _refreshed(self, step: _Refresh, usage: Usage) -> None:
        with self._lock:
            state = self._states.get(step.scope)
            if state is None:  # forgotten meanwhile (it was idle); nothing to update
                _resolve(step.done)
                return
            if isinstance(usage, TenantTotal) and len(step.scope) == 2:
                results, size = usage.results, usage.size  # a session's marks
            elif isinstance(usage, TenantTotal):
                results, size = usage.results, usage.size
                if usage.sessions is not None:
                    self._tenant_sessions[step.scope[0]] = dict(usage.sessions)
                    self._update_sessions(step, usage.sessions)
                else:
                    # Sessions seeded from an older listing would pass for as fresh as this mark: they list instead.
                    self._tenant_sessions.pop(step.scope[0], None)
            elif len(step.scope) == 1:
                results = sum(count for count, _ in usage.values())
                size = sum(total for _, total in usage.values())
                self._tenant_sessions[step.scope[0]] = dict(usage)
                self._update_sessions(step, usage)
            else:
                results, size = usage.get(step.scope[1], (0, 0))
            _apply_listing(state, step, results, size)
            state.marked = isinstance(usage, TenantTotal) and usage.sessions is None
            state.refreshing = None
            _resolve(step.done)
            state.notify()

    def _update_sessions(self, step: _Refresh, usage: SessionUsage) -> None:
        # The tenant listing is newer than any session listing begun before it: bring those sessions up to date.
        for key, state in self._states.items():
            if len(key) == 2 and key[0] == step.scope[0] and state.refreshing is None:
                if state.listed and state.listed_event > step.event:
                    continue
                results, size = usage.get(key[1], (0, 0))
                _apply_listing(state, step, results, size)

    def _refresh_failed(self, step: _Refresh) -> None:
        with self._lock:
            state = self._states.get(step.scope)
            if state is not None:
                state.refreshing = None
                state.notify()
            _resolve(step.done)

    def _settle(self, scopes: tuple[ScopeKey, ...], entry: _Entry) -> None:
        with self._lock:
            entry.settled_event = next(self._events)
            for scope in scopes:
                state = self._states.get(scope)
                if state is None or state.in_flight.pop(entry.sequence, None) is None:
                    continue
                state.settled.append(entry)
                state.notify()


def _levels(quota: Quota, tenant: str, session: str) -> list[tuple[Literal["session", "tenant"], ScopeKey]]:
    levels: list[tuple[Literal["session", "tenant"], ScopeKey]] = []
    if any(limit is not None for limit in quota.limits("tenant")):
        levels.append(("tenant", (tenant,)))
    if any(limit is not None for limit in quota.limits("session")):
        levels.append(("session", (tenant, session)))
    return levels


def _resolve(future: Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _apply_listing(state: _ScopeState, step: _Refresh, results: int, size: int) -> None:
    """Replace a scope's baseline with a listing; writes admitted after the listing began still count on top."""
    state.baseline_results, state.baseline_bytes = results, size
    state.listed, state.stale = True, False
    state.listed_at, state.listed_event = step.started, step.event
    state.arrived_at = time.monotonic()
    # Writes settled before the listing began are in it; later ones may not be, so they keep counting (conservative).
    state.settled = [entry for entry in state.settled if entry.settled_event > step.event]


def _over(limit: int | None, used: int, adding: int, what: str) -> tuple[str, int, int] | None:
    if limit is not None and used + adding > limit:
        return what, limit, adding
    return None


def _refusal(admission: _Admission, level: str, over: tuple[str, int, int], used: int) -> QuotaExceededError:
    what, limit, adding = over
    needs = "one more result" if what == "results" else f"{adding} more bytes"
    written = "result" if admission.results else "document"
    return QuotaExceededError(
        f"Quota exceeded for tenant {admission.tenant!r}, session {admission.session!r}: the {level} may hold "
        f"{limit} {what} and holds {used}; this {written} needs {needs}. It was not stored.",
        tenant=admission.tenant,
        session=admission.session,
        scope=level,
        limit=what,
        allowed=limit,
    )


def usage_by_session(
    found: Mapping[str, int], scope: ScopeKey, scope_path: str, live: Callable[[str, str], bool]
) -> SessionUsage:
    """
    Sum a listing of a tenant's or a session's directory into results and bytes per session.

    Results count once each, with their bytes; session documents (``<session>/.<namespace>/<name>``) with their bytes.

    :param found: Paths and sizes from a listing of `scope_path`.
    :param scope: The listed scope: ``(tenant,)`` or ``(tenant, session)``.
    :param scope_path: The listed directory.
    :param live: Whether an object name counts, given the tenant: a result name, not past its retention.
    :returns: Results and bytes (of results and documents) per session.
    """
    usage: SessionUsage = {}
    for path, size in found.items():
        relative = below(path, scope_path)
        placed = place(relative, scope) if relative is not None else None
        if placed is None:
            continue
        if placed.namespace is None and live(placed.tenant, placed.name):
            counted = 1
        elif placed.namespace == SESSION_MARKS_NAMESPACE:
            continue  # the quota's own bookkeeping
        elif placed.namespace is not None and is_document("." + placed.namespace, placed.name):
            counted = 0
        else:
            continue
        results, total = usage.get(placed.session, (0, 0))
        usage[placed.session] = (results + counted, total + size)
    return usage


def is_document(directory: str, name: str) -> bool:
    """
    :param directory: The directory an object sits in, within a session's directory.
    :param name: The object's name.
    :returns: Whether it is a session document, as `SessionDocuments` lays them out (``.<namespace>/<name>``; a name
        that starts with a dot is a temporary file, not a document).
    """
    return directory.startswith(".") and len(directory) > 1 and not name.startswith(".")
