"""
Where approval records live: documents in the session's ``.approvals/`` namespace, read and written one request each.

::

    <root>/<tenant>/<session>/.approvals/
    ├── step.20261129T213400123456Z-5f3a9c1e7b2d.json          HeldStep: the message and its calls (put once)
    ├── decision.20261129T213400123456Z-5f3a9c1e7b2d-0.json    ApprovalDecision for request ...-0 (created once)
    ├── resume.20261129T213400123456Z-5f3a9c1e7b2d.json        StepClaim: the worker that resumed the step (once)
    ├── claim.20261129T213400123456Z-5f3a9c1e7b2d-0.json       ExecutionClaim: the worker that ran call 0 (once)
    └── memory.<sha256>.json                                   RememberedApproval (AskOncePerSession)

Step ids start with the creation time, so names sort by age and the newest step is the session's open one. Decisions
and claims use the store's conditional create (S3 ``If-None-Match: *``, a hard link on disk): two deciders or two
workers racing get one winner and one clear error, never two writes.
"""

import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from haystack_integrations.offload.approvals.errors import (
    ApprovalAlreadyDecidedError,
    ApprovalClaimedError,
    ApprovalNotFoundError,
    ApprovalRecordError,
)
from haystack_integrations.offload.approvals.records import (
    ApprovalDecision,
    ExecutionClaim,
    HeldStep,
    RememberedApproval,
    StepClaim,
)
from haystack_integrations.offload.errors import DocumentExistsError, ResultNotFoundError
from haystack_integrations.offload.stores.documents import SessionDocuments

NAMESPACE = "approvals"
_STEP_ID = r"\d{8}T\d{12}Z-[0-9a-f]{12}"
_REQUEST_ID = re.compile(rf"(?P<step>{_STEP_ID})-(?P<position>\d{{1,4}})")
_STEP_NAME = re.compile(rf"step\.(?P<step>{_STEP_ID})\.json")
_RESUME_NAME = re.compile(rf"resume\.(?P<step>{_STEP_ID})\.json")

_Model = TypeVar("_Model", bound=BaseModel)


class SessionStore(Protocol):
    """What the approval API needs from a store: a tenant and session scope and its documents."""

    @property
    def tenant(self) -> str | None: ...

    @property
    def session(self) -> str | None: ...

    def documents(self, namespace: str) -> SessionDocuments: ...


def session_scope(store: object) -> tuple[str, str]:
    """
    Return the store's ``(tenant, session)``.

    :param store: The run's store.
    :returns: Its tenant and session ids.
    :raises TypeError: If the store keeps no documents (it is not an `FsspecToolResultStore`).
    :raises ValueError: If it is not scoped to one session.
    """
    if not callable(getattr(store, "documents", None)):
        raise TypeError(
            f"Approvals are kept in the session's store: it needs a documents() API (FsspecToolResultStore), "
            f"got {type(store).__name__}."
        )
    tenant, session = getattr(store, "tenant", None), getattr(store, "session", None)
    if tenant is None or session is None:
        raise ValueError("Approvals belong to one session: use store.for_session(tenant, session).")
    return tenant, session


def now() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


def new_step_id(created: datetime) -> str:
    """A step id that sorts by creation time and never collides (48 random bits)."""
    return f"{created.strftime('%Y%m%dT%H%M%S%f')}Z-{secrets.token_hex(6)}"


def request_id(step_id: str, position: int) -> str:
    """The id of the request (and the claim key) for the call at `position` of a step."""
    return f"{step_id}-{position}"


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

    def step_ids(self) -> list[str]:
        """Every held step's id, oldest first."""
        return sorted(match["step"] for name in self.names if (match := _STEP_NAME.fullmatch(name)))

    def newest_step_id(self) -> str | None:
        """The session's newest held step: later steps supersede older ones."""
        steps = self.step_ids()
        return steps[-1] if steps else None

    def resumed(self, step_id: str) -> bool:
        """Whether the step has been claimed by a worker that resumed it."""
        return f"resume.{step_id}.json" in self.names

    def decisions_of(self, step_id: str) -> list[str]:
        """The ids of the step's requests that have a decision document."""
        prefix, suffix = f"decision.{step_id}-", ".json"
        return sorted(
            name[len("decision.") : -len(suffix)]
            for name in self.names
            if name.startswith(prefix) and name.endswith(suffix)
        )

    def decided(self, request: str) -> bool:
        """Whether the request has a decision document."""
        return f"decision.{request}.json" in self.names


def _parse(model: type[_Model], name: str, data: bytes) -> _Model:
    try:
        return model.model_validate_json(data)
    except ValidationError as error:
        raise ApprovalRecordError(f"The approval document {name!r} is not a valid {model.__name__}.") from error


def _dump(record: BaseModel) -> bytes:
    return record.model_dump_json().encode()


