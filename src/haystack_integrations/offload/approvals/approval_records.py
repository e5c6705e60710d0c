"""
Validated records of the approval flow: what a run asks, what a person decides, what a worker claims and runs.

Every record is a frozen pydantic model that refuses unknown fields; times are timezone-aware UTC. The checks that bind
a decision to exactly one call, and the checks of edited arguments, live beside the records they read.
"""

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from haystack.dataclasses import ChatMessage, ToolCall

# jsonschema ships no type information (Haystack depends on it to check tool schemas; so do we, for edits).
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from haystack_integrations.offload.approvals.errors import InvalidApprovalEditError
from haystack_integrations.offload.stores.documents import writer_token

ErrorKind = Literal["approval-denied", "approval-expired", "approval-invalid"]
"""The machine-readable kinds of error result a model receives for a call that did not run."""

APPROVAL_DENIED: ErrorKind = "approval-denied"
APPROVAL_EXPIRED: ErrorKind = "approval-expired"
APPROVAL_INVALID: ErrorKind = "approval-invalid"

CallAction = Literal["run", "ask", "deny"]

Verdict = Literal["approved", "edited", "rejected"]
"""A decision's verdict as the approval metrics count it."""

MAY_HAVE_RUN_GUARD = "may-have-run"
"""The guard of requests `resume` makes itself: a call whose worker stopped mid-call; approving it retries the call."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Denial(_Record):
    """Why a call does not run: the kind the model sees and a sentence saying why."""

    kind: ErrorKind
    reason: str
    feedback: str | None = Field(default=None, description="A person's own words with a denial, if any.")


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
    guard: str = Field(
        default="approval",
        description="The `ApprovalHook` that asks (its name), or 'may-have-run' for a call whose worker stopped.",
    )
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


def verdict_for(approved: bool, edited: bool) -> Verdict:
    """A decision's verdict: rejected, approved as asked, or approved with edited arguments."""
    if not approved:
        return "rejected"
    return "edited" if edited else "approved"


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
    token: str = Field(default_factory=writer_token, description="Unique to this decision's writer.")

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

    @classmethod
    def of(
        cls, position: int, call: ToolCall, digest: str, request: ApprovalRequest | None, denial: Denial | None = None
    ) -> "HeldCall":
        """
        The held record of the call at `position`: asked about with `request`, denied with `denial`, else run.

        :param position: The call's index among the message's tool calls.
        :param call: The call.
        :param digest: The digest of its arguments.
        :param request: Its approval request, if it waits for one.
        :param denial: Why it does not run, if it is denied in place.
        :returns: The record.
        """
        action: CallAction = "ask" if request is not None else ("deny" if denial is not None else "run")
        return cls(
            position=position,
            tool_call_id=call.id,
            tool_name=call.tool_name,
            arguments_digest=digest,
            action=action,
            request=request,
            denial=denial,
        )

    @model_validator(mode="after")
    def _action_has_its_details(self) -> "HeldCall":
        if (self.action == "ask") != (self.request is not None):
            raise ValueError("A held call has a request exactly when its action is 'ask'.")
        if (self.action == "deny") != (self.denial is not None):
            raise ValueError("A held call has a denial exactly when its action is 'deny'.")
        return self


class HeldStep(_Record):
    """One assistant message whose tool calls wait for one guard's decisions, kept whole so resuming loses nothing."""

    step_id: str
    sequence: int = Field(ge=1, description="The step's number in its session, claimed with a conditional create.")
    tenant: str
    session: str
    guard: str = Field(default="approval", description="The hook (or 'may-have-run') whose requests the step holds.")
    continues: str | None = Field(
        default=None, description="The step whose resumption held this one: its decisions still apply."
    )
    created: AwareDatetime
    requested_by: str | None = None
    message: dict[str, Any] = Field(description="The assistant message, as `ChatMessage.to_dict()`.")
    calls: list[HeldCall]
    state: dict[str, Any] | None = Field(
        default=None, description="The run's own state values when it stopped (`State.to_dict`), for the resumed run."
    )
    preceding: list[dict[str, Any]] = Field(
        default_factory=list,
        description="What the resume that held this step again added before the message (answers to other calls), "
        "kept here so that losing that resume's turn cannot lose them.",
    )
    token: str = Field(default_factory=writer_token)

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


