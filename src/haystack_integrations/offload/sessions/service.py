"""
`ChatService`: what the reference server does per request, without the web framework (the demo calls it directly).

Every method takes the *session's* store and keeps no per-session state: message turns, decisions and resumes,
with a `TurnProgress` for a client that watches.
"""

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage

from haystack_integrations.offload import metrics
from haystack_integrations.offload.approvals import (
    APPROVAL_REQUIRED,
    ApprovalAlreadyDecidedError,
    ApprovalClaimedError,
    ApprovalDecision,
    ApprovalNotFoundError,
    ApprovalPendingError,
    ApprovalRequest,
    AuditEvent,
    Decision,
    DurableApprovals,
    InvalidApprovalEditError,
    ResumeInterruptedError,
    pending_approvals_async,
    read_audit_async,
)
from haystack_integrations.offload.approvals.agent_step import continuing_agent
from haystack_integrations.offload.approvals.approval_records import HeldStep
from haystack_integrations.offload.approvals.decisions import (
    OpenStep,
    decide_in_async,
    newest_done_async,
    newest_done_in_async,
    open_step_async,
    open_step_in_async,
    pending_in_async,
)
from haystack_integrations.offload.approvals.hook import HELD_STEPS_KEY
from haystack_integrations.offload.approvals.ledger import ApprovalLedger, ApprovalSnapshot, sequence_of
from haystack_integrations.offload.approvals.resume import (
    DEFAULT_RESUME_LEASE,
    OUTCOMES_KEY,
    default_worker,
    resume_in_async,
)
from haystack_integrations.offload.context import offload_context
from haystack_integrations.offload.errors import InvalidReferenceError, ResultNotFoundError
from haystack_integrations.offload.hooks.pointers import OFFLOADED_META_KEY
from haystack_integrations.offload.sessions.conversation_cache import ConversationCache
from haystack_integrations.offload.sessions.errors import (
    ApprovalPendingConflict,
    InvalidMessageError,
    NotFoundError,
    NothingToResumeError,
    RunFailedError,
    SessionBusyError,
    StaleHistoryError,
)
from haystack_integrations.offload.sessions.history import (
    DEFAULT_TURN_LEASE,
    HistoryState,
    SessionHistory,
    Turn,
    TurnStatus,
)
from haystack_integrations.offload.sessions.outcomes import (
    DecisionOutcome,
    ResultPage,
    SessionSummary,
    Transcript,
    TurnOutcome,
    media_type_of,
    record_named,
    session_summaries,
)
from haystack_integrations.offload.sessions.progress import PROGRESS_CONTEXT_KEY, TurnProgress, summarize_arguments
from haystack_integrations.offload.stores import FsspecToolResultStore, StoredResult
from haystack_integrations.offload.tools.paging import complete_length, leading_continuations

logger = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 20_000
DEFAULT_PAGE_BYTES = 16_384
MAX_PAGE_BYTES = 1_048_576
STREAM_CHUNK_BYTES = 1_048_576
NOT_FOUND_RESULT = "No such result in this session."
NOT_FOUND_APPROVAL = "No such approval request in this session."
# A turn's status as the turns metric tells it (`metrics.turn_ended`): one held for approval is "held".
_TURN_METRIC_STATUSES: dict[TurnStatus, str] = {"completed": "completed", "approval_required": "held"}


@dataclass(frozen=True)
class _ApprovalsRead:
    """
    What one request read of the session's approvals, passed on to the rest of the request instead of read again:
    its ledger (which keeps the steps and decisions it read or wrote) and its snapshot of the newest held step.
    """

    ledger: ApprovalLedger
    snapshot: ApprovalSnapshot

    @classmethod
    async def of(cls, store: FsspecToolResultStore) -> "_ApprovalsRead":
        """Read the session's newest held step, once for the request."""
        ledger = ApprovalLedger(store)
        return cls(ledger, await ledger.snapshot_async())

    async def open_step(self) -> OpenStep | None:
        """The open step as the snapshot tells it (see `open_step_async`)."""
        return await open_step_in_async(self.ledger, self.snapshot)


