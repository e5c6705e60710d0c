"""
A session's conversation, kept in the store as numbered turns, each claimed with a conditional create.

`SessionHistory` reads a session's conversation and writes each turn's start and end under ``.history/``. An end
appends the turn's messages; every `CHAIN_LIMIT` turns it holds a segment (everything since the checkpoint), or a whole
checkpoint when the appends have outgrown the last one, and it holds a checkpoint whenever the turn rewrote the
conversation. A small head document names the newest checkpoint and segment, so a read costs the same at turn 10 and at
turn 1,000 (`docs/design.md`). A session has no head for its first `CHAIN_LIMIT - 1` turns (a cold read folds them from
turn 1), so a short session pays no head PUT at all.
"""

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Awaitable, Coroutine, Hashable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from haystack.dataclasses import ChatMessage

from haystack_integrations.offload.errors import DocumentExistsError, ResultNotFoundError
from haystack_integrations.offload.leases import renewing
from haystack_integrations.offload.sessions.conversation_cache import SHARED_CONVERSATIONS, ConversationCache
from haystack_integrations.offload.sessions.errors import (
    SessionBusyError,
    StaleHistoryError,
    TurnAbandonedError,
)
from haystack_integrations.offload.sessions.history_records import (
    HistoryHead,
    RecordT,
    TurnEnd,
    TurnKind,
    TurnStart,
    parse_record,
    parse_sized,
)
from haystack_integrations.offload.sessions.history_records import TurnStatus as TurnStatus
from haystack_integrations.offload.sessions.message_json import added_messages, expanded, message_json, stored_form
from haystack_integrations.offload.stores import FsspecToolResultStore
from haystack_integrations.offload.stores.compact_documents import compress_document
from haystack_integrations.offload.stores.documents import SessionDocuments
from haystack_integrations.offload.stores.retention import activity_document_name

logger = logging.getLogger(__name__)

NAMESPACE = "history"
HEAD_DOCUMENT = "head.json"
CHAIN_LIMIT = 10
"""Turns after the one the head names (turn 0 while there is no head) before a turn's end holds a segment or checkpoint
and the head is rewritten: a cold read gets at most this many ends beside the checkpoint and segment, whatever the
session's length. So this is also how rarely a turn pays a third PUT: one turn in 10, never in a session's first 9, and
otherwise only for a turn that rewrote the conversation (at 8, the heads put a warm turn over $31 a million; a head with
each doubling checkpoint put 10-turn sessions at $31.94; `docs/design.md`)."""
NO_HEAD = b""
"""What a cached conversation holds for a session that has no head yet: its newest end is what tells it from a purged
and re-created session of the same name."""
DEFAULT_TURN_LEASE = 300.0
"""Seconds a started turn blocks its session before another request may declare it abandoned."""

TURN_DOCUMENT = re.compile(r"turn\.(?P<turn>\d{8})\.(?P<part>start|end)\.json")
"""A turn's start or end document: activity documents (`stores.retention`), so purges date sessions by them."""
_START = re.compile(r"turn\.(?P<turn>\d{8})\.start\.json")
_END = re.compile(r"turn\.(?P<turn>\d{8})\.end\.json")


@dataclass(frozen=True)
class HistoryLog:
    """Where a conversation stands in the store: its newest checkpoint and what was appended since (for `finish`)."""

    checkpoint: int = 0
    """The turn of the newest checkpoint (0: none yet)."""
    checkpoint_bytes: int = 0
    """The size of that checkpoint's document."""
    appended_bytes: int = 0
    """The sizes of the segment and append documents since it, together."""
    segment: int = 0
    """The turn of the newest segment since the checkpoint (0: none)."""
    checkpoint_messages: int = 0
    """How many messages the checkpoint holds (a segment holds the ones after them)."""
    lead: int = 0
    """The turn of the checkpoint or segment the session's head names, where a cold read starts (0: no head yet, so a
    cold read starts at turn 1). The next segment or checkpoint is due `CHAIN_LIMIT` turns after it."""

    @property
    def base(self) -> int:
        """The turn a new segment would be counted from: the newest checkpoint or segment."""
        return max(self.checkpoint, self.segment)


