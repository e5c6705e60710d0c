"""
A session's conversation, kept in the store as numbered turns, each claimed with a conditional create.

No worker keeps a conversation in memory: every request reads it from the session's scope and writes its turn back,
so any worker (or replica) can serve any request of any session::

    <root>/<tenant>/<session>/.history/
    ├── turn.00000001.start.json     TurnStart: who claimed turn 1, for what (the user's text), until when
    ├── turn.00000001.end.json       TurnEnd: the conversation after turn 1, the reply, the status
    ├── turn.00000002.start.json
    └── turn.00000002.end.json

Both documents of a turn are created with the store's conditional create (S3 ``If-None-Match: *``, a hard link on
local disk), which is the whole concurrency story:

- two requests racing for the next turn both try to create ``turn.<n>.start.json``: one wins, the other gets
  `SessionBusyError` (the server's 409) before it has run anything, so nothing is lost or interleaved;
- a request that finds the newest turn started but not ended gets `SessionBusyError` too, while the turn's lease lasts;
- a worker that died mid-turn leaves a start without an end: once its lease has passed, the next request ends that
  turn as ``abandoned`` (again a conditional create) and goes on. Should the dead worker come back, its own end loses
  the create and its late result is dropped (`TurnAbandonedError`), never merged into a conversation that moved on.

The conversation the model sees next is the ``messages`` of the newest end that has them (a failed turn records the
user's text in its start and leaves the conversation as it was).
"""

import asyncio
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

from haystack.dataclasses import ChatMessage
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from haystack_integrations.offload.errors import DocumentExistsError, ResultNotFoundError
from haystack_integrations.offload.stores import FsspecToolResultStore
from haystack_integrations.offload.stores.documents import SessionDocuments

NAMESPACE = "history"
DEFAULT_TURN_LEASE = 300.0
"""Seconds a started turn blocks its session before another request may declare it abandoned."""

TurnKind = Literal["message", "resume"]
TurnStatus = Literal["completed", "approval_required", "failed", "abandoned"]

_Record_T = TypeVar("_Record_T", bound=BaseModel)
_START = re.compile(r"turn\.(?P<turn>\d{8})\.start\.json")
_END = re.compile(r"turn\.(?P<turn>\d{8})\.end\.json")


class SessionBusyError(RuntimeError):
    """Another request holds (or just claimed) the session's next turn; nothing was run. The server answers 409."""


class TurnAbandonedError(RuntimeError):
    """This turn's lease passed and another request ended it as abandoned; its result was not recorded."""


class HistoryRecordError(ValueError):
    """A history document in the store is not a valid record."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TurnStart(_Record):
    """The claim on one turn: created once, by the request that runs the turn."""

    turn: int = Field(ge=1)
    kind: TurnKind
    text: str | None = Field(default=None, description="The user's message, for message turns.")
    actor: str | None = None
    worker: str
    started_at: AwareDatetime
    lease_until: AwareDatetime


class TurnEnd(_Record):
    """How one turn ended: created once, by the request that ran it (or by a later one, as ``abandoned``)."""

    turn: int = Field(ge=1)
    status: TurnStatus
    messages: list[dict[str, Any]] | None = Field(
        default=None, description="The whole conversation after the turn (ChatMessage.to_dict); None: unchanged."
    )
    reply: str | None = None
    error: str | None = None
    worker: str
    ended_at: AwareDatetime


@dataclass(frozen=True)
class HistoryState:
    """What one read of the history found: the conversation so far and the state of the newest turn."""

    next_turn: int
    conversation: list[ChatMessage]
    last_end: TurnEnd | None
    open_start: TurnStart | None
    """The newest turn's start when that turn has no end yet (running, or abandoned once its lease passed)."""

    def busy(self, at: datetime) -> bool:
        """Whether a turn is running (started, not ended, lease not passed) at `at`."""
        return self.open_start is not None and at < self.open_start.lease_until

    @property
    def held_for_approval(self) -> bool:
        """Whether the newest turn stopped for approvals (and no later turn resumed it)."""
        return self.open_start is None and self.last_end is not None and self.last_end.status == "approval_required"


@dataclass(frozen=True)
class Turn:
    """A claimed turn: the caller runs it, then records its end with `SessionHistory.finish`."""

    start: TurnStart
    conversation: list[ChatMessage]


def _now() -> datetime:
    return datetime.now(UTC)


def _start_name(turn: int) -> str:
    return f"turn.{turn:08d}.start.json"


def _end_name(turn: int) -> str:
    return f"turn.{turn:08d}.end.json"


