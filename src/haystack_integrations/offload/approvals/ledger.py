"""
Where approval records live: documents in the session's ``.approvals/`` namespace, read and written one request each.

Steps are numbered by sequence; steps, decisions and claims are claimed with the store's conditional create. Those
creates are where the approval metrics count requests and decisions, and where `KnownPending` learns what waits.

A round trip lists nothing: the newest step is found from a head document, checked by reading on until a step is
missing, and each step's state is read by name (`ApprovalSnapshot`; `docs/design.md` says why).
"""

import asyncio
import contextlib
import hashlib
import logging
import re
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from haystack.dataclasses import ChatMessage
from pydantic import BaseModel, ValidationError

from haystack_integrations.offload.approvals.approval_records import (
    ApprovalDecision,
    ApprovalHead,
    ApprovalRequest,
    CallRecord,
    ExecutionClaim,
    HeldCall,
    HeldStep,
    RememberedApproval,
    StepClaim,
    StepDone,
    UnrunClaim,
    verdict_for,
)
from haystack_integrations.offload.approvals.errors import (
    ApprovalAlreadyDecidedError,
    ApprovalClaimedError,
    ApprovalNotFoundError,
    ApprovalRecordError,
)
from haystack_integrations.offload.errors import DocumentExistsError, OffloadError, ResultNotFoundError
from haystack_integrations.offload.metrics import PendingApprovals, approval, pending_approvals
from haystack_integrations.offload.sync_calls import sync_twin
from haystack_integrations.offload.types import Documents, SessionDocumentSource

NAMESPACE = "approvals"
_STEP_ID = r"\d{8}-[0-9a-f]{12}"
_REQUEST_ID = re.compile(rf"(?P<step>{_STEP_ID})-(?P<position>\d{{1,4}})")
_STEP_NAME = re.compile(r"step\.(?P<sequence>\d{8})\.json")
_RESUME_NAME = re.compile(r"resume\.(?P<sequence>\d{8})\.(?P<attempt>\d{3})\.json")
_CLAIM_NAME = re.compile(r"claim\.(?P<call>\d{8}-[0-9a-f]{16})\.(?P<attempt>\d{2})\.json")
_UNRUN_NAME = "unrun.{call}.{attempt:02d}.json"
_HEAD_NAME = "head.json"
# How many finished-looking steps back `newest_done` reads by name before it lists instead (a session whose steps were
# held one after another without being resumed; never on a server's path, where only the newest step can be open).
_DONE_LOOKBACK = 8
# A race for a step number moves on to the next; this many lost races in a row means something else is wrong.
_SEQUENCE_RACES = 16

_Model = TypeVar("_Model", bound=BaseModel)
logger = logging.getLogger(__name__)

# Makes a held step's calls (one `HeldCall` per tool call of its message, in order) for the id it is held under.
HeldCalls = Callable[[str], list[HeldCall]]


def session_scope(store: object) -> tuple[str, str]:
    """
    Return the store's ``(tenant, session)``, checking that it can keep a session's approvals.

    :param store: The run's store (whatever the run brought: this is where it is checked).
    :returns: Its tenant and session ids.
    :raises TypeError: If the store keeps no session documents (it is not a `SessionDocumentSource`, such as a plain
        Haystack store).
    :raises ValueError: If it is not scoped to one session.
    """
    if not isinstance(store, SessionDocumentSource):
        raise TypeError(
            f"Approvals are kept in the session's store: it needs a documents() API with its tenant and session "
            f"(a SessionDocumentSource, such as FsspecToolResultStore.for_session), got {type(store).__name__}."
        )
    tenant, session = store.tenant, store.session
    if tenant is None or session is None:
        raise ValueError("Approvals belong to one session: use store.for_session(tenant, session).")
    return tenant, session


def now() -> datetime:
    """The current time, timezone-aware UTC (for expiry and leases; never for order)."""
    return datetime.now(UTC)


def step_id_for(sequence: int) -> str:
    """A step id: its sequence number and 48 random bits (so a purged session's ids are never reused)."""
    return f"{sequence:08d}-{secrets.token_hex(6)}"


def sequence_of(step_id: str) -> int:
    """The sequence number a step id starts with."""
    return int(step_id[:8])


def request_id(step_id: str, position: int) -> str:
    """The id of the request for the call at `position` of a step."""
    return f"{step_id}-{position}"