@dataclass(frozen=True)
class CachedConversation:
    """A session's conversation as of its newest ended turn, as this worker last read or wrote it."""

    turn: int
    """The newest ended turn."""
    head: bytes
    """The session's head document as it was when this entry was made: a different one means read again (`NO_HEAD`: the
    session had none; then a different newest end, or any head, means read again)."""
    messages: tuple[str, ...]
    """Each message's JSON (immutable, so no caller can change what another request will be given)."""
    log: HistoryLog
    last_end: TurnEnd
    """The newest turn's end, without its messages."""
    parsed: tuple[ChatMessage | None, ...] = ()
    """The messages as read (None where no read has parsed one yet): a warm read hands these out instead of parsing
    every message again, a cost that grew with the conversation (1.45x a turn held in memory at 1,000 turns)."""

    @property
    def size(self) -> int:
        """The bytes this entry is charged for in a `ConversationCache` (the parsed messages weigh twice the JSON)."""
        return 3 * sum(map(len, self.messages)) + len(self.head)


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
    basis: CachedConversation | None = field(default=None, repr=False, compare=False)
    """The conversation's JSON as read, for `finish` and this worker's cache (None: not cacheable)."""
    checked: bool = True
    """Whether the next turn's start was read. False: ``read(for_turn=True)`` left that to the claim, so `open_start`
    is not known and `begin` raises `StaleHistoryError` if the claim finds the turn taken."""
    current: asyncio.Future[bool] | None = field(default=None, repr=False, compare=False)
    """``read(for_turn=True)`` on a warm worker: whether the cached conversation is still the session's (its head, or
    before it has one its newest end), read while `begin` claims the turn."""

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
    basis: CachedConversation | None = field(default=None, repr=False, compare=False)
    """The conversation's JSON as read (see `HistoryState.basis`)."""


def _checking(check: Coroutine[Any, Any, bool]) -> asyncio.Future[bool]:
    """Start a check that `begin` awaits; its failure is retrieved even if no `begin` comes (no warning at exit)."""
    task = asyncio.ensure_future(check)
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return task


def _now() -> datetime:
    return datetime.now(UTC)


def _start_name(turn: int) -> str:
    return activity_document_name("turn", turn, "start")


