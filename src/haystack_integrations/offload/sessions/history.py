"""
A session's conversation, kept in the store as numbered turns, each claimed with a conditional create.

`SessionHistory` reads a session's conversation and writes each turn's start and end under ``.history/``. An end
appends the turn's messages, or holds a whole checkpoint when the turn rewrote the conversation or the appends since
the last checkpoint have outgrown it.
"""

import asyncio
import contextlib
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

from haystack.dataclasses import ChatMessage
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import to_jsonable_python

from haystack_integrations.offload.errors import DocumentExistsError, OffloadError, ResultNotFoundError
from haystack_integrations.offload.leases import renewing
from haystack_integrations.offload.stores import FsspecToolResultStore
from haystack_integrations.offload.stores.documents import SessionDocuments, writer_token
from haystack_integrations.offload.stores.retention import activity_document_name

NAMESPACE = "history"
DEFAULT_TURN_LEASE = 300.0
"""Seconds a started turn blocks its session before another request may declare it abandoned."""

TurnKind = Literal["message", "resume"]
TurnStatus = Literal["completed", "approval_required", "failed", "abandoned"]
TurnBase = Literal["checkpoint", "append"]

_Record_T = TypeVar("_Record_T", bound=BaseModel)
TURN_DOCUMENT = re.compile(r"turn\.(?P<turn>\d{8})\.(?P<part>start|end)\.json")
"""A turn's start or end document: activity documents (`stores.retention`), so purges date sessions by them."""
_START = re.compile(r"turn\.(?P<turn>\d{8})\.start\.json")
_END = re.compile(r"turn\.(?P<turn>\d{8})\.end\.json")


class SessionBusyError(OffloadError, RuntimeError):
    """Another request holds (or just claimed) the session's next turn; nothing was run. The server answers 409."""


class TurnAbandonedError(OffloadError, RuntimeError):
    """This turn's lease passed and another request ended it as abandoned; its result was not recorded."""


class HistoryRecordError(OffloadError, ValueError):
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
    token: str = Field(default_factory=writer_token, description="Unique to this claim: tells our create from another.")


class TurnEnd(_Record):
    """How one turn ended: created once, by the request that ran it (or by a later one, as ``abandoned``)."""

    turn: int = Field(ge=1)
    status: TurnStatus
    base: TurnBase = Field(
        description='What `messages` holds: "checkpoint", the whole conversation after the turn; "append", only the '
        "messages this turn added."
    )
    messages: list[dict[str, Any]] | None = Field(
        default=None, description="ChatMessage.to_dict of the messages, as `base` says; None: conversation unchanged."
    )
    checkpoint: int = Field(
        ge=0,
        description="The turn whose checkpoint the conversation after this turn builds on (this turn's, for a "
        "checkpoint; 0: none yet).",
    )
    reply: str | None = None
    error: str | None = None
    worker: str
    ended_at: AwareDatetime
    token: str = Field(default_factory=writer_token, description="Unique to this end: tells our create from another.")


@dataclass(frozen=True)
class HistoryLog:
    """Where a conversation stands in the store: its newest checkpoint and what was appended since (for `finish`)."""

    checkpoint: int = 0
    """The turn of the newest checkpoint (0: none yet)."""
    checkpoint_bytes: int = 0
    """The size of that checkpoint's document."""
    appended_bytes: int = 0
    """The sizes of the append documents since it, together."""


@dataclass(frozen=True)
class HistoryState:
    """What one read of the history found: the conversation so far and the state of the newest turn."""

    next_turn: int
    conversation: list[ChatMessage]
    last_end: TurnEnd | None
    open_start: TurnStart | None
    """The newest turn's start when that turn has no end yet (running, or abandoned once its lease passed)."""
    log: HistoryLog = field(default_factory=HistoryLog)
    """Where `conversation` stands in the store (which checkpoint, how much was appended since)."""

    def busy(self, at: datetime) -> bool:
        """Whether a turn is running (started, not ended, lease not passed) at `at`."""
        return self.open_start is not None and at < self.open_start.lease_until