def call_key(first_step_id: str, tool_call_id: str | None, position: int) -> str:
    """
    The name a call's claims and outcome go under, the same in every step that holds its message again.

    :param first_step_id: The step that first held the call's message.
    :param tool_call_id: The model's id for the call (stable through rewrites); None for calls without one.
    :param position: The call's position, used only when it has no id.
    :returns: ``<sequence>-<16 hex digits>``.
    """
    identity = tool_call_id if tool_call_id is not None else f"\x00position:{position}"
    digest = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{first_step_id[:8]}-{digest}"


def idempotency_key(tenant: str, session: str, key: str) -> str:
    """The idempotency key a call's tool receives: stable across tries, unique across sessions."""
    digest = hashlib.sha256(f"{tenant}\x00{session}\x00{key}".encode()).hexdigest()[:32]
    return f"offload-{digest}"


def parse_request_id(value: object) -> tuple[str, int]:
    """
    Split a request id into its step id and position.

    :param value: The id, as a client sent it.
    :returns: ``(step_id, position)``.
    :raises ApprovalNotFoundError: If it is not a request id (it then names no request in any session).
    """
    match = _REQUEST_ID.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ApprovalNotFoundError(f"No approval request {str(value)[:120]!r} in this session.")
    return match["step"], int(match["position"])


@dataclass(frozen=True)
class ApprovalListing:
    """One LIST of a session's approval documents."""

    names: frozenset[str]

    def sequences(self) -> list[int]:
        """Every held step's number, oldest first."""
        return sorted(int(match["sequence"]) for name in self.names if (match := _STEP_NAME.fullmatch(name)))

    def newest(self) -> int | None:
        """The session's newest held step: later steps supersede older ones."""
        sequences = self.sequences()
        return sequences[-1] if sequences else None

    def claims_of(self, sequence: int) -> list[int]:
        """The attempts claimed at resuming a step, in order."""
        return sorted(
            int(match["attempt"])
            for name in self.names
            if (match := _RESUME_NAME.fullmatch(name)) and int(match["sequence"]) == sequence
        )

    def done(self, sequence: int) -> bool:
        """Whether resuming the step finished (its messages are recorded)."""
        return f"done.{sequence:08d}.json" in self.names

    def decided(self, request: str) -> bool:
        """Whether the request has a decision document."""
        return f"decision.{request}.json" in self.names

    def call_tries(self, key: str) -> list[int]:
        """The tries claimed of one call, in order."""
        return sorted(
            int(match["attempt"])
            for name in self.names
            if (match := _CLAIM_NAME.fullmatch(name)) and match["call"] == key
        )

    def unrun(self, key: str, attempt: int) -> bool:
        """Whether a try of a call is noted as not run (its claim's create failed)."""
        return _UNRUN_NAME.format(call=key, attempt=attempt) in self.names

    def has_outcome(self, key: str) -> bool:
        """Whether a call's result is recorded."""
        return f"outcome.{key}.json" in self.names

    def merged(self, names: "set[str] | frozenset[str]") -> "ApprovalListing":
        """This listing with more names known to exist."""
        return ApprovalListing(self.names | names)


@dataclass(frozen=True)
class ApprovalSnapshot:
    """
    What a request needs to know of the session's newest held step, read by name: the step, its done record, and an
    `ApprovalListing` of the documents found about it (the step, its done record, its resume claims, its decisions).

    Its cost depends on the step alone, never on how many steps the session held before it. One request reads it once
    and passes it on (decide, the pending check and the resume it runs): every write it leads to is conditional, or
    made under a claim that is, so a snapshot gone stale meanwhile is refused by that write, never acted on blindly.
    """

    step: HeldStep | None
    done: StepDone | None
    listing: ApprovalListing
    read_at: datetime
    """When the read began: a resume claim's lease is judged at this time, the time its document was read after."""
    claim: StepClaim | None = None
    """The newest resume claim on the step, as its document was read (None when nobody claimed it)."""


def _step_name(sequence: int) -> str:
    return f"step.{sequence:08d}.json"


def _no_step(sequence: int) -> str:
    return f"No held step {sequence} ({_step_name(sequence)!r}) in this session."


def _resume_name(sequence: int, attempt: int) -> str:
    return f"resume.{sequence:08d}.{attempt:03d}.json"


