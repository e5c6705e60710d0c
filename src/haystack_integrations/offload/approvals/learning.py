"""
Policies that learn from decisions (`ConfirmationPolicy.update_after_confirmation`), with their memory per session.

An `ApprovalHook` gives each session its own copy of a learning policy, kept in the session's ``.approvals/``
documents, loaded before screening and written back after each decision.
"""

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from haystack.core.serialization import component_to_dict, default_from_dict, generate_qualified_class_name
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy, ConfirmationUIResult, NeverAskPolicy
from haystack.hooks.human_in_the_loop.types import ConfirmationPolicy

from haystack_integrations.offload.approvals.approval_records import ApprovalRequest, Decision
from haystack_integrations.offload.approvals.ledger import ApprovalLedger
from haystack_integrations.offload.approvals.rules import AskOncePerSession, AskWhen, Rule, RuleKey, policy_of

# Policies known to learn nothing: no copy, no I/O.
_STATELESS = (AlwaysAskPolicy, NeverAskPolicy, AskWhen, AskOncePerSession)


def learns(rule: Rule) -> bool:
    """
    Whether a rule's policy learns from decisions (its class has an ``update_after_confirmation`` of its own).

    :param rule: A policy or a strategy.
    :returns: True for policies whose memory must be kept per session.
    """
    policy = policy_of(rule)
    if policy is None or isinstance(policy, _STATELESS) or policy is not rule:
        # A strategy's policy learns inside the strategy's own run (as in ConfirmationHook), not here.
        return False
    method = getattr(type(policy), "update_after_confirmation", None)
    return callable(method) and method is not ConfirmationPolicy.update_after_confirmation


@dataclass
class SessionPolicies:
    """One run's copies of the hook's learning policies, by rule key, and the decisions they learn from."""

    copies: dict[RuleKey, Any] = field(default_factory=dict)
    learned: set[RuleKey] = field(default_factory=set)

    def policy(self, key: RuleKey, rule: Rule) -> Any:
        """The policy to screen with: the session's copy of a learning policy, else the rule's own."""
        return self.copies.get(key, policy_of(rule))

    def learn(self, key: RuleKey, request: ApprovalRequest, decision: Decision | None) -> None:
        """
        Tell the session's copy of `key`'s policy how a person answered `request`.

        :param key: The rule's key.
        :param request: The call asked about.
        :param decision: The answer; None (no answer in time) teaches nothing.
        """
        copy = self.copies.get(key)
        if copy is None or decision is None:
            return
        copy.update_after_confirmation(
            request.tool_name, request.tool_description, dict(request.arguments), _ui_result(request, decision)
        )
        self.learned.add(key)


def _ui_result(request: ApprovalRequest, decision: Decision) -> ConfirmationUIResult:
    if not decision.approved:
        return ConfirmationUIResult(action="reject", feedback=decision.reason)
    if decision.arguments is not None and decision.arguments != request.arguments:
        return ConfirmationUIResult(action="modify", feedback=decision.reason, new_tool_params=decision.arguments)
    return ConfirmationUIResult(action="confirm", feedback=decision.reason)


def _document(guard: str, key: RuleKey) -> str:
    identity = json.dumps([guard, list(key) if isinstance(key, tuple) else key])
    return f"policy.{hashlib.sha256(identity.encode()).hexdigest()[:40]}.json"


def _fresh(rule: Any) -> Any:
    return _from_dict(type(rule), component_to_dict(rule, name="approval_rule"))


def _revived(data: bytes | None, rule: Any) -> Any:
    # Only the rule's own class is ever rebuilt: a document naming another type (the rule changed class, or the
    # document was tampered with) starts over from the rule, so nothing from the store picks what gets imported.
    if data is None:
        return _fresh(rule)
    serialized = json.loads(data)
    if not isinstance(serialized, dict) or serialized.get("type") != generate_qualified_class_name(type(rule)):
        return _fresh(rule)
    return _from_dict(type(rule), serialized)


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    from_dict = getattr(cls, "from_dict", None)
    return from_dict(data) if callable(from_dict) else default_from_dict(cls, data)


async def load_async(rules: Mapping[RuleKey, Rule], guard: str, ledger: ApprovalLedger | None) -> SessionPolicies:
    """
    Load the session's copies of the learning policies among `rules` (fresh copies where the session has none).

    :param rules: The hook's rules.
    :param guard: The hook's guard name (two hooks keep apart what they learn).
    :param ledger: The session's approval documents, or None for a run without a session store.
    :returns: The copies.
    """
    found = SessionPolicies()
    for key, rule in rules.items():
        if learns(rule):
            data = await ledger.read_async(_document(guard, key)) if ledger is not None else None
            found.copies[key] = _revived(data, rule)
    return found


def load(rules: Mapping[RuleKey, Rule], guard: str, ledger: ApprovalLedger | None) -> SessionPolicies:
    """Sync `load_async`."""
    found = SessionPolicies()
    for key, rule in rules.items():
        if learns(rule):
            data = ledger.read(_document(guard, key)) if ledger is not None else None
            found.copies[key] = _revived(data, rule)
    return found


async def save_async(policies: SessionPolicies, guard: str, ledger: ApprovalLedger | None) -> None:
    """Write back the copies that learned something in this run."""
    if ledger is not None:
        for key in policies.learned:
            data = json.dumps(component_to_dict(policies.copies[key], name="approval_rule")).encode()
            await ledger.documents.put_async(_document(guard, key), data)


def save(policies: SessionPolicies, guard: str, ledger: ApprovalLedger | None) -> None:
    """Sync `save_async`."""
    if ledger is not None:
        for key in policies.learned:
            data = json.dumps(component_to_dict(policies.copies[key], name="approval_rule")).encode()
            ledger.documents.put(_document(guard, key), data)