@dataclass(frozen=True)
class Turn:
    """A claimed turn: the caller runs it, then records its end with `SessionHistory.finish`."""

    start: TurnStart
    conversation: list[ChatMessage]
    log: HistoryLog = field(default_factory=HistoryLog)
    """Where `conversation` stands in the store; `finish` appends to it."""


def _now() -> datetime:
    return datetime.now(UTC)


def _start_name(turn: int) -> str:
    return activity_document_name("turn", turn, "start")


def _end_name(turn: int) -> str:
    return activity_document_name("turn", turn, "end")


def _stored_form(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    # The JSON form (tuples become lists), so a conversation read back compares equal to the one that was written.
    return [to_jsonable_python(message.to_dict()) for message in messages]


class SessionHistory:
    """
    The turns of one session's conversation, read and written through the session's store.

    ```python
    history = SessionHistory(results.for_session("acme", "chat-42"), worker="web-1")
    turn = await history.begin(await history.read(), kind="message", text="Hello")  # SessionBusyError -> 409
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
        Read the history: one LIST; the newest end (and the newest start if that turn is still open); then, at once,
        the ends from the checkpoint the newest end names.

        :returns: The conversation so far and the state of the newest turn.
        :raises HistoryRecordError: If a history document is not a valid record.
        :raises SessionBusyError: If the history was purged while it was read.
        :raises StorageError: If the backend fails.
        """
        names = await self.documents.list_async()
        starts = [int(match["turn"]) for name in names if (match := _START.fullmatch(name))]
        ends = sorted(int(match["turn"]) for name in names if (match := _END.fullmatch(name)))
        newest = max([0, *starts, *ends])
        open_turn = newest if newest and (not ends or ends[-1] != newest) else None
        open_start, last = await asyncio.gather(
            self._read(_start_name(open_turn), TurnStart) if open_turn else _nothing(),
            self._read_end(ends[-1]) if ends else _nothing(),
        )
        if last is None:
            return HistoryState(next_turn=newest + 1, conversation=[], last_end=None, open_start=open_start)
        read: dict[int, tuple[TurnEnd, int]] = {ends[-1]: last}
        base = last[0].checkpoint
        # Checkpoint 0: no turn has stored a conversation yet, so there is nothing before the newest end to read.
        chain = [turn for turn in ends if turn >= base] if base else ends[-1:]
        unread = [turn for turn in chain if turn not in read]
        read.update(zip(unread, await asyncio.gather(*(self._read_end(turn) for turn in unread)), strict=True))
        conversation, log = _fold([read[turn] for turn in chain])
        return HistoryState(
            next_turn=newest + 1,
            conversation=[ChatMessage.from_dict(message) for message in conversation],
            last_end=last[0],
            open_start=open_start,
            log=log,
        )

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
        :raises QuotaExceededError: If the session or its tenant is at its quota; nothing was claimed or run.
        :raises CreateOutcomeUnknownError: If whether the claim landed could not be told (retryable: nothing ran).
        """
        at = _now()
        if state.open_start is not None:
            if state.busy(at):
                raise SessionBusyError("This session is answering another message; try again when it has finished.")
            await self._abandon(state.open_start, state.log)
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
            # The one history write a quota may refuse: nothing has run yet, so refusing it loses nothing.
            await self.documents.create_async(
                _start_name(start.turn), start.model_dump_json().encode(), enforce_quota=True
            )
        except DocumentExistsError as error:
            raise SessionBusyError("Another request to this session started a turn first; nothing was run.") from error
        return Turn(start=start, conversation=state.conversation, log=state.log)

    def renewing(self, turn: Turn) -> contextlib.AbstractAsyncContextManager[None]:
        """
        Keep `turn`'s lease alive while the block runs (every third of the lease), so a long turn is never abandoned.

        :param turn: The turn from `begin`.
        :returns: An async context manager.
        """

        async def renew() -> None:
            start = turn.start.model_copy(update={"lease_until": _now() + timedelta(seconds=self.lease)})
            # The holder's own document: a plain write keeps its token, so a reader still knows whose it is.
            await self.documents.put_async(_start_name(start.turn), start.model_dump_json().encode())

        return renewing(self.lease, renew, what=f"the lease on turn {turn.start.turn}")

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
        Record how a claimed turn ended: the messages it added to `turn.conversation`, or the whole conversation when
        the turn rewrote earlier messages (or a checkpoint is due; see the module documentation).

        :param turn: The turn from `begin`.
        :param status: How it ended.
        :param messages: The whole conversation after the turn, or None to leave it as it was.
        :param reply: The assistant's last text, for listings.
        :param error: What went wrong, for failed turns.
        :returns: The recorded end.
        :raises TurnAbandonedError: If the turn's lease passed and another request ended it first.
        """
        fields: dict[str, Any] = {
            "turn": turn.start.turn,
            "status": status,
            "reply": reply,
            "error": error,
            "worker": self.worker,
            "ended_at": _now(),
        }
        log = turn.log
        end: TurnEnd | None = None
        if messages is None:
            end = TurnEnd(**fields, base="append", messages=None, checkpoint=log.checkpoint)
        else:
            before, after = _stored_form(turn.conversation), _stored_form(messages)
            if log.checkpoint and after[: len(before)] == before:
                append = TurnEnd(**fields, base="append", messages=after[len(before) :], checkpoint=log.checkpoint)
                if log.appended_bytes + len(append.model_dump_json()) <= log.checkpoint_bytes:
                    end = append
            if end is None:
                end = TurnEnd(**fields, base="checkpoint", messages=after, checkpoint=turn.start.turn)
        try:
            # Charged to the quota but never refused: the turn has run, and this is the record of what it did.
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

    async def _abandon(self, start: TurnStart, log: HistoryLog) -> None:
        end = TurnEnd(
            turn=start.turn,
            status="abandoned",
            base="append",
            checkpoint=log.checkpoint,
            error=f"The worker {start.worker!r} did not finish this turn within its lease.",
            worker=self.worker,
            ended_at=_now(),
        )
        try:
            await self.documents.create_async(_end_name(start.turn), end.model_dump_json().encode())
        except DocumentExistsError as error:
            # The turn ended (finished late, or abandoned by another request) since we read: read again and retry.
            raise SessionBusyError("This session's history changed while this request read it; try again.") from error

    async def _read_end(self, turn: int) -> tuple[TurnEnd, int]:
        return await self._read_sized(_end_name(turn), TurnEnd)

    async def _read(self, name: str, model: type[_Record_T]) -> _Record_T:
        record, _ = await self._read_sized(name, model)
        return record

    async def _read_sized(self, name: str, model: type[_Record_T]) -> tuple[_Record_T, int]:
        try:
            data = await self.documents.get_async(name)
        except ResultNotFoundError as error:
            # A listed document vanished: the session was purged while we read it.
            raise SessionBusyError("This session's history changed while this request read it; try again.") from error
        try:
            return model.model_validate_json(data), len(data)
        except ValidationError as error:
            raise HistoryRecordError(f"The history document {name!r} is not a valid {model.__name__}.") from error


async def _nothing() -> None:
    return None


def _fold(chain: list[tuple[TurnEnd, int]]) -> tuple[list[dict[str, Any]], HistoryLog]:
    """Rebuild the conversation from its newest checkpoint and the appends after it, oldest first."""
    conversation: list[dict[str, Any]] = []
    checkpoint = checkpoint_bytes = appended_bytes = 0
    for end, size in chain:
        if end.messages is None:
            continue
        if end.base == "checkpoint":
            conversation = list(end.messages)
            checkpoint, checkpoint_bytes, appended_bytes = end.turn, size, 0
        else:
            # With its checkpoint gone (purged under a running turn), appends still rebuild what they can; the next
            # turn then writes a checkpoint (checkpoint 0), so the session heals.
            conversation.extend(end.messages)
            appended_bytes += size
    return conversation, HistoryLog(checkpoint, checkpoint_bytes, appended_bytes)