def _snapshot(
    step: HeldStep,
    done: StepDone | None,
    attempts: list[int],
    decisions: dict[str, ApprovalDecision | None],
    *,
    read_at: datetime,
    claim: StepClaim | None = None,
) -> ApprovalSnapshot:
    names = {_step_name(step.sequence)}
    names.update(_resume_name(step.sequence, attempt) for attempt in attempts)
    names.update(f"decision.{request}.json" for request, decision in decisions.items() if decision is not None)
    if done is not None:
        names.add(f"done.{step.sequence:08d}.json")
    return ApprovalSnapshot(step, done, ApprovalListing(frozenset(names)), read_at=read_at, claim=claim)


def _parse(model: type[_Model], name: str, data: bytes) -> _Model:
    try:
        return model.model_validate_json(data)
    except ValidationError as error:
        raise ApprovalRecordError(f"The approval document {name!r} is not a valid {model.__name__}.") from error


def _dump(record: BaseModel) -> bytes:
    return record.model_dump_json().encode()


def _numbered(first: int, message: ChatMessage, calls: HeldCalls, fields: dict[str, Any]) -> Iterator[HeldStep]:
    """The step to record under each number tried in turn, from `first`: a lost race moves on to the next number."""
    for sequence in range(first, first + _SEQUENCE_RACES):
        step_id = step_id_for(sequence)
        yield HeldStep(step_id=step_id, sequence=sequence, message=message.to_dict(), calls=calls(step_id), **fields)


class KnownPending:
    """
    The requests this worker knows wait for a decision, by session: what feeds its figure of the oldest pending one.

    Fed where this worker sees all that waits in a session: when it holds a step, lists the pending requests, or
    claims a step to resume (nothing waits then). Each sighting replaces what it knew of the session, so a request
    decided or resumed by another worker leaves this worker's figure when it next sees the session; a request decided
    or refused here leaves at once, and an expired one at this worker's next sighting of any session. Sessions are
    told apart by their tenant and session ids.
    """

    def __init__(self, figure: PendingApprovals) -> None:
        """
        :param figure: The figure to feed (the process's is `metrics.pending_approvals`).
        """
        self.figure = figure
        self._lock = threading.Lock()
        # (tenant, session) -> {request id: when it expires}
        self._sessions: dict[tuple[str, str], dict[str, datetime]] = {}

    def seen(self, tenant: str, session: str, waiting: list[ApprovalRequest]) -> None:
        """Note that these requests, and no others, wait in the session now."""
        known = {request.request_id: request.expires for request in waiting}
        # Under one lock, so that the figure is the one the latest sighting left, whatever the threads' order.
        with self._lock:
            for request_id in self._sessions.pop((tenant, session), {}).keys() - known.keys():
                self.figure.settled(request_id)
            for request in waiting:
                self.figure.pending(request.request_id, request.created.timestamp())
            if known:
                self._sessions[(tenant, session)] = known
            self._forget_expired(now())

    def settle(self, tenant: str, session: str, request_id: str) -> None:
        """Forget a request this worker saw decided or expired."""
        with self._lock:
            known = self._sessions.get((tenant, session), {})
            known.pop(request_id, None)
            if not known:
                self._sessions.pop((tenant, session), None)
            self.figure.settled(request_id)

    def _forget_expired(self, at: datetime) -> None:
        # A request can wait no longer than its expiry: this bounds what a session this worker never sees again leaves.
        for key, known in list(self._sessions.items()):
            for request_id in [request_id for request_id, expires in known.items() if at >= expires]:
                del known[request_id]
                self.figure.settled(request_id)
            if not known:
                del self._sessions[key]


known_pending = KnownPending(pending_approvals)
"""This worker's `KnownPending`: it feeds the gauge the metrics export."""


class ReleasedClaims:
    """
    The step claims this worker released, by token, until their leases would have lapsed anyway.

    A release is a write and can fail like any other; remembered here first, it holds for this worker's own retry
    whatever the store kept (a session's requests usually reach the worker that served it).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # claim token -> the lease it had when released
        self._until: dict[str, datetime] = {}

    def add(self, claim: StepClaim) -> None:
        """Note that this worker released `claim`."""
        with self._lock:
            self._until[claim.token] = claim.lease_until
            self._forget_lapsed(now())

    def released(self, claim: StepClaim) -> bool:
        """Whether this worker released `claim` (and its lease would not have lapsed yet)."""
        with self._lock:
            self._forget_lapsed(now())
            return claim.token in self._until

    def _forget_lapsed(self, at: datetime) -> None:
        for token in [token for token, until in self._until.items() if at >= until]:
            del self._until[token]


released_claims = ReleasedClaims()
"""This worker's `ReleasedClaims`."""