class StepClaim(_Record):
    """The worker resuming a held step, until its lease passes (renewed while it works)."""

    step_id: str
    tenant: str
    session: str
    attempt: int = Field(ge=1, description="1 for the first claim; a takeover after a lapsed lease claims the next.")
    claimed_by: str
    claimed_at: AwareDatetime
    lease_until: AwareDatetime
    token: str = Field(default_factory=writer_token)


class ExecutionClaim(_Record):
    """The one worker running one call (one try of it), with the idempotency key the tool receives."""

    call_key: str
    step_id: str
    tenant: str
    session: str
    tool_call_id: str | None
    tool_name: str
    arguments_digest: str = Field(description="Digest of the arguments the call runs with.")
    attempt: int = Field(default=1, ge=1, description="1 for the first try; an explicit retry claims the next.")
    idempotency_key: str = Field(description="The same for every try of the call: pass it on to side effects.")
    claimed_by: str
    claimed_at: AwareDatetime
    token: str = Field(default_factory=writer_token)


class UnrunClaim(_Record):
    """A try whose claim's create failed: the call did not run under it, even if the claim landed."""

    call_key: str
    attempt: int = Field(ge=1)
    token: str = Field(description="The token of the claim that was not used.")
    noted_by: str
    noted_at: AwareDatetime


class CallRecord(_Record):
    """What one call produced, recorded as soon as it returned, so no later failure can lose it."""

    call_key: str
    step_id: str
    attempt: int = Field(ge=1)
    result: dict[str, Any] = Field(description="The tool message, as `ChatMessage.to_dict()`.")
    recorded_by: str
    recorded_at: AwareDatetime


class StepDone(_Record):
    """A resumed step's end: the messages it added to the conversation, so a turn that was lost can recover them."""

    step_id: str
    messages: list[dict[str, Any]] = Field(description="What the step added (`ChatMessage.to_dict()`), in order.")
    held_again: str | None = Field(default=None, description="The step held while resuming this one, if any.")
    finished_by: str
    finished_at: AwareDatetime


class ApprovalHead(_Record):
    """
    Where a session's held steps end, so that finding the open one reads no step before it.

    A hint, never the truth: written (a plain write) after a step's conditional create has claimed its number, so it
    may lag behind when a write failed or two holds raced; readers go on to the next numbers until one is missing.
    """

    sequence: int = Field(ge=1, description="A held step's number: no step before it is the session's newest.")


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
    outcome: Literal["executed", "recorded", "denied", "expired", "invalid", "may-have-run", "not-run"] = Field(
        description="'executed': ran now; 'recorded': ran earlier, its recorded result was used; 'may-have-run': its "
        "worker stopped mid-call, a person decides whether to retry it; 'not-run': another hook kept it from running."
    )
    request_id: str | None = None
    arguments_digest: str | None = Field(default=None, description="Digest of the arguments it ran with.")
    idempotency_key: str | None = Field(default=None, description="The key the call ran with (calls that ran).")
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


# What ties a decision to exactly one call: the same tenant and session, request, tool call id, tool name and arguments
# digest, and only until it expires. A decision copied from another session, replayed or naming another tool never
# runs a call, whatever its document says.