class SessionHistory:
    """
    The turns of one session's conversation, read and written through the session's store.

    ```python
    history = SessionHistory(results.for_session("acme", "chat-42"), worker="web-1")
    turn = await history.begin(kind="message", text="Hello")        # SessionBusyError -> answer 409
    reply = await agent.run_async([*turn.conversation, ChatMessage.from_user("Hello")], ...)
    await history.finish(turn, status="completed", messages=reply["messages"], reply=reply["last_message"].text)
    ```

    Multi-user use: create one per request (it holds the session's store and nothing else); the store's scope is the
    only thing that ties it to a tenant and session.
    """

    def __init__(self, store: FsspecToolResultStore, *, worker: str, lease: float = DEFAULT_TURN_LEASE) -> None:
        """
        :param store: The session's store (`FsspecToolResultStore.for_session`).
        :param worker: This worker's name, recorded in the turns it claims.
        :param lease: Seconds a started turn may run before another request may end it as abandoned.
        :raises ValueError: If the store is not scoped to one session, or the lease is not positive.
        """
        if store.session is None:
            raise ValueError("A conversation belongs to one session: use store.for_session(tenant, session).")
        if not lease > 0:
            raise ValueError(f"The turn lease must be a positive number of seconds, got {lease}.")
        self.store = store
        self.worker = worker
        self.lease = float(lease)
        self.documents: SessionDocuments = store.documents(NAMESPACE)

    async def read(self) -> HistoryState:
        """
        Read the history: one LIST, then the newest end (and the newest start if that turn is still open).

        :returns: The conversation so far and the state of the newest turn.
        :raises HistoryRecordError: If a history document is not a valid record.
        :raises StorageError: If the backend fails.
        """
        names = await self.documents.list_async()
        starts = sorted(int(match["turn"]) for name in names if (match := _START.fullmatch(name)))
        ends = sorted(int(match["turn"]) for name in names if (match := _END.fullmatch(name)))
        newest = max([0, *starts, *ends])
        open_start = None
        if newest and newest not in ends:
            open_start = await self._read(_start_name(newest), TurnStart)
        last_end = None
        conversation: list[ChatMessage] = []
        for turn in reversed(ends):
            end = await self._read(_end_name(turn), TurnEnd)
            if last_end is None:
                last_end = end
            if end.messages is not None:
                conversation = [ChatMessage.from_dict(message) for message in end.messages]
                break
        return HistoryState(next_turn=newest + 1, conversation=conversation, last_end=last_end, open_start=open_start)

    async def begin(
        self, state: HistoryState, *, kind: TurnKind, text: str | None = None, actor: str | None = None
    ) -> Turn:
        """
        Claim the next turn after `state`; end the newest turn as abandoned first if its lease has passed.

        :param state: What `read` returned for this request.
        :param kind: ``"message"`` for a user's message, ``"resume"`` for continuing after approvals.
        :param text: The user's message (recorded so that a failed turn still keeps it).
        :param actor: Who asked, for the record.
        :returns: The claimed turn, with the conversation to continue.
        :raises SessionBusyError: If a turn is running or another request claimed this one first.
        """
        at = _now()
        if state.open_start is not None:
            if state.busy(at):
                raise SessionBusyError("This session is answering another message; try again when it has finished.")
            await self._abandon(state.open_start)
        start = TurnStart(
            turn=state.next_turn,
            kind=kind,
            text=text,
            actor=actor,
            worker=self.worker,
            started_at=at,
            lease_until=at + timedelta(seconds=self.lease),
        )
        try:
            await self.documents.create_async(_start_name(start.turn), start.model_dump_json().encode())
        except DocumentExistsError as error:
            raise SessionBusyError("Another request to this session started a turn first; nothing was run.") from error
        return Turn(start=start, conversation=state.conversation)

    async def finish(
        self,
        turn: Turn,
        *,
        status: TurnStatus,
        messages: list[ChatMessage] | None,
        reply: str | None = None,
        error: str | None = None,
    ) -> TurnEnd:
        """
        Record how a claimed turn ended.

        :param turn: The turn from `begin`.
        :param status: How it ended.
        :param messages: The whole conversation after the turn, or None to leave it as it was.
        :param reply: The assistant's last text, for listings.
        :param error: What went wrong, for failed turns.
        :returns: The recorded end.
        :raises TurnAbandonedError: If the turn's lease passed and another request ended it first.
        """
        end = TurnEnd(
            turn=turn.start.turn,
            status=status,
            messages=[message.to_dict() for message in messages] if messages is not None else None,
            reply=reply,
            error=error,
            worker=self.worker,
            ended_at=_now(),
        )
        try:
            await self.documents.create_async(_end_name(end.turn), end.model_dump_json().encode())
        except DocumentExistsError as exc:
            raise TurnAbandonedError(
                f"Turn {end.turn} ran past its lease and was ended by another request; its result was not recorded."
            ) from exc
        return end

    async def starts(self) -> list[TurnStart]:
        """
        Every turn's start, oldest first (what each turn was asked to do, including failed and abandoned ones).

        :returns: The starts.
        """
        names = sorted(name for name in await self.documents.list_async() if _START.fullmatch(name))
        return list(await asyncio.gather(*(self._read(name, TurnStart) for name in names)))

    async def _abandon(self, start: TurnStart) -> None:
        end = TurnEnd(
            turn=start.turn,
            status="abandoned",
            error=f"The worker {start.worker!r} did not finish this turn within its lease.",
            worker=self.worker,
            ended_at=_now(),
        )
        try:
            await self.documents.create_async(_end_name(start.turn), end.model_dump_json().encode())
        except DocumentExistsError as error:
            # The turn ended (finished late, or abandoned by another request) since we read: read again and retry.
            raise SessionBusyError("This session's history changed while this request read it; try again.") from error

    async def _read(self, name: str, model: type[_Record_T]) -> _Record_T:
        try:
            data = await self.documents.get_async(name)
        except ResultNotFoundError as error:
            # A listed document vanished: the session was purged while we read it.
            raise SessionBusyError("This session's history changed while this request read it; try again.") from error
        try:
            return model.model_validate_json(data)
        except ValidationError as error:
            raise HistoryRecordError(f"The history document {name!r} is not a valid {model.__name__}.") from error