class ApprovalLedger:
    """
    The approval documents of one session.

    Cheap to create per call: it holds the store's documents handle, and the steps and decisions it has read (they are
    created once and never rewritten, so one operation reads each once). Each operation is written once, async; its
    sync twin waits for it (`sync_calls.sync_twin`).
    """

    def __init__(self, store: SessionDocumentSource) -> None:
        """
        :param store: The session's `SessionDocumentSource` (`FsspecToolResultStore.for_session`, or a third-party
            one).
        :raises TypeError: If the store keeps no documents.
        :raises ValueError: If the store is not scoped to one session.
        """
        self.tenant, self.session = session_scope(store)
        self.store: SessionDocumentSource = store
        self.documents: Documents = store.documents(NAMESPACE)
        # Documents created once and never rewritten, as this ledger read them (it lives for one operation).
        self._steps: dict[int, HeldStep] = {}
        self._decisions: dict[str, ApprovalDecision] = {}
        # The releases of claims this ledger wrote again (`_as_released_async`), by claim token.
        self._released: dict[str, StepClaim] = {}

    # Listing

    async def listing_async(self) -> ApprovalListing:
        """List the session's approval documents (one LIST)."""
        return ApprovalListing(frozenset(await self.documents.list_async()))

    listing = sync_twin(listing_async)

    # The newest held step, without a listing: the head's hint, then the next numbers until one is missing.

    async def newest_async(self) -> int | None:
        """
        The number of the session's newest held step, or None when it held none.

        Two GETs on a session with a current head; a session without one (written before heads existed, or whose head
        write failed) is listed once, and its head written.
        """
        return (await self._newest_async(done=False))[0]

    newest = sync_twin(newest_async)

    async def _newest_async(self, *, done: bool) -> tuple[int | None, StepDone | None]:
        """
        The newest step's number and, when `done` is asked for, its done record: read with the step and the next
        number's, at once (one round trip after the head's, when the head is current).
        """
        head = await self._head_async()
        newest = head if head is not None else (await self.listing_async()).newest()
        if newest is None:
            return None, None
        # A snapshot reads the step and its done record anyway: with the next number's, in one round trip.
        following: HeldStep | None
        record: StepDone | None = None
        if done:
            following, _, record = await asyncio.gather(
                self._step_or_none_async(newest + 1), self._step_or_none_async(newest), self.done_async(newest)
            )
        else:
            following = await self._step_or_none_async(newest + 1)
        moved = following is not None
        while following is not None:
            newest += 1
            following = await self._step_or_none_async(newest + 1)
        if newest != head:
            await self._write_head_async(newest)
        if moved:  # the done record read was an older step's
            record = await self.done_async(newest) if done else None
        return newest, record

    async def snapshot_async(self) -> ApprovalSnapshot:
        """
        The session's newest held step and what is recorded about it (a few GETs, at any length of history); what can
        be read at once is (three round trips when the head is current).
        """
        read_at = now()
        sequence, done = await self._newest_async(done=True)
        step = await self._step_or_none_async(sequence) if sequence is not None else None
        if step is None:  # none held, or purged from under its head
            return ApprovalSnapshot(None, None, ApprovalListing(frozenset()), read_at=read_at)
        if done is not None:
            return _snapshot(step, done, [], {}, read_at=read_at)
        requests = step.requests()
        (attempts, claim), found = await asyncio.gather(
            self._attempts_async(step.sequence),
            asyncio.gather(*(self.decision_async(request.request_id) for request in requests)),
        )
        decisions = {request.request_id: decision for request, decision in zip(requests, found, strict=True)}
        return _snapshot(step, None, attempts, decisions, read_at=read_at, claim=claim)

    snapshot = sync_twin(snapshot_async)

    async def call_names_async(self, keys: list[str]) -> set[str]:
        """
        The documents recorded about these calls (their tries' claims, the last try's not-run note, their outcome),
        as an `ApprovalListing` would name them: a few GETs per call, whatever else the session holds.
        """
        found = await asyncio.gather(*(self._call_names_async(key) for key in keys))
        return set().union(*found)

    async def _call_names_async(self, key: str) -> set[str]:
        outcome, names = await asyncio.gather(self.read_async(f"outcome.{key}.json"), self._tries_async(key))
        if outcome is not None:
            names.add(f"outcome.{key}.json")
        return names

    async def _tries_async(self, key: str) -> set[str]:
        names: set[str] = set()
        attempt = 0
        while await self.read_async(f"claim.{key}.{attempt + 1:02d}.json") is not None:
            attempt += 1
            names.add(f"claim.{key}.{attempt:02d}.json")
        if attempt and await self.read_async(_UNRUN_NAME.format(call=key, attempt=attempt)) is not None:
            names.add(_UNRUN_NAME.format(call=key, attempt=attempt))
        return names

    async def newest_done_async(self, snapshot: ApprovalSnapshot | None = None) -> StepDone | None:
        """
        The done record of the session's newest step that has one, or None (read from the newest step back).

        :param snapshot: What this request already read of the newest step: it is not read again.
        :returns: The done record, or None.
        """
        if snapshot is not None and snapshot.step is not None:
            if snapshot.done is not None:
                return snapshot.done
            newest, start = snapshot.step.sequence, snapshot.step.sequence - 1  # the newest has none: read on from it
        else:
            found = await self.newest_async()
            if found is None:
                return None
            newest, start = found, found
        for sequence in range(start, max(0, newest - _DONE_LOOKBACK), -1):
            done = await self.done_async(sequence)
            if done is not None:
                return done
        if newest <= _DONE_LOOKBACK:
            return None
        listing = await self.listing_async()  # many steps held and never resumed: the listing says which finished
        finished = [sequence for sequence in listing.sequences() if listing.done(sequence)]
        return await self.done_async(finished[-1]) if finished else None

    async def _attempts_async(self, sequence: int) -> tuple[list[int], StepClaim | None]:
        """The attempts claimed at resuming a step, and the newest one's claim (read on the way, so kept)."""
        attempts: list[int] = []
        newest: bytes | None = None
        while (data := await self.read_async(_resume_name(sequence, len(attempts) + 1))) is not None:
            attempts.append(len(attempts) + 1)
            newest = data
        if newest is None:
            return attempts, None
        return attempts, _parse(StepClaim, _resume_name(sequence, attempts[-1]), newest)

    async def _head_async(self) -> int | None:
        head = await self._optional_async(_HEAD_NAME, ApprovalHead)
        return head.sequence if head is not None else None

    async def _write_head_async(self, sequence: int) -> None:
        # A hint: a failed write costs the next reader a few reads (or one listing), never a wrong answer.
        try:
            await self.documents.put_async(_HEAD_NAME, _dump(ApprovalHead(sequence=sequence)))
        except OffloadError as error:
            logger.warning("Could not write the approvals head of session %s: %s", self.session, error)

    async def _step_or_none_async(self, sequence: int) -> HeldStep | None:
        known = self._steps.get(sequence)
        if known is not None:
            return known
        step = await self._optional_async(_step_name(sequence), HeldStep)
        if step is not None:
            self._steps[sequence] = step
        return step

    # Held steps: the step document's conditional create is the claim on its number.

    async def hold_async(
        self, message: ChatMessage, calls: HeldCalls, *, after: int | None = None, **fields: Any
    ) -> HeldStep:
        """
        Record `message` as a held step under the next free number: the one place a `HeldStep` is built.

        `ApprovalHook` holds a step for its guard's requests; `resume` holds one again for calls that may have run.

        :param message: The assistant message whose calls wait.
        :param calls: Makes the step's held calls for the step id they are held under (their requests carry it).
        :param after: The newest number known to be taken; listed when not given.
        :param fields: The step's other fields, as `HeldStep` takes them (it refuses unknown ones).
        :returns: The recorded step.
        :raises ApprovalClaimedError: If every step number tried was taken meanwhile.
        """
        first = (after if after is not None else (await self.newest_async() or 0)) + 1
        for step in _numbered(first, message, calls, fields):
            with contextlib.suppress(DocumentExistsError):
                await self.documents.create_async(_step_name(step.sequence), _dump(step))
                await self._write_head_async(step.sequence)
                return self._held(step)
        raise ApprovalClaimedError("Could not number a held step: every step number tried was taken meanwhile.")

    hold = sync_twin(hold_async)

    def _held(self, step: HeldStep) -> HeldStep:
        """Count the requests of a step just recorded: the session's newest, so they are all that waits in it."""
        requests = step.requests()
        if requests:
            approval("requested", len(requests), tenant=self.tenant)
        self.saw_waiting(requests)
        return step

    def saw_waiting(self, requests: list[ApprovalRequest]) -> list[ApprovalRequest]:
        """Note these as all that waits in this session now (`KnownPending`), and return them."""
        known_pending.seen(self.tenant, self.session, requests)
        return requests

    async def step_async(self, sequence: int) -> HeldStep:
        """
        Read a held step.

        :raises ApprovalNotFoundError: If the session has no such step.
        """
        found = await self._step_or_none_async(sequence)
        if found is None:
            raise ApprovalNotFoundError(_no_step(sequence))
        return found

    step = sync_twin(step_async)

    # Decisions

    async def decision_async(self, request: str) -> ApprovalDecision | None:
        """Read a request's decision, or None if it has none."""
        found = self._decisions.get(request) or await self._optional_async(f"decision.{request}.json", ApprovalDecision)
        if found is not None:  # created once, never rewritten: this ledger need not read it again
            self._decisions[request] = found
        return found

    decision = sync_twin(decision_async)

    async def create_decision_async(self, decision: ApprovalDecision) -> None:
        """
        Record a decision, once.

        :raises ApprovalAlreadyDecidedError: If the request already has one.
        """
        with self._deciding(decision):
            await self.documents.create_async(f"decision.{decision.request_id}.json", _dump(decision))
        # Created by this write, with this content, and never rewritten: the rest of the operation need not read it.
        self._decisions[decision.request_id] = decision

    create_decision = sync_twin(create_decision_async)

    @contextlib.contextmanager
    def _deciding(self, decision: ApprovalDecision) -> Iterator[None]:
        """Count a decision once its create succeeded; decided now or before, its request waits no more."""
        try:
            yield
        except DocumentExistsError as error:
            known_pending.settle(self.tenant, self.session, decision.request_id)
            raise ApprovalAlreadyDecidedError(f"Request {decision.request_id!r} is already decided.") from error
        approval("decided", verdict=verdict_for(decision.approved, decision.edited), tenant=self.tenant)
        known_pending.settle(self.tenant, self.session, decision.request_id)

    # Resuming a step: claimed per attempt, renewed while the worker works, ended by its done record.

    async def claim_step_async(self, claim: StepClaim) -> None:
        """
        Claim the resumption of a step (attempt ``claim.attempt``) for this worker.

        :raises ApprovalClaimedError: If another worker's claim of that attempt exists.
        """
        name = f"resume.{sequence_of(claim.step_id):08d}.{claim.attempt:03d}.json"
        try:
            await self.documents.create_async(name, _dump(claim))
        except DocumentExistsError as error:
            raise ApprovalClaimedError(f"Held step {claim.step_id!r} is being resumed by another worker.") from error
        # Resume claims a step only once each of its requests is decided or expired: nothing waits in the session now.
        self.saw_waiting([])

    async def renew_step_async(self, claim: StepClaim) -> None:
        """Extend this worker's own claim (a plain write: nobody else writes this attempt's document)."""
        name = f"resume.{sequence_of(claim.step_id):08d}.{claim.attempt:03d}.json"
        await self.documents.put_async(name, _dump(claim))

    async def release_step_async(self, claim: StepClaim) -> None:
        """
        End this worker's own claim now, so that a retry need not wait for its lease to lapse.

        The lease ends when it began: lapsed for every worker whose clock is not behind this one's. This worker knows
        it released the claim even if the write fails; a later read of the claim here writes the release again.
        """
        released_claims.add(claim)
        await self.renew_step_async(claim.model_copy(update={"lease_until": claim.claimed_at}))

    async def step_claim_async(self, sequence: int, attempt: int) -> StepClaim:
        """Read one attempt's claim (as released, if this worker released it though the store kept its lease)."""
        return await self._as_released_async(
            await self._required_async(f"resume.{sequence:08d}.{attempt:03d}.json", StepClaim)
        )

    async def newest_claim_async(self, snapshot: ApprovalSnapshot) -> StepClaim | None:
        """
        The newest resume claim on the snapshot's step, as the snapshot read it (not read again), and as released if
        this worker released it though the store kept its lease. Judge its lease at ``snapshot.read_at``: the claim
        was read after that, so a lease live then was live when read, and one lapsed then had lapsed unrenewed.

        :param snapshot: What this request read of the newest step.
        :returns: The claim, or None when nobody claimed the step.
        """
        return await self._as_released_async(snapshot.claim) if snapshot.claim is not None else None

    async def _as_released_async(self, claim: StepClaim) -> StepClaim:
        if claim.lease_until <= claim.claimed_at or not released_claims.released(claim):
            return claim
        released = claim.model_copy(update={"lease_until": claim.claimed_at})
        if self._released.get(claim.token) == released:  # written once per operation, however often it is asked
            return released
        try:
            # So that other workers see it released too, now that the store may answer again.
            await self.renew_step_async(released)
            self._released[claim.token] = released
        except OffloadError as error:
            logger.warning("Could not write the release of the claim on held step %s: %s", claim.step_id, error)
        return released

    async def finish_step_async(self, sequence: int, done: StepDone) -> None:
        """Record what resuming a step added to the conversation (the step is closed from then on)."""
        await self.documents.put_async(f"done.{sequence:08d}.json", _dump(done))

    async def done_async(self, sequence: int) -> StepDone | None:
        """Read a step's done record, or None."""
        return await self._optional_async(f"done.{sequence:08d}.json", StepDone)

    # Calls: one claim per try, one recorded outcome.

    async def claim_call_async(self, claim: ExecutionClaim) -> None:
        """
        Claim one try of one call for this worker.

        :raises ApprovalClaimedError: If that try was already claimed.
        """
        try:
            await self.documents.create_async(f"claim.{claim.call_key}.{claim.attempt:02d}.json", _dump(claim))
        except DocumentExistsError as error:
            raise ApprovalClaimedError(f"Tool call {claim.call_key!r} is being run by another worker.") from error

    async def call_claim_async(self, key: str, attempt: int) -> ExecutionClaim:
        """Read one try's claim."""
        return await self._required_async(f"claim.{key}.{attempt:02d}.json", ExecutionClaim)

    async def note_unrun_async(self, claim: ExecutionClaim) -> None:
        """Note that the call did not run under `claim`, whose create failed (it may have landed)."""
        note = UnrunClaim(
            call_key=claim.call_key, attempt=claim.attempt, token=claim.token, noted_by=claim.claimed_by, noted_at=now()
        )
        await self.documents.put_async(_UNRUN_NAME.format(call=claim.call_key, attempt=claim.attempt), _dump(note))

    async def unrun_async(self, key: str, attempt: int) -> UnrunClaim | None:
        """Read a try's not-run note, or None."""
        return await self._optional_async(_UNRUN_NAME.format(call=key, attempt=attempt), UnrunClaim)

    async def record_call_async(self, record: CallRecord) -> None:
        """Record what a call returned (a plain write: only the claim's holder writes it)."""
        await self.documents.put_async(f"outcome.{record.call_key}.json", _dump(record))

    async def call_record_async(self, key: str) -> CallRecord | None:
        """Read a call's recorded outcome, or None."""
        return await self._optional_async(f"outcome.{key}.json", CallRecord)

    # Remembered approvals (AskOncePerSession)

    async def remembered_async(self, key: str) -> RememberedApproval | None:
        """Read a remembered approval, or None."""
        return await self._optional_async(f"memory.{key}.json", RememberedApproval)

    remembered = sync_twin(remembered_async)

    async def remember_async(self, key: str, record: RememberedApproval) -> None:
        """Remember an approval (a later approval replaces it, extending its expiry)."""
        await self.documents.put_async(f"memory.{key}.json", _dump(record))

    remember = sync_twin(remember_async)

    # Reading one document

    async def read_async(self, name: str) -> bytes | None:
        """Read one of the session's approval documents, or None if it has none of that name."""
        try:
            return await self.documents.get_async(name)
        except ResultNotFoundError:
            return None

    read = sync_twin(read_async)

    async def _optional_async(self, name: str, model: type[_Model]) -> _Model | None:
        data = await self.read_async(name)
        return _parse(model, name, data) if data is not None else None

    async def _required_async(self, name: str, model: type[_Model]) -> _Model:
        found = await self._optional_async(name, model)
        if found is None:
            raise ApprovalNotFoundError(f"No {name.split('.')[0]} record {name!r} in this session.")
        return found
