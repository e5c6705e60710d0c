"""
Validated records of the approval flow: what a run asks, what a person decides, what a worker claims and runs.

Every record is a frozen pydantic model that refuses unknown fields, so a document read back from the store is either
exactly what was written or a clear error, never a half-understood dictionary. Times are timezone-aware UTC.

How they relate, for one held step (one assistant message whose tool calls wait for decisions)::

    HeldStep            step.<step_id>.json          the assistant message and, per tool call, what to do with it
    └── HeldCall        (inside the step)            "run" / "ask" / "deny", in the model's order
        └── ApprovalRequest                          tenant, session, tool call id, tool, arguments and their digest,
                                                     the tool's parameter schema, created, expires
    ApprovalDecision    decision.<request_id>.json   approve / deny / approve with edited arguments, bound to the
                                                     request (tenant, session, call id, tool, digest), expires
    ExecutionClaim      claim.<call_key>.json        who ran a call, created once (conditional create)
    StepClaim           resume.<step_id>.json        who resumed the step, created once (conditional create)
    RememberedApproval  memory.<key>.json            "ask once per session": an approval remembered until it expires
    AuditEvent          (namespace "audit")          one event: who, when, what
"""

from datetime import datetime
from typing import Any, Literal

from haystack.dataclasses import ChatMessage
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

ErrorKind = Literal["approval-denied", "approval-expired", "approval-invalid"]
"""The machine-readable kinds of error result a model receives for a call that did not run."""

APPROVAL_DENIED: ErrorKind = "approval-denied"
APPROVAL_EXPIRED: ErrorKind = "approval-expired"
APPROVAL_INVALID: ErrorKind = "approval-invalid"

CallAction = Literal["run", "ask", "deny"]


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Denial(_Record):
    """Why a call does not run: the kind the model sees and a sentence saying why."""

    kind: ErrorKind
    reason: str


class RememberApproval(_Record):
    """How an approval of this request is remembered for the rest of the session (`AskOncePerSession`)."""

    per_arguments: bool = Field(description="Remember the approval for these exact arguments only.")
    ttl_seconds: float = Field(ge=0, description="How long the approval is remembered.")


class ApprovalRequest(_Record):
    """
    One tool call waiting for a person's decision.

    Stored inside its `HeldStep` (durable channel) or passed to the callback (in-process channel).
    """

    request_id: str = Field(description="Unique within the session; pass it to `decide`.")
    step_id: str = Field(description="The held step (assistant message) the call belongs to.")
    tenant: str | None = Field(description="The tenant of the run's store; None only in runs without a store.")
    session: str | None = Field(description="The session of the run's store; None only in runs without a store.")
    position: int = Field(ge=0, description="The call's index among the message's tool calls.")
    tool_call_id: str | None = Field(description="The model's id for the call (always set on durable requests).")
    tool_name: str
    tool_description: str = ""
    arguments: dict[str, Any] = Field(description="The arguments the model asked for.")
    arguments_digest: str = Field(description="sha256 of the canonical JSON of `arguments`.")
    parameters: dict[str, Any] = Field(description="The tool's JSON schema when asked; edits are validated against it.")
    rule: str = Field(description="The rule that asked for approval, for display.")
    requested_by: str | None = Field(default=None, description="Who the run acts for (the channel's actor).")
    created: AwareDatetime
    expires: AwareDatetime
    remember: RememberApproval | None = Field(default=None, description="Set when the rule is AskOncePerSession.")

    def expired(self, now: datetime) -> bool:
        """Whether the request can no longer be decided at `now`."""
        return now >= self.expires


class Decision(_Record):
    """
    A person's answer to one request: approve (optionally with edited arguments) or deny with a reason.

    Returned by an in-process callback, or passed to `decide` for a durable request::

        Decision.approve()                                   # run the call as the model asked
        Decision.approve(arguments={"amount": 50})           # run it with edited, re-validated arguments
        Decision.deny("Invoices over 100 need a manager.")   # the model gets an `approval-denied` error result
    """

    approved: bool
    arguments: dict[str, Any] | None = Field(default=None, description="Edited arguments (approvals only).")
    reason: str | None = Field(default=None, description="Shown to the model with a denial; kept in the audit.")
    decided_by: str | None = Field(default=None, description="Who decided, for the audit.")
    tool_name: str | None = Field(
        default=None, description="The tool the decider believes it approves; must match the request's tool."
    )

    @model_validator(mode="after")
    def _denials_carry_no_arguments(self) -> "Decision":
        if not self.approved and self.arguments is not None:
            raise ValueError("A denial carries no arguments: deny, or approve with edited arguments.")
        return self

    @classmethod
    def approve(
        cls,
        arguments: dict[str, Any] | None = None,
        *,
        by: str | None = None,
        reason: str | None = None,
        tool_name: str | None = None,
    ) -> "Decision":
        """
        Approve the call, as asked or with edited `arguments`.

        :param arguments: Replacement arguments; they are validated against the tool's parameter schema.
        :param by: Who approved.
        :param reason: An optional note for the audit.
        :param tool_name: The tool the approver saw; a mismatch with the request is refused.
        :returns: The decision.
        """
        return cls(approved=True, arguments=arguments, decided_by=by, reason=reason, tool_name=tool_name)

    @classmethod
    def deny(cls, reason: str | None = None, *, by: str | None = None) -> "Decision":
        """
        Deny the call.

        :param reason: Why; the model sees it in the `approval-denied` error result.
        :param by: Who denied.
        :returns: The decision.
        """
        return cls(approved=False, reason=reason, decided_by=by)


