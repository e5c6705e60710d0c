"""What `ChatService` answers with: turn and decision outcomes, a transcript, session summaries, result pages."""

import mimetypes
from dataclasses import dataclass, field
from datetime import UTC, datetime

from haystack.dataclasses import ChatMessage

from haystack_integrations.offload.approvals import ApprovalDecision, ApprovalRequest, CallOutcome
from haystack_integrations.offload.operations.inventory import classify
from haystack_integrations.offload.sessions.history import NAMESPACE, TURN_DOCUMENT, TurnStatus
from haystack_integrations.offload.stores import StoredResult
from haystack_integrations.offload.stores.names import parse_object_name
from haystack_integrations.offload.stores.retention import name_time


@dataclass
class TurnOutcome:
    """What one turn produced."""

    turn: int
    status: TurnStatus
    reply: str | None
    pending: list[ApprovalRequest] = field(default_factory=list)
    new_references: list[str] = field(default_factory=list)
    """Results written during the turn (offloaded or compacted), as references in the session's store."""
    approval_outcomes: list[CallOutcome] = field(default_factory=list)
    """For resume turns: what happened to each call of the held step."""
    messages: list[ChatMessage] = field(default_factory=list)
    """The whole conversation after the turn."""


@dataclass
class DecisionOutcome:
    """What a decision led to: still waiting for others, resumed here, or resumed by a concurrent request."""

    decision: ApprovalDecision
    pending: list[ApprovalRequest]
    resumed: TurnOutcome | None
    resumed_elsewhere: bool = False


@dataclass
class Transcript:
    """A session's conversation as stored, and the state of its newest turn."""

    messages: list[ChatMessage]
    turns: int
    busy: bool
    status: TurnStatus | None
    """How the newest turn ended (``abandoned`` also for one whose lease passed with no end); None before any."""
    error: str | None
    resumable: bool = False
    """
    Whether `resume` continues the conversation: a held step is decided but not run, and no worker is resuming it (its
    resume failed, or the decision's answer did before it began); or a resumed step ran and its turn was lost.
    """


@dataclass
class SessionSummary:
    """One of a tenant's sessions, as a listing of the tenant's scope tells it (no document is read)."""

    session: str
    last_activity: datetime | None = None
    """The newest time the session's object names carry (results, approval audit events); None if none carries one."""
    turns: int = 0
    """Turns begun in the session's history."""
    results: int = 0
    """Results stored in the session."""


@dataclass
class ResultPage:
    """Bytes of one stored result, cut on UTF-8 character boundaries for text."""

    record: StoredResult
    media_type: str
    data: bytes
    start: int
    end: int
    total: int

    @property
    def next_offset(self) -> int | None:
        """Where the next page starts, or None at the end."""
        return self.end if self.end < self.total else None


def session_summaries(found: dict[str, int], tenant: str) -> list[SessionSummary]:
    """
    A tenant's sessions from a listing of its scope (`FsspecToolResultStore.find_objects`), newest activity first.

    :param found: The tenant's objects, by path relative to it.
    :param tenant: The tenant.
    :returns: A summary per session holding results or documents; the undated ones last, by name.
    """
    summaries: dict[str, SessionSummary] = {}
    for path in found:
        item = classify(f"{tenant}/{path}", 0)
        if item.session is None or item.kind not in ("result", "document"):
            continue  # temporary files and objects this library did not write make no session
        summary = summaries.setdefault(item.session, SessionSummary(session=item.session))
        name = path.rsplit("/", 1)[-1]
        moment = item.created
        if item.kind == "result":
            summary.results += 1
        elif item.namespace == NAMESPACE:
            turn = TURN_DOCUMENT.fullmatch(name)
            summary.turns = max(summary.turns, int(turn["turn"]) if turn else 0)
        else:
            moment = name_time(name)
        if moment is not None and (summary.last_activity is None or moment > summary.last_activity):
            summary.last_activity = moment
    dated = sorted((s for s in summaries.values() if s.last_activity is not None), key=_activity, reverse=True)
    undated = sorted((s for s in summaries.values() if s.last_activity is None), key=lambda s: s.session)
    return dated + undated


def _activity(summary: SessionSummary) -> tuple[datetime, str]:
    return (summary.last_activity or datetime.min.replace(tzinfo=UTC), summary.session)


def record_named(reference: str) -> StoredResult | None:
    """
    A result's record from its reference alone (no request; its size is unknown, so 0).

    :param reference: A reference in the session's store (a client's input: anything else names no record).
    :returns: The record, or None if `reference` is not the name of a stored result.
    """
    parsed = parse_object_name(reference) if isinstance(reference, str) and "/" not in reference else None
    if parsed is None:
        return None
    return StoredResult(
        reference=reference,
        kind=parsed.kind,
        size=0,
        created=parsed.created,
        tool_name=parsed.tool_name,
        key=parsed.key,
    )


def media_type_of(record: StoredResult) -> str:
    """
    The media type to serve a stored result with, from its key's extension and kind.

    :param record: The result's record.
    :returns: ``text/plain; charset=utf-8`` for text, the guessed type (or ``application/octet-stream``) for bytes.
    """
    if record.kind == "text":
        return "text/plain; charset=utf-8"
    guessed, _ = mimetypes.guess_type(record.key)
    return guessed or "application/octet-stream"