def _end_name(turn: int) -> str:
    return activity_document_name("turn", turn, "end")


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
    only thing that ties it to a tenant and session. The conversations a worker served stay in its `cache`, checked
    against the store on every read, so the worker's next turn in a session reads two small documents, or only the
    head when the read is for claiming the turn (``read(for_turn=True)``: the claim is the other check).
    """

    def __init__(
        self,
        store: FsspecToolResultStore,
        *,
        worker: str,
        lease: float = DEFAULT_TURN_LEASE,
        cache: ConversationCache | None = None,
    ) -> None:
        """
        :param store: The session's store (`FsspecToolResultStore.for_session`).
        :param worker: This worker's name, recorded in the turns it claims.
        :param lease: Seconds a started turn may run before another request may end it as abandoned.
        :param cache: Where this worker keeps the conversations it served; None: the process's shared cache
            (`SHARED_CONVERSATIONS`). ``ConversationCache(0)`` reads everything from the store.
        :raises ValueError: If the store is not scoped to one session, or the lease is not positive.
        """
        if store.session is None:
            raise ValueError("A conversation belongs to one session: use store.for_session(tenant, session).")
        if not lease > 0:
            raise ValueError(f"The turn lease must be a positive number of seconds, got {lease}.")
        self.store = store
        self.worker = worker
        self.lease = float(lease)
        self.cache = SHARED_CONVERSATIONS if cache is None else cache
        self.documents: SessionDocuments = store.documents(NAMESPACE)
        self._key: Hashable = (store.url, *store.scope)

    async def read(self, *, for_turn: bool = False) -> HistoryState:
        """
        Read the history, at a cost that does not grow with the session's length.

        With the session's newest turn in this worker's cache: the head document and the next turn's start, at once
        (two small GETs; in a session's first turns, before it has a head, its newest end too), then two more per turn
        another worker has run since. Otherwise: the head, then at once the checkpoint and the ends since the newest
        segment it names, then the next turn's start; with no head yet, the first turn's start, then at once the ends
        from turn 1. A session whose turns were stored before head documents existed is listed once, as before.

        :param for_turn: The read is for claiming the next turn (`begin`) and nothing else: on a worker whose cache
            holds the session, and whose cached conversations are seldom behind (`ConversationCache.claims_first`),
            only the head is read (before the session has one, its newest end); the claim's conditional create then
            tells whether another worker ran the next turn (`StaleHistoryError`: read again without this). Never for
            showing a conversation (it may be behind).
        :returns: The conversation so far and the state of the newest turn.
        :raises HistoryRecordError: If a history document is not a valid record.
        :raises SessionBusyError: If the history was purged while it was read.
        :raises StorageError: If the backend fails.
        """
        state = await self._read_state(for_turn)
        self._keep(state.basis)
        return state

    async def _read_state(self, for_turn: bool) -> HistoryState:
        cached = self.cache.get(self._key)
        if not isinstance(cached, CachedConversation):
            return await self._read_from_head(await self._get(HEAD_DOCUMENT))
        if cached.head == NO_HEAD:
            return await self._read_headless_cached(cached, for_turn)
        if for_turn and self.cache.claims_first:
            # The head still tells a purged (or purged and re-created) session from this one; the claim does the rest.
            # Its GET runs beside the claim (`begin`): a warm turn's read and claim cost one round trip, not two.
            current = _checking(self._head_is(cached.head))
            return _Chain.of(cached).state(open_start=None, checked=False, current=current)
        head, start = await asyncio.gather(self._get(HEAD_DOCUMENT), self._get(_start_name(cached.turn + 1)))
        if head != cached.head:
            # A checkpoint or segment written elsewhere, or the session purged: what is cached may not lead there.
            self.cache.discard(self._key)
            return await self._read_from_head(head)
        return await self._follow(cached, start)

    async def _read_headless_cached(self, cached: CachedConversation, for_turn: bool) -> HistoryState:
        """`_read_state` for a session that had no head when cached: its newest end, not a head, is checked."""
        if for_turn and self.cache.claims_first:
            # The newest end tells a purged (or purged and re-created) session from this one; the claim does the rest
            # (a head written since means more turns ran, so the claim is refused and the next read finds it).
            current = _checking(self._end_is_newest(cached))
            return _Chain.of(cached).state(open_start=None, checked=False, current=current)
        head, end, start = await asyncio.gather(
            self._get(HEAD_DOCUMENT), self._get(_end_name(cached.turn)), self._get(_start_name(cached.turn + 1))
        )
        if head is not None or not self._is_newest(end, cached):
            # A head written since (turns ran elsewhere: read from it), or the session purged.
            self.cache.discard(self._key)
            return await self._read_from_head(head)
        return await self._follow(cached, start)

    async def _head_is(self, head: bytes) -> bool:
        return await self._get(HEAD_DOCUMENT) == head

    async def _end_is_newest(self, cached: CachedConversation) -> bool:
        return self._is_newest(await self._get(_end_name(cached.turn)), cached)

    def _is_newest(self, end: bytes | None, cached: CachedConversation) -> bool:
        """Whether `end` is the document of `cached`'s newest end (its writer's token), not another session's."""
        return end is not None and parse_record(_end_name(cached.turn), end, TurnEnd).token == cached.last_end.token

    async def _follow(self, cached: CachedConversation, start: bytes | None) -> HistoryState:
        """The cached conversation, carried on through the turns other workers ran since (`start`: the next one's)."""
        self.cache.observe(current=start is None)
        chain = _Chain.of(cached)
        while start is not None:  # another worker ran turns since: read them one by one (the head did not move)
            found, start_after = await asyncio.gather(
                self._end_or_none(chain.turn + 1), self._get(_start_name(chain.turn + 2))
            )
            if found is None:
                return chain.state(open_start=parse_record(_start_name(chain.turn + 1), start, TurnStart))
            chain.add(*found)
            start = start_after
        return chain.state(open_start=None)

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
        :raises StaleHistoryError: If `state` came from ``read(for_turn=True)`` and the turn was taken: nothing was
            claimed; read again (without `for_turn`) and claim again.
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
        # The one history write a quota may refuse: nothing has run yet, so refusing it loses nothing.
        claim = self.documents.create_async(_start_name(start.turn), start.encoded(), enforce_quota=True)
        try:
            await (claim if state.current is None else self._claim_if_current(claim, state.current, start.turn))
        except DocumentExistsError as error:
            if not state.checked:
                self.cache.observe(current=False)
                raise StaleHistoryError(
                    f"Turn {start.turn} was taken since this worker's cached conversation; read again and retry."
                ) from error
            raise SessionBusyError("Another request to this session started a turn first; nothing was run.") from error
        if not state.checked:
            self.cache.observe(current=True)
        return Turn(start=start, conversation=state.conversation, log=state.log, basis=state.basis)

    async def _claim_if_current(self, claim: Awaitable[None], current: Awaitable[bool], turn: int) -> None:
        """
        Claim beside the check that the cached conversation is the session's. A session that changed under the cache
        (purged, or purged and re-created: more turns elsewhere make the claim itself fail) gets its claim taken back.

        :raises StaleHistoryError: If the session changed; nothing is left claimed.
        """
        claimed, is_current = await asyncio.gather(claim, current, return_exceptions=True)
        if is_current is True:
            if isinstance(claimed, BaseException):
                raise claimed
            return
        self.cache.discard(self._key)
        if not isinstance(claimed, BaseException):
            try:
                await self.documents.delete_async(_start_name(turn))
            except Exception:  # its lease ends it as an abandoned turn, as a dead worker's
                logger.warning("Could not take back the claim of turn %s.", turn, exc_info=True)
        if isinstance(is_current, BaseException):
            raise is_current
        if isinstance(claimed, BaseException) and not isinstance(claimed, DocumentExistsError):
            raise claimed
        self.cache.observe(current=False)
        raise StaleHistoryError(
            f"The session changed since this worker's cached conversation (turn {turn}); read again."
        )

    def renewing(self, turn: Turn) -> contextlib.AbstractAsyncContextManager[None]:
        """
        Keep `turn`'s lease alive while the block runs (every third of the lease), so a long turn is never abandoned.

        :param turn: The turn from `begin`.
        :returns: An async context manager.
        """

        async def renew() -> None:
            start = turn.start.model_copy(update={"lease_until": _now() + timedelta(seconds=self.lease)})
            # The holder's own document: a plain write keeps its token, so a reader still knows whose it is.
            await self.documents.put_async(_start_name(start.turn), start.encoded())

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
        the turn rewrote earlier messages (or a checkpoint or segment is due; see the module documentation).

        Only the added messages are serialized on an append; the earlier ones are compared, not converted.

        :param turn: The turn from `begin`.
        :param status: How it ended.
        :param messages: The whole conversation after the turn, or None to leave it as it was.
        :param reply: The assistant's last text, for listings. Not stored when it is the text of the conversation's
            last message, which holds it already (an end without a reply then means that message's text).
        :param error: What went wrong, for failed turns.
        :returns: The recorded end.
        :raises TurnAbandonedError: If the turn's lease passed and another request ended it first.
        """
        if messages and reply is not None and messages[-1].text == reply:
            reply = None  # stored once, in its message, not twice in every end
        end = _planned_end(
            turn,
            messages,
            status=status,
            reply=reply,
            error=error,
            worker=self.worker,
            ended_at=_now(),
        )
        # Sizes are of the JSON (what serializing and parsing cost), however small it is stored.
        document = end.json_form()
        data = compress_document(document)
        try:
            # Charged to the quota but never refused: the turn has run, and this is the record of what it did.
            await self.documents.create_async(_end_name(end.turn), data)
        except DocumentExistsError as exc:
            self.cache.discard(self._key)
            raise TurnAbandonedError(
                f"Turn {end.turn} ran past its lease and was ended by another request; its result was not recorded."
            ) from exc
        await self._remember(turn, end, len(document))
        return end

    async def starts(self) -> list[TurnStart]:
        """
        Every turn's start, oldest first (what each turn was asked to do, including failed and abandoned ones).

        :returns: The starts.
        """
        names = sorted(name for name in await self.documents.list_async() if _START.fullmatch(name))
        return list(await asyncio.gather(*(self._read(name, TurnStart) for name in names)))

    async def _remember(self, turn: Turn, end: TurnEnd, size: int) -> None:
        """Point the head at a new checkpoint or segment if due; keep the conversation after the turn in the cache."""
        head = turn.basis.head if turn.basis is not None else None
        leads = _leads(turn.log, end)
        if leads:
            written = HistoryHead(checkpoint=end.checkpoint, segment=end.segment, token=end.token).encoded()
            try:
                await self.documents.put_async(HEAD_DOCUMENT, written)
            except Exception:  # the end is recorded; a head left behind only makes cold reads walk a little further
                logger.warning("Could not update the history head of turn %s.", end.turn, exc_info=True)
                self.cache.discard(self._key)
                return
            head = written
        elif end.base == "checkpoint":
            head = NO_HEAD  # a checkpoint before the session's first head: a cold read finds it from turn 1
        if head is None or (turn.basis is None and end.base != "checkpoint"):
            self.cache.discard(self._key)  # without the JSON of what came before, there is nothing exact to keep
            return
        chain = _Chain.of(turn.basis) if turn.basis is not None else _Chain()
        chain.head = head
        chain.add(end, size)
        if leads:
            chain.log = replace(chain.log, lead=end.turn)
        self._keep(chain.cached())

    def _keep(self, entry: CachedConversation | None) -> None:
        if entry is not None:
            self.cache.put(self._key, entry)

    async def _read_from_head(self, head_data: bytes | None) -> HistoryState:
        if head_data is None:
            # A new session costs one GET more, not a LIST.
            first_start = await self._get(_start_name(1))
            if first_start is None:
                return HistoryState(next_turn=1, conversation=[], last_end=None, open_start=None)
            return await self._read_headless(first_start)
        head = parse_record(HEAD_DOCUMENT, head_data, HistoryHead)
        base = max(head.checkpoint, head.segment)
        checkpoint, ends = await asyncio.gather(
            self._end_or_none(head.checkpoint) if head.segment else _nothing(), self._batch(base)
        )
        first = checkpoint if head.segment else ends[0]
        if first is None or ends[0] is None:
            return await self._read_listed()  # the head names an end that is gone: partly deleted by hand
        chain = _Chain(head=head_data)
        if checkpoint is not None:
            chain.add(*checkpoint)
        chain = await self._forward(chain, base, ends)
        chain.log = replace(chain.log, lead=base)
        return chain.state(open_start=await self._start_or_none(chain.turn + 1))

    async def _read_headless(self, first_start: bytes) -> HistoryState:
        """
        Read a session with turns and no head: one in its first `CHAIN_LIMIT - 1` turns, its ends folded from turn 1
        (read at once). More ends than that: a session stored before head documents (or whose head could not be
        written), which is listed once, as before; its next turn writes a head.
        """
        ends = await self._batch(1)
        if all(found is not None for found in ends) or (ends[0] is None and any(ends)):
            return await self._read_listed()
        chain = _Chain(head=NO_HEAD)
        for found in ends:
            if found is None:
                break
            chain.add(*found)
        if chain.turn == 0:  # the first turn is running (or was abandoned): nothing is stored yet
            return chain.state(open_start=parse_record(_start_name(1), first_start, TurnStart))
        return chain.state(open_start=await self._start_or_none(chain.turn + 1))

    async def _forward(self, chain: "_Chain", first: int, batch: list[tuple[TurnEnd, int] | None]) -> "_Chain":
        """Fold the ends from `first` on, read `CHAIN_LIMIT + 1` at once, until one is missing."""
        while True:
            for found in batch:
                if found is None:
                    return chain
                chain.add(*found)
            first += len(batch)
            batch = await self._batch(first)

    async def _batch(self, first: int) -> list[tuple[TurnEnd, int] | None]:
        return list(await asyncio.gather(*(self._end_or_none(turn) for turn in range(first, first + CHAIN_LIMIT + 1))))

    async def _read_listed(self) -> HistoryState:
        """Read a session stored without a head (before they existed, or before its first checkpoint): one LIST."""
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
        folded = _Chain()
        for turn in chain:
            folded.add(*read[turn])
        return folded.state(open_start=open_start, next_turn=newest + 1)

    async def _abandon(self, start: TurnStart, log: HistoryLog) -> None:
        end = TurnEnd(
            turn=start.turn,
            status="abandoned",
            base="append",
            checkpoint=log.checkpoint,
            segment=log.segment,
            error=f"The worker {start.worker!r} did not finish this turn within its lease.",
            worker=self.worker,
            ended_at=_now(),
        )
        try:
            await self.documents.create_async(_end_name(start.turn), end.encoded())
        except DocumentExistsError as error:
            # The turn ended (finished late, or abandoned by another request) since we read: read again and retry.
            raise SessionBusyError("This session's history changed while this request read it; try again.") from error

    async def _get(self, name: str) -> bytes | None:
        try:
            return await self.documents.get_async(name)
        except ResultNotFoundError:
            return None

    async def _end_or_none(self, turn: int) -> tuple[TurnEnd, int] | None:
        name = _end_name(turn)
        data = await self._get(name)
        return None if data is None else parse_sized(name, data, TurnEnd)

    async def _start_or_none(self, turn: int) -> TurnStart | None:
        name = _start_name(turn)
        data = await self._get(name)
        return None if data is None else parse_record(name, data, TurnStart)

    async def _read_end(self, turn: int) -> tuple[TurnEnd, int]:
        return await self._read_sized(_end_name(turn), TurnEnd)

    async def _read(self, name: str, model: type[RecordT]) -> RecordT:
        record, _ = await self._read_sized(name, model)
        return record

    async def _read_sized(self, name: str, model: type[RecordT]) -> tuple[RecordT, int]:
        data = await self._get(name)
        if data is None:
            # A listed document vanished: the session was purged while we read it.
            raise SessionBusyError("This session's history changed while this request read it; try again.")
        return parse_sized(name, data, model)


async def _nothing() -> None:
    return None


def _due(log: HistoryLog, turn: int) -> bool:
    """Whether `turn` is `CHAIN_LIMIT` turns past the one the head names (turn 0 while there is no head)."""
    return turn - log.lead >= CHAIN_LIMIT


def _leads(log: HistoryLog, end: TurnEnd) -> bool:
    """
    Whether `end` (recorded on `log`) is named by a new head: a segment or checkpoint that is due, or a checkpoint of a
    session that has a head (a rewritten conversation: a head left behind would lead cold reads through what it
    replaced). A checkpoint before the first head needs none: cold reads fold those turns from turn 1.
    """
    return end.base != "append" and (log.lead > 0 or _due(log, end.turn))


def _planned_end(turn: Turn, messages: list[ChatMessage] | None, **fields: Any) -> TurnEnd:
    """The end to record: an append of the added messages, or a segment or checkpoint when one is due."""
    log, number = turn.log, turn.start.turn
    due = _due(log, number)
    if messages is None:
        if not due:
            return TurnEnd(
                **fields, turn=number, base="append", messages=None, checkpoint=log.checkpoint, segment=log.segment
            )
        messages = turn.conversation  # unchanged, but the head is due all the same: cold reads must not walk further
    added = added_messages(turn.conversation, messages) if log.checkpoint else None
    if added is None:  # the first stored conversation, or a turn that rewrote earlier messages (compaction)
        return TurnEnd(**fields, turn=number, base="checkpoint", messages=stored_form(messages), checkpoint=number)
    new = stored_form(added)
    append = TurnEnd(**fields, turn=number, base="append", messages=new, checkpoint=log.checkpoint, segment=log.segment)
    if not due:
        # Between heads every turn appends, even when the appends outgrow the checkpoint: a checkpoint the head does
        # not name would cost a head PUT, or make cold reads fetch the conversation it replaces as well.
        return append
    if log.appended_bytes + len(append.json_form()) > log.checkpoint_bytes:
        # The appends have outgrown the checkpoint: checkpoints at least double, so stored bytes stay linear.
        return TurnEnd(**fields, turn=number, base="checkpoint", messages=_json_form(turn) + new, checkpoint=number)
    tail = _json_form(turn, start=log.checkpoint_messages)
    return TurnEnd(
        **fields, turn=number, base="segment", messages=tail + new, checkpoint=log.checkpoint, segment=number
    )


def _json_form(turn: Turn, *, start: int = 0) -> list[dict[str, Any]]:
    """`turn.conversation[start:]` as stored: parsed from the JSON it was read from, else converted."""
    if turn.basis is not None:
        return [json.loads(message) for message in turn.basis.messages[start:]]
    return stored_form(turn.conversation[start:])


@dataclass
class _Chain:
    """A conversation folded from its checkpoint, segment and appends, oldest first."""

    head: bytes | None = None
    turn: int = 0
    messages: list[str] = field(default_factory=list)
    log: HistoryLog = field(default_factory=HistoryLog)
    last: TurnEnd | None = None
    parsed: list[ChatMessage | None] = field(default_factory=list)
    """Beside `messages`, one for one: each as parsed, or None until `state` parses it."""

    @classmethod
    def of(cls, cached: CachedConversation) -> "_Chain":
        parsed: list[ChatMessage | None] = list(cached.parsed)
        if len(parsed) != len(cached.messages):
            parsed = [None] * len(cached.messages)
        return cls(cached.head, cached.turn, list(cached.messages), cached.log, cached.last_end, parsed)

    def add(self, end: TurnEnd, size: int) -> None:
        self.turn, self.last = end.turn, end.model_copy(update={"messages": None})
        if end.messages is None:
            return
        encoded = [message_json(message) for message in end.messages]
        before, log = self.messages, self.log
        # Where the head leads is set by whoever reads or writes the head, not by folding ends.
        if end.base == "checkpoint":
            self.messages, self.log = encoded, HistoryLog(end.turn, size, 0, 0, len(encoded), log.lead)
        elif end.base == "segment" and end.checkpoint == log.checkpoint:
            self.messages = self.messages[: log.checkpoint_messages] + encoded
            self.log = replace(log, appended_bytes=size, segment=end.turn)
        elif end.base == "segment":
            # Its checkpoint is gone (purged under a running turn): keep what it holds; the next turn checkpoints.
            self.messages, self.log = encoded, HistoryLog(appended_bytes=size, segment=end.turn, lead=log.lead)
        else:
            # With its checkpoint gone, appends still rebuild what they can; the next turn then writes a checkpoint
            # (checkpoint 0), so the session heals.
            self.messages = [*self.messages, *encoded]
            self.log = replace(log, appended_bytes=log.appended_bytes + size)
        # A checkpoint or segment restates what came before: the same JSON at the same place is the same message.
        self.parsed = [
            self.parsed[index] if index < len(before) and before[index] == message else None
            for index, message in enumerate(self.messages)
        ]

    def cached(self) -> CachedConversation | None:
        if self.head is None or self.last is None:
            return None
        return CachedConversation(self.turn, self.head, tuple(self.messages), self.log, self.last, tuple(self.parsed))

    def conversation(self) -> list[ChatMessage]:
        """
        The messages, each parsed once per worker, in a list of the caller's own. The messages themselves are shared
        with later reads, as Haystack shares them: a change to a conversation is a new message, never one edited in
        place (what a turn stores is compared by value with what it read, so an edit in place would not be stored).
        """
        for index, message in enumerate(self.parsed):
            if message is None:
                self.parsed[index] = ChatMessage.from_dict(expanded(json.loads(self.messages[index])))
        return [message for message in self.parsed if message is not None]

    def state(
        self,
        *,
        open_start: TurnStart | None,
        next_turn: int | None = None,
        checked: bool = True,
        current: asyncio.Future[bool] | None = None,
    ) -> HistoryState:
        newest = self.turn if open_start is None else open_start.turn
        return HistoryState(
            next_turn=next_turn if next_turn is not None else newest + 1,
            conversation=self.conversation(),
            last_end=self.last,
            open_start=open_start,
            log=self.log,
            basis=self.cached(),
            checked=checked,
            current=current,
        )
