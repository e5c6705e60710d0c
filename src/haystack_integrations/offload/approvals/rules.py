"""
Whether a tool call needs a person's approval: per-tool rules keyed like Haystack's confirmation strategies.

Any Haystack `ConfirmationPolicy` is a rule; `AskOncePerSession` and `AskWhen` are added for servers. Policies that
learn from decisions keep their memory per session.
"""

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from haystack.core.serialization import (
    component_to_dict,
    default_from_dict,
    default_to_dict,
    generate_qualified_class_name,
)
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy, ConfirmationUIResult, NeverAskPolicy
from haystack.hooks.human_in_the_loop.policies import AskOncePolicy
from haystack.hooks.human_in_the_loop.types import ConfirmationPolicy, ConfirmationStrategy
from haystack.utils.callable_serialization import deserialize_callable, serialize_callable
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_integrations.offload.approvals.approval_records import (
    ApprovalRequest,
    Decision,
    RememberApproval,
    RememberedApproval,
)
from haystack_integrations.offload.approvals.ledger import ApprovalLedger

logger = logging.getLogger(__name__)

RuleKey = str | tuple[str, ...]
WILDCARD = "*"


class AskOncePerSession:
    """
    Ask for the first call of a tool in a session; an approval is then remembered for that session until it expires.

    The memory is a small document in the session's store (``.approvals/memory.*``), so it is shared by every worker
    serving the session and never by two sessions. Only plain approvals are remembered: a denial or an edit asks again
    next time.

    ```python
    from haystack_integrations.offload import ApprovalHook, AskOncePerSession

    hook = ApprovalHook({"send_email": AskOncePerSession(ttl=3600)})
    ```

    Multi-user use: one hook serves every tenant; each session remembers its own approvals. A run without a session
    store has nowhere to remember, so it asks every time.
    """

    def __init__(self, *, ttl: float = 3600.0, per_arguments: bool = False) -> None:
        """
        :param ttl: Seconds an approval is remembered.
        :param per_arguments: Remember approvals for the exact arguments approved (like Haystack's `AskOncePolicy`),
            instead of for every call of the tool.
        :raises ValueError: If `ttl` is negative.
        """
        if ttl < 0:
            raise ValueError(f"ttl must be zero or more seconds, got {ttl}.")
        self.ttl = float(ttl)
        self.per_arguments = per_arguments

    def should_ask(self, tool_name: str, tool_description: str, tool_params: dict[str, Any]) -> bool:
        """Ask unless the session remembers an approval (the hook checks the session's memory before asking)."""
        return True

    def update_after_confirmation(self, *args: Any, **kwargs: Any) -> None:
        """Keep nothing in the policy object: approvals are remembered in the session's store."""

    def remember(self) -> RememberApproval:
        """How the hook records an approval made under this rule."""
        return RememberApproval(per_arguments=self.per_arguments, ttl_seconds=self.ttl)

    def to_dict(self) -> dict[str, Any]:
        """Serialize the rule."""
        return default_to_dict(self, ttl=self.ttl, per_arguments=self.per_arguments)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AskOncePerSession":
        """Deserialize the rule."""
        return default_from_dict(cls, data)