def arguments_digest(arguments: Mapping[str, Any]) -> str:
    """
    Return ``sha256:<hex>`` of the canonical JSON of `arguments` (sorted keys, no spaces, UTF-8).

    :param arguments: Tool-call arguments, as the model sent them (JSON values).
    :returns: The digest.
    :raises TypeError: If the arguments are not JSON values.
    """
    canonical = json.dumps(dict(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def binding_problem(
    decision: ApprovalDecision, request: ApprovalRequest, *, tenant: str, session: str, now: datetime
) -> Denial | None:
    """
    Check that `decision` may let `request`'s call run in the session `tenant`/`session` at `now`.

    :param decision: The stored decision.
    :param request: The request it claims to answer, from the held step.
    :param tenant: The tenant of the store resuming the step.
    :param session: The session of the store resuming the step.
    :param now: The current time.
    :returns: None if the decision binds; otherwise the denial the model gets instead of a result.
    """
    if (decision.tenant, decision.session) != (tenant, session) or (request.tenant, request.session) != (
        tenant,
        session,
    ):
        return Denial(kind=APPROVAL_INVALID, reason="The decision was made for another tenant or session.")
    expected = (request.request_id, request.step_id, request.tool_call_id, request.arguments_digest)
    if (decision.request_id, decision.step_id, decision.tool_call_id, decision.arguments_digest) != expected:
        return Denial(kind=APPROVAL_INVALID, reason="The decision does not match this tool call or its arguments.")
    if decision.tool_name != request.tool_name:
        return Denial(kind=APPROVAL_INVALID, reason="The decision names another tool; a tool name never changes.")
    if decision.approved and (
        decision.arguments is None or decision.final_arguments_digest != arguments_digest(decision.arguments)
    ):
        return Denial(kind=APPROVAL_INVALID, reason="The approved arguments do not match their digest.")
    if decision.expired(now):
        return Denial(kind=APPROVAL_EXPIRED, reason="The approval expired before the call was resumed.")
    return None


# Whether a decision's edited arguments are acceptable: same tool, valid against the tool's parameter schema.

_MAX_LISTED_ERRORS = 5


def check_tool_name(claimed: str | None, tool_name: str) -> None:
    """
    Refuse a decision that names another tool: an approval can change arguments, never the tool.

    :param claimed: The tool name the decision carries, if any.
    :param tool_name: The tool the request is about.
    :raises InvalidApprovalEditError: If `claimed` is set and differs.
    """
    if claimed is not None and claimed != tool_name:
        raise InvalidApprovalEditError(
            f"This request is for tool {tool_name!r}; a decision cannot change it to {claimed!r}."
        )


def validated_arguments(tool_name: str, parameters: dict[str, Any], arguments: object) -> dict[str, Any]:
    """
    Validate edited arguments against the tool's JSON schema (`Tool.parameters`, draft 2020-12 as Haystack uses).

    :param tool_name: The tool, for messages.
    :param parameters: The tool's parameter schema.
    :param arguments: The edited arguments.
    :returns: The arguments, as a new dictionary.
    :raises InvalidApprovalEditError: If they are not a JSON object with string keys, or fail the schema; the message
        lists the first few problems with their paths.
    """
    if not isinstance(arguments, dict) or not all(isinstance(key, str) for key in arguments):
        raise InvalidApprovalEditError(
            f"Edited arguments for {tool_name!r} must be an object with string keys, got {type(arguments).__name__}."
        )
    try:
        validator = Draft202012Validator(parameters)
        errors = sorted(validator.iter_errors(arguments), key=lambda error: list(error.absolute_path))
    except SchemaError as error:  # pragma: no cover - Haystack's Tool refuses invalid schemas at construction
        raise InvalidApprovalEditError(
            f"The parameter schema of {tool_name!r} is not valid: {error.message}"
        ) from error
    if errors:
        problems = "; ".join(
            f"{'/'.join(str(part) for part in error.absolute_path) or '(arguments)'}: {error.message}"
            for error in errors[:_MAX_LISTED_ERRORS]
        )
        more = f" (and {len(errors) - _MAX_LISTED_ERRORS} more)" if len(errors) > _MAX_LISTED_ERRORS else ""
        raise InvalidApprovalEditError(f"Edited arguments for {tool_name!r} are not valid: {problems}{more}.")
    return dict(arguments)


def approved_arguments(request: ApprovalRequest, decision: Decision) -> tuple[dict[str, Any], bool]:
    """
    The arguments an approval lets the call run with, checked against the request.

    :param request: The request decided.
    :param decision: The decision (an approval; a denial is only checked for its tool name).
    :returns: ``(arguments, edited)``.
    :raises InvalidApprovalEditError: If the decision names another tool or its edited arguments are not valid.
    """
    check_tool_name(decision.tool_name, request.tool_name)
    if decision.arguments is None:
        return dict(request.arguments), False
    arguments = validated_arguments(request.tool_name, request.parameters, decision.arguments)
    return arguments, arguments != request.arguments
