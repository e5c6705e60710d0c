"""The documents a session's history is made of (turn starts and ends, the head), and how they are stored and read."""

from typing import Any, Literal, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from haystack_integrations.offload.sessions.errors import HistoryRecordError
from haystack_integrations.offload.stores.compact_documents import compress_document, decompress_document
from haystack_integrations.offload.stores.documents import writer_token

TurnKind = Literal["message", "resume"]
TurnStatus = Literal["completed", "approval_required", "failed", "abandoned"]
TurnBase = Literal["checkpoint", "segment", "append"]

RecordT = TypeVar("RecordT", bound=BaseModel)


class HistoryRecord(BaseModel):
    """A history document: frozen, and refusing fields it does not know."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def json_form(self) -> bytes:
        """The document's JSON, without the fields at their defaults (a reader fills them in again)."""
        return self.model_dump_json(exclude_defaults=True).encode()

    def encoded(self) -> bytes:
        """The document as stored: its JSON, gzipped where that is smaller."""
        return compress_document(self.json_form())


class TurnStart(HistoryRecord):
    """The claim on one turn: created once, by the request that runs the turn."""

    turn: int = Field(ge=1)
    kind: TurnKind
    text: str | None = Field(default=None, description="The user's message, for message turns.")
    actor: str | None = None
    worker: str
    started_at: AwareDatetime
    lease_until: AwareDatetime
    token: str = Field(default_factory=writer_token, description="Unique to this claim: tells our create from another.")


class TurnEnd(HistoryRecord):
    """How one turn ended: created once, by the request that ran it (or by a later one, as ``abandoned``)."""

    turn: int = Field(ge=1)
    status: TurnStatus
    base: TurnBase = Field(
        description='What `messages` holds: "checkpoint", the whole conversation after the turn; "segment", every '
        'message after the checkpoint\'s; "append", only the messages this turn added.'
    )
    messages: list[dict[str, Any]] | None = Field(
        default=None, description="ChatMessage.to_dict of the messages, as `base` says; None: conversation unchanged."
    )
    checkpoint: int = Field(
        ge=0,
        description="The turn whose checkpoint the conversation after this turn builds on (this turn's, for a "
        "checkpoint; 0: none yet).",
    )
    segment: int = Field(
        default=0,
        ge=0,
        description="The turn whose segment the conversation after this turn builds on (0: none since the checkpoint).",
    )
    reply: str | None = None  # None after a completed turn: the conversation's last message's text (see `finish`)
    error: str | None = None
    worker: str
    ended_at: AwareDatetime
    token: str = Field(default_factory=writer_token, description="Unique to this end: tells our create from another.")


class HistoryHead(HistoryRecord):
    """Where a session's newest checkpoint and segment are, rewritten with each: a cold read starts here, not a LIST."""

    checkpoint: int = Field(ge=1)
    segment: int = Field(default=0, ge=0)
    token: str = Field(description="The token of the newest of those ends: tells this session from a purged one's.")


def parse_record(name: str, data: bytes, model: type[RecordT]) -> RecordT:
    """A stored document's record; `HistoryRecordError` if it is not one."""
    return parse_sized(name, data, model)[0]


def parse_sized(name: str, data: bytes, model: type[RecordT]) -> tuple[RecordT, int]:
    """A stored document's record, and the size of its JSON."""
    try:
        document = decompress_document(data)
        return model.model_validate_json(document), len(document)
    except (ValidationError, ValueError) as error:
        raise HistoryRecordError(f"The history document {name!r} is not a valid {model.__name__}.") from error
