"""
What a resumed step's decisions rule for each of its calls: run it, with which arguments, or answer it with a denial.
"""

import asyncio
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
    arguments_digest,
    binding_problem,
)
from haystack_integrations.offload.approvals.audit import (
    RecordedEvent,
    decided_event,
    requested_event,
)
from haystack_integrations.offload.approvals.errors import (
    ApprovalPendingError,
)
from haystack_integrations.offload.approvals.ledger import (
    ApprovalLedger,
    ApprovalListing,
    sequence_of,
)
from haystack_integrations.offload.approvals.outcomes import (
    denied_by_person,
    expired,
)

# What the decisions rule for each call. Resuming re-enters the Agent's step at ``before_tool`` with the held message,
# so every hook of the chain runs again and is obeyed; an `ApprovalHook` finds in `Rulings` the rulings on *its*
# requests (by guard) and applies them as the in-process channel applies an answer; a call it guards with no decision
# yet is held again, as a new step that continues this one.


@dataclass(frozen=True)
class Ruling:
    """What a decision means for one call: run it (with these arguments), or answer it with a denial."""

    request: ApprovalRequest
    arguments: dict[str, Any] | None = None
    denial: Denial | None = None
    decided_by: str | None = None
    by_person: bool = False
    """Whether a person's decision is behind the ruling (not an expiry or a refused binding)."""

    def decision(self) -> Decision | None:
        """The person's answer this ruling carries, for policies that learn (None when no person answered)."""
        if not self.by_person:
            return None
        if self.denial is None:
            return Decision.approve(self.arguments, by=self.decided_by)
        return Decision.deny(self.denial.feedback, by=self.decided_by)


@dataclass(frozen=True)
class Rulings:
    """
    The decided requests of a resumed step and of the steps it continues, by guard and tool call id.

    :param step: The step being resumed.
    :param first_step_id: The step that first held its message (calls keep their claim keys from it).
    :param by_call: ``(guard, tool call id) -> Ruling``.
    :param state: The run's state values recorded when the first step held.
    :param before: How many messages of the resumed conversation come before what the resume adds.
    """

    step: HeldStep
    first_step_id: str
    by_call: dict[tuple[str, str], Ruling] = field(default_factory=dict)
    state: dict[str, Any] | None = None
    before: int = 0
    """How many messages of the resumed conversation come before what the resume adds (a lost turn's answers that it
    puts back, then the held message)."""
    audited: list[RecordedEvent] = field(default_factory=list)
    """What the audit must hold before any call runs: every request of the steps, and every decision on them."""

    def preceding(self, messages: list[ChatMessage]) -> list[dict[str, Any]]:
        """What this resume added before the pending message, to keep with a step that holds it again."""
        return [message.to_dict() for message in messages[self.before : -1]]

    def ruling(self, guard: str, call: ToolCall) -> Ruling | None:
        """
        The ruling of `guard` on `call`, if it has decided (or its request expired).

        A call whose arguments are neither those asked about nor those approved is not the call decided on: no ruling.

        :param guard: The guard's name.
        :param call: The pending call.
        :returns: The ruling, or None.
        """
        if call.id is None:
            return None
        ruling = self.by_call.get((guard, call.id))
        if ruling is None:
            return None
        digest = arguments_digest(call.arguments)
        known = {ruling.request.arguments_digest}
        if ruling.arguments is not None:
            known.add(arguments_digest(ruling.arguments))
        return ruling if digest in known and ruling.request.tool_name == call.tool_name else None

    def request_of(self, call: ToolCall) -> str | None:
        """The id of the newest request about `call` that was decided (for the audit of what ran)."""
        found = [ruling.request for (_, call_id), ruling in self.by_call.items() if call_id == call.id]
        return found[-1].request_id if found else None


def ruling_for(
    request: ApprovalRequest, decision: ApprovalDecision | None, *, tenant: str, session: str, at: datetime
) -> Ruling:
    """
    Turn a request and its decision (None: expired undecided) into a ruling, checking the decision's binding.

    :param request: The request, from its held step.
    :param decision: Its decision, or None when it expired undecided.
    :param tenant: The resuming store's tenant.
    :param session: The resuming store's session.
    :param at: Now.
    :returns: The ruling.
    """
    if decision is None:
        return Ruling(request, denial=expired("nobody decided before the request expired."))
    problem = binding_problem(decision, request, tenant=tenant, session=session, now=at)
    if problem is not None:
        return Ruling(request, denial=problem, decided_by=decision.decided_by)
    if not decision.approved:
        return Ruling(request, denial=denied_by_person(decision.reason), decided_by=decision.decided_by, by_person=True)
    return Ruling(request, arguments=dict(decision.arguments or {}), decided_by=decision.decided_by, by_person=True)


async def read_rulings(
    ledger: ApprovalLedger, listing: ApprovalListing, step: HeldStep, at: datetime, *, before: int
) -> Rulings:
    """The rulings of this step and of the steps it continues (later steps' rulings win); raise if some wait."""
    chain = [step]
    while chain[-1].continues is not None:
        chain.append(await ledger.step_async(sequence_of(str(chain[-1].continues))))
    rulings = Rulings(step=step, first_step_id=chain[-1].step_id, state=chain[-1].state, before=before)
    waiting = []
    for held in reversed(chain):
        requests = held.requests()
        # The snapshot read the resumed step's decisions; the steps it continues are read by name.
        found = await asyncio.gather(
            *(
                ledger.decision_async(r.request_id) if held is not step or listing.decided(r.request_id) else _none()
                for r in requests
            )
        )
        for request, decision in zip(requests, found, strict=True):
            rulings.audited.append(requested_event(request))
            if decision is not None:
                rulings.audited.append(decided_event(request, decision))
            if decision is None and not request.expired(at):
                waiting.append(request.request_id)
                continue
            if request.tool_call_id is not None:
                ruling = ruling_for(request, decision, tenant=step.tenant, session=step.session, at=at)
                rulings.by_call[(request.guard, request.tool_call_id)] = ruling
    if waiting:
        raise ApprovalPendingError(
            f"{len(waiting)} approval request(s) of this step still wait for a decision: {', '.join(waiting)}.",
            waiting,
        )
    return rulings


async def _none() -> None:
    return None