class ChatService:
    """
    The reference server's request handlers, framework-free: one instance (and one Agent) serves every tenant.

    ```python
    from haystack_integrations.offload import FsspecToolResultStore
    from haystack_integrations.offload.sessions import ChatService

    results = FsspecToolResultStore("s3://acme-agent-results/prod")  # once, at start-up
    service = ChatService(agent)  # the shared Agent, with OffloadHook and ApprovalHook among its hooks

    # per request: the session's store, from the authenticated tenant and the chat's id
    outcome = await service.send_message(results.for_session(user.org_id, chat_id), text, actor=user.id)
    ```

    Multi-user use: the tenant comes from authentication and reaches the service only as the store's scope; the
    service holds the Agent and its settings, never a session's state.
    """

    def __init__(
        self,
        agent: Agent,
        *,
        approval_ttl: float = 24 * 3600.0,
        turn_lease: float = DEFAULT_TURN_LEASE,
        resume_lease: float = DEFAULT_RESUME_LEASE,
        system_prompt: str | None = None,
        worker: str | None = None,
        conversation_cache: ConversationCache | None = None,
    ) -> None:
        """
        :param agent: The shared Agent (see `build_agent`); its hooks must include `ApprovalHook` for approvals.
        :param approval_ttl: Seconds an approval request can be decided.
        :param turn_lease: Seconds a turn may run before a later request may declare it abandoned.
        :param resume_lease: Seconds a resuming worker's claim on a held step lasts unrenewed (it renews it while it
            works); after a worker died, the step can be resumed elsewhere once this has passed.
        :param system_prompt: Prepended to a session's first turn (stored with the conversation, so it is sent once).
        :param worker: This worker's name in history, claims and audit; default ``<host>:<pid>``.
        :param conversation_cache: Where this worker keeps the conversations it served, so its next turn in a session
            reads only what changed; None: the process's shared cache (64 MiB). ``ConversationCache(0)`` keeps none.
        """
        self.agent = agent
        self.approval_ttl = approval_ttl
        self.turn_lease = turn_lease
        self.resume_lease = resume_lease
        self.system_prompt = system_prompt
        self.worker = worker or default_worker()
        self.conversation_cache = conversation_cache

    # Conversation

    async def send_message(
        self,
        store: FsspecToolResultStore,
        text: str,
        *,
        actor: str | None = None,
        progress: TurnProgress | None = None,
    ) -> TurnOutcome:
        """
        Answer one user message in the session.

        :param store: The session's store.
        :param text: The user's message.
        :param actor: Who sent it (recorded on approval requests and in the history).
        :param progress: This request's publisher, when its client watches the turn as it runs: it is told when the
            turn is claimed, gets the run's events (through Haystack's streaming callback and the progress hooks in
            ``hook_context``) and the approval requests the turn stops for. None: the run is exactly as without it.
        :returns: The turn's outcome: a reply, or the approvals it waits for.
        :raises InvalidMessageError: If the message is empty or longer than `MAX_MESSAGE_CHARS`.
        :raises ApprovalPendingConflict: If the conversation waits for approval decisions.
        :raises SessionBusyError: If another request holds the session's next turn.
        :raises RunFailedError: If the Agent failed (the turn is recorded as failed).
        """
        if not isinstance(text, str) or not text.strip():
            raise InvalidMessageError("The message is empty.")
        if len(text) > MAX_MESSAGE_CHARS:
            raise InvalidMessageError(
                f"The message has {len(text)} characters; at most {MAX_MESSAGE_CHARS} are allowed."
            )
        history = self._history(store)
        state = await history.read(for_turn=True)
        while True:
            approvals = await self._refuse_while_held(store, state)
            try:
                turn, conversation = await self._begin(
                    history, state, progress, approvals, kind="message", text=text, actor=actor
                )
                break
            except StaleHistoryError:
                # This worker's cached conversation was behind (the claim found the turn taken; nothing ran): read what
                # the other workers added. That read checks the next turn itself, so a refusal now is a real race.
                state = await history.read()
        if not conversation and self.system_prompt:
            conversation.append(ChatMessage.from_system(self.system_prompt))
        messages = [*conversation, ChatMessage.from_user(text)]
        context = self._context(store, actor, progress)
        try:
            async with history.renewing(turn):
                reply = await self.agent.run_async(
                    messages,
                    # Only a watching client gets a callback: a generator streams (stream=true) only when given one.
                    streaming_callback=progress.on_chunk if progress is not None else None,
                    hook_context=context,
                )
        except Exception as error:
            await self._fail(history, turn, error, messages=None)
            raise RunFailedError(f"The agent failed to answer: {type(error).__name__}.") from error
        return await self._finish(history, turn, store, reply, context, before=conversation, progress=progress)

    async def resume(
        self, store: FsspecToolResultStore, *, actor: str | None = None, progress: TurnProgress | None = None
    ) -> TurnOutcome:
        """
        Continue a conversation whose held step has no pending requests left (all decided, or expired).

        `decide` calls this itself after the last decision; call it directly for steps whose requests expired.

        :param store: The session's store.
        :param actor: Who asked.
        :param progress: The publisher of a client that watches, as for `send_message`: told when the resume turn is
            claimed, then the resumed run's events (the approved calls, their results and offloads, the model's reply)
            and the approval requests it stops for again. None: the run is exactly as without it.
        :returns: The resumed turn's outcome.
        :raises NothingToResumeError: If no held step waits in this session.
        :raises ApprovalPendingConflict: If some requests still wait for a decision.
        :raises SessionBusyError: If another request holds the session's next turn.
        :raises RunFailedError: If continuing failed (what ran is kept in the conversation).
        """
        return await self._resume(store, await _ApprovalsRead.of(store), actor=actor, progress=progress)

    async def _resume(
        self,
        store: FsspecToolResultStore,
        approvals: _ApprovalsRead,
        *,
        actor: str | None,
        progress: TurnProgress | None,
    ) -> TurnOutcome:
        """
        `resume`, from what the request read of the approvals (by `decide`, or by `resume` itself): the snapshot serves
        the checks, the turn's lost answers and the resume, each of whose writes is conditional (or made under a
        conditional claim), so a snapshot gone stale since it was read is refused, never acted on.
        """
        # The approval ledger, not the history, says whether a step waits: a turn that died while resuming (its
        # worker killed, its end never written) leaves the step open, and it must stay resumable.
        step = await approvals.open_step()
        if step is None:
            return await self._finish_lost_step(store, approvals, actor, progress)
        if step.waiting:
            raise ApprovalPendingConflict(
                f"{len(step.waiting)} approval request(s) still wait for a decision.", step.waiting
            )
        if step.resuming_until is not None:
            raise SessionBusyError("Another worker is resuming this conversation; try again when it has finished.")
        history = self._history(store)
        state = await history.read()
        turn, conversation = await self._begin(history, state, progress, approvals, kind="resume", actor=actor)
        context = self._context(store, actor, progress)
        try:
            async with history.renewing(turn):
                reply = await resume_in_async(
                    self.agent,
                    conversation,
                    approvals.ledger,
                    approvals.snapshot,
                    hook_context=context,
                    worker=self.worker,
                    lease=self.resume_lease,
                    # Passed on to the continuing Agent run (run keyword arguments); only a watching client has one.
                    **({"streaming_callback": progress.on_chunk} if progress is not None else {}),
                )
        except ResumeInterruptedError as error:
            # The step ran (exactly once); keep its results in the conversation even though the model call failed.
            await self._fail(history, turn, error, messages=list(error.messages))
            raise RunFailedError("The approved calls ran, but the agent failed to continue.") from error
        except ApprovalClaimedError as error:
            # Nothing ran here: another worker claimed the step first (or finished it). The conversation is unchanged.
            await self._fail(history, turn, error, messages=None)
            raise SessionBusyError(f"The held step is being resumed elsewhere: {error}") from error
        except (ApprovalPendingError, ApprovalNotFoundError) as error:
            await self._fail(history, turn, error, messages=None)
            raise NothingToResumeError(f"The held step cannot be resumed: {error}") from error
        except Exception as error:
            await self._fail(history, turn, error, messages=None)
            raise RunFailedError(f"The agent failed to continue: {type(error).__name__}.") from error
        return await self._finish(history, turn, store, reply, context, before=turn.conversation, progress=progress)

    async def transcript(self, store: FsspecToolResultStore) -> Transcript:
        """
        Read the session's conversation as stored (an unknown session reads as an empty one).

        :param store: The session's store.
        :returns: The transcript.
        """
        state = await self._history(store).read()
        last = state.last_end
        busy = state.busy(datetime.now(UTC))
        # A turn whose lease passed with no end was abandoned, though no later turn has recorded that yet.
        unended = state.open_start is not None and not busy
        status: TurnStatus | None = "abandoned" if unended else last.status if last is not None else None
        resumable = False
        if not busy and status in ("failed", "abandoned", "approval_required"):
            # Only after a failure or a hold is the ledger read: a resume that failed, or a decision whose answer
            # failed before its resume began (an audit append that gave up), leaves the step open, decided, unrun.
            approvals = await _ApprovalsRead.of(store)
            step = await approvals.open_step()
            if step is None:  # a resumed step that ran, whose turn was lost: resume gives the model its answers
                lost = await self._with_lost_steps(store, state, list(state.conversation), approvals)
                resumable = lost != state.conversation
            else:
                resumable = (
                    not step.waiting
                    and step.resuming_until is None
                    and (step.decided or status != "approval_required")  # else its requests expired: see the page
                )
        return Transcript(
            messages=state.conversation,
            turns=state.next_turn - 1,
            busy=busy,
            status=status,
            error=last.error if last is not None and not unended else None,
            resumable=resumable,
        )

    # Approvals

    async def pending(self, store: FsspecToolResultStore) -> list[ApprovalRequest]:
        """
        The session's approval requests that wait for a decision.

        :param store: The session's store.
        :returns: The requests, in the model's order.
        """
        return await pending_approvals_async(store)

    async def decide(
        self,
        store: FsspecToolResultStore,
        request_id: str,
        *,
        approved: bool,
        arguments: dict[str, Any] | None = None,
        reason: str | None = None,
        actor: str | None = None,
        progress: TurnProgress | None = None,
    ) -> DecisionOutcome:
        """
        Record a decision; if it was the held step's last, resume the conversation in the same request.

        :param store: The session's store.
        :param request_id: The request (a client's input: parsed, never trusted).
        :param approved: Approve or deny.
        :param arguments: Edited arguments (approvals only), validated against the tool's schema.
        :param reason: Shown to the model with a denial; kept in the audit.
        :param actor: Who decided.
        :param progress: The publisher of a client that watches the resumed run (see `resume`); a decision that leaves
            requests pending, or whose step another request resumes, publishes no run events to it.
        :returns: The decision and what followed.
        :raises NotFoundError: If this session has no such request (whether or not another session has).
        :raises ApprovalExpiredError: If the request expired.
        :raises ApprovalAlreadyDecidedError: If it already has another decision (another verdict or other
            arguments), or its step is finished. The same decision again, while its step is still open (a resume that
            failed), continues the step instead, as the first answer would have.
        :raises InvalidApprovalEditError: If the edit is invalid or the decision is malformed.
        """
        try:
            decision = (
                Decision.approve(arguments, by=actor, reason=reason) if approved else Decision.deny(reason, by=actor)
            )
        except ValueError as error:  # pydantic's ValidationError: e.g. a denial that carries arguments
            raise InvalidApprovalEditError(str(error)) from error
        # One ledger and one snapshot of the held step serve the whole request (the decision, what still waits, the
        # resume): each document is read once. The snapshot is read after the decision is recorded, so it holds it.
        ledger = ApprovalLedger(store)
        approvals: _ApprovalsRead | None = None
        try:
            record = await decide_in_async(ledger, request_id, decision, ttl=self.approval_ttl)
        except ApprovalNotFoundError as error:
            raise NotFoundError(NOT_FOUND_APPROVAL) from error
        except ApprovalAlreadyDecidedError as error:
            if not error.repeated:
                raise
            approvals = _ApprovalsRead(ledger, await ledger.snapshot_async())
            if not await self._decided_step_open(approvals, error.recorded):
                raise
            # The same decision again, while its step is still open: its first answer failed while resuming (or never
            # arrived). Continue the step as that answer would have; the resume's claims keep every call to one run.
            record = error.recorded
        if approvals is None:
            approvals = _ApprovalsRead(ledger, await ledger.snapshot_async())
        pending = await pending_in_async(ledger, approvals.snapshot)
        if pending:
            return DecisionOutcome(decision=record, pending=pending, resumed=None)
        try:
            resumed = await self._resume(store, approvals, actor=actor, progress=progress)
        except (SessionBusyError, NothingToResumeError):
            # "Resumed elsewhere" only when another worker's claim on the step really exists (it is resuming, or has
            # finished it); any other failure is the caller's to retry, and the decision stands either way. Read
            # afresh: the refusal says the snapshot this request read is stale.
            if not await self._resumed_elsewhere(store):
                raise
            return DecisionOutcome(decision=record, pending=[], resumed=None, resumed_elsewhere=True)
        return DecisionOutcome(decision=record, pending=resumed.pending, resumed=resumed)

    async def audit(self, store: FsspecToolResultStore) -> list[AuditEvent]:
        """
        The session's approval audit record, oldest first.

        :param store: The session's store.
        :returns: The events.
        """
        return await read_audit_async(store)

    # Sessions

    async def sessions(self, store: FsspecToolResultStore) -> list[SessionSummary]:
        """
        List a tenant's sessions, the most recently active first: one LIST of the tenant's scope, no document read.

        Results and audit events carry their time in their names, so a session's last activity costs nothing; history
        turns do not (they are numbered), so a session that stored no result and asked no approval has no
        ``last_activity`` and is listed after the dated ones, by id. Reading each session's newest turn would date it,
        at one GET per session.

        :param store: The tenant's store, ``root.for_tenant(tenant)``: only that tenant's scope is listed.
        :returns: The sessions that hold a result or a document.
        :raises ValueError: If `store` is not scoped to a tenant alone.
        :raises StorageError: If the backend fails.
        """
        tenant = store.tenant
        if tenant is None or store.session is not None:
            raise ValueError("Sessions are listed per tenant: pass root.for_tenant(tenant).")
        return session_summaries(await store.find_objects_async(), tenant)

    # Results

    async def results(self, store: FsspecToolResultStore) -> list[StoredResult]:
        """
        The session's stored results, newest first.

        :param store: The session's store.
        :returns: Their records.
        """
        return await store.list_async()

    async def read_page(
        self, store: FsspecToolResultStore, reference: str, *, offset: int = 0, length: int = DEFAULT_PAGE_BYTES
    ) -> ResultPage:
        """
        Read one page of a stored result: one ranged read, cut on character boundaries for text.

        :param store: The session's store.
        :param reference: The result's reference (a client's input: the store refuses anything outside its scope).
        :param offset: First byte.
        :param length: Bytes to read, at most `MAX_PAGE_BYTES`.
        :returns: The page.
        :raises NotFoundError: If the session has no such result (refused and missing references look the same).
        :raises ValueError: If offset or length is out of range.
        """
        if offset < 0 or not 0 < length <= MAX_PAGE_BYTES:
            raise ValueError(f"offset must be >= 0 and length between 1 and {MAX_PAGE_BYTES}.")
        record = record_named(reference)
        if record is None:
            raise NotFoundError(NOT_FOUND_RESULT)
        try:
            data, total = await store.read_range_and_size_async(reference, offset, offset + length)
        except (InvalidReferenceError, ResultNotFoundError) as error:
            raise NotFoundError(NOT_FOUND_RESULT) from error
        start = offset
        if record.kind == "text":
            skipped = leading_continuations(data) if offset > 0 else 0
            data = data[skipped:]
            if start + skipped + len(data) < total:
                data = data[: complete_length(data)]
            start += skipped
        return ResultPage(
            record=record.model_copy(update={"size": total}),
            media_type=media_type_of(record),
            data=data,
            start=start,
            end=start + len(data),
            total=total,
        )

    async def stream(self, store: FsspecToolResultStore, reference: str) -> tuple[ResultPage, AsyncIterator[bytes]]:
        """
        Read a whole result as a stream of ranged reads, so a large result never sits in memory at once.

        The first chunk is read before this returns, so a missing result raises here rather than mid-stream.

        :param store: The session's store.
        :param reference: The result's reference.
        :returns: The first page (with the total size) and an iterator over every chunk, the first one included.
        :raises NotFoundError: If the session has no such result.
        """
        first = await self.read_page(store, reference, offset=0, length=STREAM_CHUNK_BYTES)

        async def chunks() -> AsyncIterator[bytes]:
            yield first.data
            position = first.end
            while position < first.total:
                chunk = await store.read_range_async(reference, position, position + STREAM_CHUNK_BYTES)
                if not chunk:
                    return
                yield chunk
                position += len(chunk)

        return first, chunks()

    # Helpers

    def _history(self, store: FsspecToolResultStore) -> SessionHistory:
        return SessionHistory(store, worker=self.worker, lease=self.turn_lease, cache=self.conversation_cache)

    async def _begin(
        self,
        history: SessionHistory,
        state: HistoryState,
        progress: TurnProgress | None,
        approvals: _ApprovalsRead | None,
        **start: Any,
    ) -> tuple[Turn, list[ChatMessage]]:
        """
        Claim the next turn (telling a watching client) and build the conversation it continues, from what the request
        read of the approvals (`approvals`; None: read if needed).
        """
        turn = await history.begin(state, **start)
        if progress is not None:
            progress.turn_started(turn.start.turn)
        return turn, await self._with_lost_steps(history.store, state, list(turn.conversation), approvals)

    def _context(
        self, store: FsspecToolResultStore, actor: str | None, progress: TurnProgress | None = None
    ) -> dict[str, Any]:
        context = offload_context(store, approval_channel=DurableApprovals(ttl=self.approval_ttl, actor=actor))
        # The steps the run holds, handed over by ApprovalHook as it records them: `_finish` need not read them back.
        context[HELD_STEPS_KEY] = []
        if progress is not None:
            context[PROGRESS_CONTEXT_KEY] = progress  # the progress hooks publish to it; without one they do nothing
        return context

    async def _refuse_while_held(self, store: FsspecToolResultStore, state: HistoryState) -> _ApprovalsRead | None:
        """Refuse a new message while a held step is open; returns what was read of the approvals (None: nothing)."""
        # Asked of the ledger: a step whose resuming turn died is still open, and a new message must not drop it. Only
        # a turn that ran to completion closes every step, so after one the ledger need not be read (no extra requests
        # on the usual path).
        if _settled(state):
            return None
        approvals = await _ApprovalsRead.of(store)
        step = await approvals.open_step()
        if step is not None:
            raise ApprovalPendingConflict(
                "This conversation waits for approval decisions: decide them (or resume, if they are decided or "
                "expired) first.",
                step.waiting,
            )
        return approvals

    async def _finish_lost_step(
        self,
        store: FsspecToolResultStore,
        approvals: _ApprovalsRead,
        actor: str | None,
        progress: TurnProgress | None = None,
    ) -> TurnOutcome:
        """
        Continue a conversation whose last resumed step ran but whose turn was lost (its worker died, or its end could
        not be written): the step's recorded messages go back into the conversation and the model answers them.
        """
        history = self._history(store)
        state = await history.read()
        lost = await self._with_lost_steps(store, state, list(state.conversation), approvals)
        if _settled(state) or lost == state.conversation:
            raise NothingToResumeError("Nothing waits for approval in this session.")
        turn, conversation = await self._begin(history, state, progress, approvals, kind="resume", actor=actor)
        context = self._context(store, actor, progress)
        try:
            async with history.renewing(turn):
                reply = await continuing_agent(self.agent).run_async(
                    messages=conversation,
                    streaming_callback=progress.on_chunk if progress is not None else None,
                    hook_context=context,
                )
        except Exception as error:
            await self._fail(history, turn, error, messages=conversation)
            raise RunFailedError(f"The agent failed to continue: {type(error).__name__}.") from error
        return await self._finish(history, turn, store, reply, context, before=turn.conversation, progress=progress)

    async def _decided_step_open(self, approvals: _ApprovalsRead, decision: ApprovalDecision | None) -> bool:
        """Whether the decision's held step is the session's open one (so a repeat of the decision may continue it)."""
        if decision is None:
            return False
        step = await approvals.open_step()
        return step is not None and step.sequence == sequence_of(decision.step_id)

    async def _resumed_elsewhere(self, store: FsspecToolResultStore) -> bool:
        step = await open_step_async(store)
        if step is None:
            return True  # the step was finished, by another worker's resume
        return step.resuming_until is not None

    async def _with_lost_steps(
        self,
        store: FsspecToolResultStore,
        state: HistoryState,
        conversation: list[ChatMessage],
        approvals: _ApprovalsRead | None,
    ) -> list[ChatMessage]:
        """
        Add what the newest resumed step recorded, if its turn was lost (abandoned, or its end never written).

        The calls ran and their results are recorded in the step's done record, so the model learns that they ran.
        What the request read of the approvals (`approvals`) is not read again; None: read here.
        """
        if _settled(state):
            return conversation
        if approvals is None:
            done = await newest_done_async(store)
        else:
            done = await newest_done_in_async(approvals.ledger, approvals.snapshot)
        if done is None:
            return conversation
        answered = {m.tool_call_result.origin.id for m in conversation if m.tool_call_result is not None}
        added = [ChatMessage.from_dict(message) for message in done.messages]
        results = {m.tool_call_result.origin.id for m in added if m.tool_call_result is not None}
        if not results or results & answered:
            return conversation
        return [*conversation, *added]

    async def _finish(
        self,
        history: SessionHistory,
        turn: Turn,
        store: FsspecToolResultStore,
        reply: dict[str, Any],
        context: dict[str, Any],
        *,
        before: list[ChatMessage],
        progress: TurnProgress | None = None,
    ) -> TurnOutcome:
        messages: list[ChatMessage] = list(reply["messages"])
        pending: list[ApprovalRequest] = []
        exit_reason = reply.get("exit_reason")
        held_steps: list[HeldStep] = context.get(HELD_STEPS_KEY) or []
        if exit_reason != "text":
            # The Agent reports max_agent_steps instead when the held step was its last: the ledger is the check,
            # unless the run held the step itself. Then its requests are what waits: just recorded under the turn this
            # request claimed, so none is decided yet (their ids were nowhere else), and they are in the audit.
            pending = _waiting_of(held_steps[-1]) if held_steps else await pending_approvals_async(store)
        if progress is not None:
            # The run stopped for these: told from the ledger's records, which name the tool and the arguments.
            for request in pending:
                progress.publish(
                    "approval_requested",
                    request_id=request.request_id,
                    tool_call_id=request.tool_call_id,
                    tool_name=request.tool_name,
                    arguments=summarize_arguments(request.arguments),
                )
        held = exit_reason == APPROVAL_REQUIRED or bool(pending)
        status: TurnStatus = "approval_required" if held else "completed"
        last = reply.get("last_message")
        text = None if held or last is None else last.text
        await history.finish(turn, status=status, messages=messages, reply=text)
        metrics.turn_ended(_TURN_METRIC_STATUSES[status], _seconds_since(turn), tenant=store.tenant)
        logger.info(
            "Turn %s of %s/%s: %s (%s pending).",
            turn.start.turn,
            store.tenant,
            store.session,
            status,
            len(pending),
        )
        return TurnOutcome(
            turn=turn.start.turn,
            status=status,
            reply=text,
            pending=pending,
            new_references=sorted(_references(messages) - _references(before)),
            approval_outcomes=list(reply.get(OUTCOMES_KEY) or []),
            messages=messages,
        )

    async def _fail(
        self, history: SessionHistory, turn: Turn, error: BaseException, *, messages: list[ChatMessage] | None
    ) -> None:
        logger.warning("Turn %s failed: %s", turn.start.turn, error, exc_info=error)
        try:
            await history.finish(
                turn, status="failed", messages=messages, error=f"{type(error).__name__}: {error}"[:500]
            )
        except Exception:  # the original failure is what the caller needs to hear about
            logger.exception("Could not record the failure of turn %s.", turn.start.turn)
        metrics.turn_ended("failed", _seconds_since(turn), tenant=history.store.tenant)


def _seconds_since(turn: Turn) -> float:
    return max(0.0, (datetime.now(UTC) - turn.start.started_at).total_seconds())


def _waiting_of(step: HeldStep) -> list[ApprovalRequest]:
    """The requests of a step this request just held that wait: all but any already expired."""
    at = datetime.now(UTC)
    return [request for request in step.requests() if not request.expired(at)]


def _settled(state: HistoryState) -> bool:
    """Whether the newest turn ran to completion: then no held step is open and no resumed step's turn was lost."""
    return state.open_start is None and (state.last_end is None or state.last_end.status == "completed")


def _references(messages: list[ChatMessage]) -> set[str]:
    found: set[str] = set()
    for message in messages:
        found.update(message.meta.get(OFFLOADED_META_KEY) or [])
    return found