class ApprovalLedger:
    """
    The approval documents of one session, with a sync and an async twin for every operation.

    Cheap to create per call: it holds the store's documents handle and nothing else.
    """

    def __init__(self, store: object) -> None:
        """
        :param store: A session-scoped `FsspecToolResultStore`.
        :raises TypeError: If the store keeps no documents.
        :raises ValueError: If the store is not scoped to one session.
        """
        self.tenant, self.session = session_scope(store)
        self.store = store
        self.documents: SessionDocuments = store.documents(NAMESPACE)  # type: ignore[attr-defined]

    # Listing

    def listing(self) -> ApprovalListing:
        """List the session's approval documents (one LIST)."""
        return ApprovalListing(frozenset(self.documents.list()))

    async def listing_async(self) -> ApprovalListing:
        """Async `listing`."""
        return ApprovalListing(frozenset(await self.documents.list_async()))

    # Held steps

    def put_step(self, step: HeldStep) -> None:
        """Record a held step (created once: step ids are unique)."""
        self.documents.create(f"step.{step.step_id}.json", _dump(step))

    async def put_step_async(self, step: HeldStep) -> None:
        """Async `put_step`."""
        await self.documents.create_async(f"step.{step.step_id}.json", _dump(step))

    def step(self, step_id: str) -> HeldStep:
        """
        Read a held step.

        :raises ApprovalNotFoundError: If the session has no such step.
        """
        name = f"step.{step_id}.json"
        try:
            data = self.documents.get(name)
        except ResultNotFoundError as error:
            raise ApprovalNotFoundError(f"No held step {step_id!r} in this session.") from error
        return _parse(HeldStep, name, data)

    async def step_async(self, step_id: str) -> HeldStep:
        """Async `step`."""
        name = f"step.{step_id}.json"
        try:
            data = await self.documents.get_async(name)
        except ResultNotFoundError as error:
            raise ApprovalNotFoundError(f"No held step {step_id!r} in this session.") from error
        return _parse(HeldStep, name, data)

    # Decisions

    def decision(self, request: str) -> ApprovalDecision | None:
        """Read a request's decision, or None if it has none."""
        name = f"decision.{request}.json"
        try:
            return _parse(ApprovalDecision, name, self.documents.get(name))
        except ResultNotFoundError:
            return None

    async def decision_async(self, request: str) -> ApprovalDecision | None:
        """Async `decision`."""
        name = f"decision.{request}.json"
        try:
            return _parse(ApprovalDecision, name, await self.documents.get_async(name))
        except ResultNotFoundError:
            return None

    def create_decision(self, decision: ApprovalDecision) -> None:
        """
        Record a decision, once.

        :raises ApprovalAlreadyDecidedError: If the request already has one.
        """
        try:
            self.documents.create(f"decision.{decision.request_id}.json", _dump(decision))
        except DocumentExistsError as error:
            raise ApprovalAlreadyDecidedError(f"Request {decision.request_id!r} is already decided.") from error

    async def create_decision_async(self, decision: ApprovalDecision) -> None:
        """Async `create_decision`."""
        try:
            await self.documents.create_async(f"decision.{decision.request_id}.json", _dump(decision))
        except DocumentExistsError as error:
            raise ApprovalAlreadyDecidedError(f"Request {decision.request_id!r} is already decided.") from error

    # Claims: the conditional create is the whole mechanism; the loser learns who won from the document.

    def claim_step(self, claim: StepClaim) -> None:
        """
        Claim the resumption of a step for this worker.

        :raises ApprovalClaimedError: If another worker claimed it first.
        """
        try:
            self.documents.create(f"resume.{claim.step_id}.json", _dump(claim))
        except DocumentExistsError as error:
            raise ApprovalClaimedError(f"Held step {claim.step_id!r} was already resumed by another worker.") from error

    async def claim_step_async(self, claim: StepClaim) -> None:
        """Async `claim_step`."""
        try:
            await self.documents.create_async(f"resume.{claim.step_id}.json", _dump(claim))
        except DocumentExistsError as error:
            raise ApprovalClaimedError(f"Held step {claim.step_id!r} was already resumed by another worker.") from error

    def claim_call(self, claim: ExecutionClaim) -> None:
        """
        Claim the execution of one call for this worker.

        :raises ApprovalClaimedError: If the call was already claimed.
        """
        try:
            self.documents.create(f"claim.{claim.call_key}.json", _dump(claim))
        except DocumentExistsError as error:
            raise ApprovalClaimedError(f"Tool call {claim.call_key!r} was already run by another worker.") from error

    async def claim_call_async(self, claim: ExecutionClaim) -> None:
        """Async `claim_call`."""
        try:
            await self.documents.create_async(f"claim.{claim.call_key}.json", _dump(claim))
        except DocumentExistsError as error:
            raise ApprovalClaimedError(f"Tool call {claim.call_key!r} was already run by another worker.") from error

    # Remembered approvals (AskOncePerSession)

    def remembered(self, key: str) -> RememberedApproval | None:
        """Read a remembered approval, or None."""
        name = f"memory.{key}.json"
        try:
            return _parse(RememberedApproval, name, self.documents.get(name))
        except ResultNotFoundError:
            return None

    async def remembered_async(self, key: str) -> RememberedApproval | None:
        """Async `remembered`."""
        name = f"memory.{key}.json"
        try:
            return _parse(RememberedApproval, name, await self.documents.get_async(name))
        except ResultNotFoundError:
            return None

    def remember(self, key: str, record: RememberedApproval) -> None:
        """Remember an approval (a later approval replaces it, extending its expiry)."""
        self.documents.put(f"memory.{key}.json", _dump(record))

    async def remember_async(self, key: str, record: RememberedApproval) -> None:
        """Async `remember`."""
        await self.documents.put_async(f"memory.{key}.json", _dump(record))