class ApprovalDecision(_Record):
    """A recorded decision, bound to exactly one request of one session; created once, never overwritten."""

    request_id: str
    step_id: str
    tenant: str
    session: str
    tool_call_id: str
    tool_name: str
    arguments_digest: str = Field(description="Digest of the arguments the request asked about (the binding).")
    approved: bool
    arguments: dict[str, Any] | None = Field(default=None, description="The arguments to run with (approvals only).")
    final_arguments_digest: str | None = None
    edited: bool = False
    reason: str | None = None
    decided_by: str | None = None
    decided_at: AwareDatetime
    expires: AwareDatetime = Field(description="After this, the approval no longer lets the call run.")

    def expired(self, now: datetime) -> bool:
        """Whether the decision can no longer be used at `now`."""
        return now >= self.expires


class HeldCall(_Record):
    """What resuming does with one tool call of a held step."""

    position: int = Field(ge=0)
    tool_call_id: str | None
    tool_name: str
    arguments_digest: str
    action: CallAction = Field(description="'run': no approval needed; 'ask': see `request`; 'deny': see `denial`.")
    request: ApprovalRequest | None = None
    denial: Denial | None = None

    @model_validator(mode="after")
    def _action_has_its_details(self) -> "HeldCall":
        if (self.action == "ask") != (self.request is not None):
            raise ValueError("A held call has a request exactly when its action is 'ask'.")
        if (self.action == "deny") != (self.denial is not None):
            raise ValueError("A held call has a denial exactly when its action is 'deny'.")
        return self


class HeldStep(_Record):
    """One assistant message whose tool calls wait for decisions, kept whole so resuming loses nothing."""

    step_id: str
    tenant: str
    session: str
    created: AwareDatetime
    requested_by: str | None = None
    message: dict[str, Any] = Field(description="The assistant message, as `ChatMessage.to_dict()`.")
    calls: list[HeldCall]

    @model_validator(mode="after")
    def _calls_match_the_message(self) -> "HeldStep":
        tool_calls = self.chat_message().tool_calls
        if [call.position for call in self.calls] != list(range(len(tool_calls))):
            raise ValueError("A held step has one held call per tool call of its message, in order.")
        for held, tool_call in zip(self.calls, tool_calls, strict=True):
            if (held.tool_call_id, held.tool_name) != (tool_call.id, tool_call.tool_name):
                raise ValueError(f"Held call {held.position} does not match the message's tool call.")
        return self

    def chat_message(self) -> ChatMessage:
        """The held assistant message."""
        return ChatMessage.from_dict(self.message)

    def requests(self) -> list[ApprovalRequest]:
        """The step's approval requests, in the model's order."""
        return [call.request for call in self.calls if call.request is not None]

    def call_key_of(self, call: HeldCall) -> str:
        """The name under which `call`'s execution is claimed: its request id, or the step id and its position."""
        return call.request.request_id if call.request is not None else f"{self.step_id}-{call.position}"


class StepClaim(_Record):
    """The one worker that resumed a held step."""

    step_id: str
    tenant: str
    session: str
    claimed_by: str
    claimed_at: AwareDatetime


class ExecutionClaim(_Record):
    """The one worker that ran one call of a held step, and with which arguments."""

    call_key: str
    step_id: str
    tenant: str
    session: str
    tool_call_id: str | None
    tool_name: str
    arguments_digest: str = Field(description="Digest of the arguments the call ran with.")
    request_id: str | None = None
    claimed_by: str
    claimed_at: AwareDatetime


class RememberedApproval(_Record):
    """An approval remembered for the session by `AskOncePerSession`, until `expires`."""

    tool_name: str
    arguments_digest: str | None = Field(description="Set when the approval covers these arguments only.")
    decided_by: str | None = None
    approved_at: AwareDatetime
    expires: AwareDatetime


class CallOutcome(_Record):
    """What resuming did with one call of the held step (returned under ``approval_outcomes``)."""

    position: int
    tool_call_id: str | None
    tool_name: str
    outcome: Literal["executed", "denied", "expired", "invalid"]
    request_id: str | None = None
    arguments_digest: str | None = Field(default=None, description="Digest of the arguments it ran with.")
    reason: str | None = None


class AuditEvent(_Record):
    """One entry of a session's audit record: who did what, when, to which call."""

    at: AwareDatetime
    event: str = Field(description="e.g. 'approval.requested', 'approval.decided', 'approval.executed'.")
    actor: str | None = Field(description="Who: the decider, the worker, or the user the run acts for.")
    tenant: str | None
    session: str | None
    step_id: str | None = None
    request_id: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    arguments_digest: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)
