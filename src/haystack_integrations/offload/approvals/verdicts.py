"""
The verdicts a resumed step hands to the ``before_tool`` hooks it runs again: the decisions already made for its calls.

Resuming re-enters the Agent's step at ``before_tool`` with the held message, so every hook of the chain runs again
and is obeyed: guardrails, Haystack ``@hook``s and every `ApprovalHook`. An `ApprovalHook` finds here the decisions
made for *its* requests (by its guard name) on the held message, and any earlier step that held the same message, and
applies them as the in-process channel applies an answer; a call it guards with no decision yet is held again, as a new
step that continues this one.
"""

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from haystack.dataclasses import ChatMessage, ToolCall

from haystack_integrations.offload.approvals.approval_records import (
    ApprovalDecision,
    ApprovalRequest,
    Decision,
    Denial,
    HeldStep,
)
from haystack_integrations.offload.approvals.binding import arguments_digest, binding_problem
from haystack_integrations.offload.approvals.outcomes import denied_by_person, expired

# The key is defined with the rest of what a run's hook_context holds; it stays importable from here.
from haystack_integrations.offload.context import RESUMING_KEY as RESUMING_KEY


@dataclass(frozen=True)
class Verdict:
    """What a decision means for one call: run it (with these arguments), or answer it with a denial."""

    request: ApprovalRequest
    arguments: dict[str, Any] | None = None
    denial: Denial | None = None
    decided_by: str | None = None
    by_person: bool = False
    """Whether a person's decision is behind the verdict (not an expiry or a refused binding)."""

    def decision(self) -> Decision | None:
        """The person's answer this verdict carries, for policies that learn (None when no person answered)."""
        if not self.by_person:
            return None
        if self.denial is None:
            return Decision.approve(self.arguments, by=self.decided_by)
        return Decision.deny(self.denial.feedback, by=self.decided_by)


@dataclass(frozen=True)
class ResumedDecisions:
    """
    The decided requests of a resumed step and of the steps it continues, by guard and tool call id.

    :param step: The step being resumed.
    :param first_step_id: The step that first held its message (calls keep their claim keys from it).
    :param verdicts: ``(guard, tool call id) -> Verdict``.
    :param state: The run's state values recorded when the first step held.
    :param before: How many messages of the resumed conversation come before the held message.
    """

    step: HeldStep
    first_step_id: str
    verdicts: dict[tuple[str, str], Verdict] = field(default_factory=dict)
    state: dict[str, Any] | None = None
    before: int = 0
    """How many messages of the resumed conversation come before the held message."""

    def preceding(self, messages: list[ChatMessage]) -> list[dict[str, Any]]:
        """What this resume added before the pending message, to keep with a step that holds it again."""
        return [message.to_dict() for message in messages[self.before : -1]]

    def verdict(self, guard: str, call: ToolCall) -> Verdict | None:
        """
        The verdict of `guard` on `call`, if it has decided (or its request expired).

        A call whose arguments are neither those asked about nor those approved is not the call decided on: no verdict.

        :param guard: The guard's name.
        :param call: The pending call.
        :returns: The verdict, or None.
        """
        if call.id is None:
            return None
        verdict = self.verdicts.get((guard, call.id))
        if verdict is None:
            return None
        digest = arguments_digest(call.arguments)
        known = {verdict.request.arguments_digest}
        if verdict.arguments is not None:
            known.add(arguments_digest(verdict.arguments))
        return verdict if digest in known and verdict.request.tool_name == call.tool_name else None

    def request_of(self, call: ToolCall) -> str | None:
        """The id of the newest request about `call` that was decided (for the audit of what ran)."""
        found = [verdict.request for (_, call_id), verdict in self.verdicts.items() if call_id == call.id]
        return found[-1].request_id if found else None


def verdict_of(
    request: ApprovalRequest, decision: ApprovalDecision | None, *, tenant: str, session: str, at: datetime
) -> Verdict:
    """
    Turn a request and its decision (None: expired undecided) into a verdict, checking the decision's binding.

    :param request: The request, from its held step.
    :param decision: Its decision, or None when it expired undecided.
    :param tenant: The resuming store's tenant.
    :param session: The resuming store's session.
    :param at: Now.
    :returns: The verdict.
    """
    if decision is None:
        return Verdict(request, denial=expired("nobody decided before the request expired."))
    problem = binding_problem(decision, request, tenant=tenant, session=session, now=at)
    if problem is not None:
        return Verdict(request, denial=problem, decided_by=decision.decided_by)
    if not decision.approved:
        return Verdict(
            request, denial=denied_by_person(decision.reason), decided_by=decision.decided_by, by_person=True
        )
    return Verdict(request, arguments=dict(decision.arguments or {}), decided_by=decision.decided_by, by_person=True)