class AskWhen:
    """
    Ask when `predicate(arguments)` is true; run without asking otherwise.

    ```python
    from haystack_integrations.offload import ApprovalHook, AskWhen

    def large_invoice(arguments: dict) -> bool:
        return arguments.get("amount", 0) > 100

    hook = ApprovalHook({"send_invoice": AskWhen(large_invoice)})
    ```

    A predicate that raises is treated as "ask" (and logged): a broken rule must never let a call skip approval. Use
    a named, module-level function so the hook can be serialized with `Agent.to_dict()`.
    """

    def __init__(self, predicate: Callable[[dict[str, Any]], bool]) -> None:
        """
        :param predicate: Receives a copy of the call's arguments; returns True to ask for approval.
        :raises TypeError: If `predicate` is not callable.
        """
        if not callable(predicate):
            raise TypeError(f"AskWhen needs a callable predicate, got {type(predicate).__name__}.")
        self.predicate = predicate

    def should_ask(self, tool_name: str, tool_description: str, tool_params: dict[str, Any]) -> bool:
        """Ask when the predicate is true, or when it fails."""
        try:
            return bool(self.predicate(dict(tool_params)))
        except Exception:
            logger.warning("AskWhen predicate failed for tool %r; asking for approval.", tool_name, exc_info=True)
            return True

    def update_after_confirmation(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to learn."""

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize the rule.

        :raises SerializationError: If the predicate is a lambda or a nested function.
        """
        return default_to_dict(self, predicate=serialize_callable(self.predicate))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "AskWhen":
        """Deserialize the rule (the predicate's module must be on Haystack's deserialization allowlist)."""
        init = data.get("init_parameters", {})
        init["predicate"] = deserialize_callable(init["predicate"])
        return default_from_dict(cls, data)


Rule = ConfirmationPolicy | ConfirmationStrategy
"""A rule: a `ConfirmationPolicy` (whether to ask), or a Haystack `ConfirmationStrategy` (whether and how to ask)."""


def is_strategy(rule: object) -> bool:
    """Whether a rule is a Haystack `ConfirmationStrategy` (it decides with `run`) rather than a bare policy."""
    return not callable(getattr(rule, "should_ask", None)) and callable(getattr(rule, "run", None))


def policy_of(rule: Rule) -> ConfirmationPolicy | None:
    """
    The policy that tells whether a rule asks: the rule itself, or a strategy's ``confirmation_policy``.

    :param rule: The rule.
    :returns: The policy, or None for a strategy without one (it is asked about every call).
    """
    if not is_strategy(rule):
        return rule  # type: ignore[return-value]
    policy = getattr(rule, "confirmation_policy", None)
    return policy if callable(getattr(policy, "should_ask", None)) else None


def checked_rules(rules: Mapping[RuleKey, Rule]) -> dict[RuleKey, Rule]:
    """
    Validate a rules mapping.

    :param rules: Tool name, tuple of names or ``"*"`` -> rule (a policy or a Haystack confirmation strategy).
    :returns: A copy of the mapping.
    :raises TypeError: If a key or rule has the wrong type, or a rule is Haystack's process-wide `AskOncePolicy`.
    """
    checked: dict[RuleKey, Rule] = {}
    for key, rule in rules.items():
        names = key if isinstance(key, tuple) else (key,)
        if not names or not all(isinstance(name, str) and name for name in names):
            raise TypeError(f"Rule keys are tool names, tuples of tool names or '*', got {key!r}.")
        if isinstance(rule, AskOncePolicy) or isinstance(getattr(rule, "confirmation_policy", None), AskOncePolicy):
            raise TypeError(
                f"Rule for {key!r}: Haystack's AskOncePolicy remembers approvals in the hook, shared by every user of "
                "the Agent. Use AskOncePerSession, which remembers them in each session's store."
            )
        if not callable(getattr(rule, "should_ask", None)) and not is_strategy(rule):
            raise TypeError(
                f"Rule for {key!r} must be a ConfirmationPolicy (should_ask) or a ConfirmationStrategy (run), "
                f"got {rule!r}."
            )
        checked[key] = rule
    return checked


def rule_key_for(tool_name: str, rules: Mapping[RuleKey, Rule]) -> RuleKey | None:
    """
    The key of the rule that applies to a tool: its own name, then a tuple containing it, then ``"*"``.

    :param tool_name: The tool.
    :param rules: The hook's rules.
    :returns: The key, or None if no rule applies.
    """
    if tool_name in rules:
        return tool_name
    for key in rules:
        if isinstance(key, tuple) and tool_name in key:
            return key
    return WILDCARD if WILDCARD in rules else None


def rule_for(tool_name: str, rules: Mapping[RuleKey, Rule]) -> Rule | None:
    """
    Find the rule for a tool (see `rule_key_for` for the order).

    :param tool_name: The tool.
    :param rules: The hook's rules.
    :returns: The rule, or None if the tool runs without asking.
    """
    key = rule_key_for(tool_name, rules)
    return rules[key] if key is not None else None


def memory_key(tool_name: str, digest: str | None) -> str:
    """
    The document key of a remembered approval: a hash, so tool names and digests need no escaping.

    :param tool_name: The tool.
    :param digest: The arguments digest for per-arguments memory, else None.
    :returns: A short, safe key.
    """
    return hashlib.sha256(f"{tool_name}\x00{digest or '*'}".encode()).hexdigest()[:40]


def remembered_approval(
    request: ApprovalRequest, decided_by: str | None, at: datetime
) -> tuple[str, RememberedApproval]:
    """
    The memory an approval of `request` leaves under `AskOncePerSession`.

    :param request: A request made under `AskOncePerSession` (its ``remember`` is set).
    :param decided_by: Who approved.
    :param at: When.
    :returns: ``(memory key, record)``.
    :raises ValueError: If the request was not made under `AskOncePerSession`.
    """
    if request.remember is None:
        raise ValueError(f"Request {request.request_id!r} was not made under AskOncePerSession.")
    digest = request.arguments_digest if request.remember.per_arguments else None
    record = RememberedApproval(
        tool_name=request.tool_name,
        arguments_digest=digest,
        decided_by=decided_by,
        approved_at=at,
        expires=at + timedelta(seconds=request.remember.ttl_seconds),
    )
    return memory_key(request.tool_name, digest), record


def serialize_rules(rules: Mapping[RuleKey, Rule]) -> dict[str, Any]:
    """
    Serialize rules; tuple keys become JSON-array strings, as in Haystack's `ConfirmationHook`.

    :param rules: The rules.
    :returns: A JSON-compatible dictionary.
    """
    return {
        (json.dumps(list(key)) if isinstance(key, tuple) else key): component_to_dict(obj=rule, name="approval_rule")
        for key, rule in rules.items()
    }


def deserialize_rules(data: dict[str, Any]) -> dict[RuleKey, Rule]:
    """
    Rebuild rules serialized by `serialize_rules`.

    :param data: The serialized rules.
    :returns: The rules.
    """
    rules = dict(data)
    for raw_key in list(rules):
        deserialize_component_inplace(rules, key=raw_key)
    return {
        (tuple(json.loads(raw_key)) if raw_key.startswith("[") else raw_key): rule for raw_key, rule in rules.items()
    }


# Policies known to learn nothing: no copy, no I/O.
# Policies that learn from decisions (`ConfirmationPolicy.update_after_confirmation`) get a copy per session, kept in
# the session's ``.approvals/`` documents: loaded before screening, written back after each decision.

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


async def load_policies_async(
    rules: Mapping[RuleKey, Rule], guard: str, ledger: ApprovalLedger | None
) -> SessionPolicies:
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


async def save_policies_async(policies: SessionPolicies, guard: str, ledger: ApprovalLedger | None) -> None:
    """Write back the copies that learned something in this run."""
    if ledger is not None:
        for key in policies.learned:
            data = json.dumps(component_to_dict(policies.copies[key], name="approval_rule")).encode()
            await ledger.documents.put_async(_document(guard, key), data)
