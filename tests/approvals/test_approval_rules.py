"""Rules (whether to ask), records and serialization: the parts that need no store."""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from approval_scenario import INVOICE_SCHEMA, make_agent, plan
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy, AskOncePolicy, NeverAskPolicy
from pydantic import ValidationError

from haystack_integrations.offload import (
    ApprovalHook,
    AskOncePerSession,
    AskWhen,
    CallbackApprovals,
    Decision,
    DurableApprovals,
    FsspecToolResultStore,
    offload_context,
)
from haystack_integrations.offload.approvals import InvalidApprovalEditError
from haystack_integrations.offload.approvals.approval_records import arguments_digest, validated_arguments
from haystack_integrations.offload.approvals.rules import rule_for


def test_rules_resolve_like_haystacks_confirmation_hook() -> None:
    own, shared, fallback = AlwaysAskPolicy(), NeverAskPolicy(), AlwaysAskPolicy()
    rules: dict[Any, Any] = {"send_invoice": own, ("a", "b"): shared, "*": fallback}
    assert rule_for("send_invoice", rules) is own
    assert rule_for("b", rules) is shared
    assert rule_for("other", rules) is fallback
    assert rule_for("other", {"send_invoice": own}) is None


def test_haystacks_shared_ask_once_policy_is_refused() -> None:
    with pytest.raises(TypeError, match="AskOncePerSession"):
        ApprovalHook({"send_invoice": AskOncePolicy()})


@pytest.mark.parametrize(
    "rules", [{"": AlwaysAskPolicy()}, {(): AlwaysAskPolicy()}, {"x": object()}, {3: AlwaysAskPolicy()}]
)
def test_bad_rules_are_refused(rules: dict[Any, Any]) -> None:
    with pytest.raises(TypeError):
        ApprovalHook(rules)


def test_ask_when_asks_on_its_predicate_and_when_it_fails() -> None:
    def big(arguments: dict[str, Any]) -> bool:
        return arguments["amount"] > 100

    rule = AskWhen(big)
    assert rule.should_ask("t", "", {"amount": 101}) is True
    assert rule.should_ask("t", "", {"amount": 5}) is False
    assert rule.should_ask("t", "", {}) is True  # KeyError in the predicate: ask, never skip


def test_arguments_digest_is_canonical() -> None:
    assert arguments_digest({"a": 1, "b": [1, 2]}) == arguments_digest({"b": [1, 2], "a": 1})
    assert arguments_digest({"a": 1}) != arguments_digest({"a": "1"})
    assert arguments_digest({"text": "é"}) == arguments_digest({"text": "é"})


def test_edit_validation_names_every_problem() -> None:
    with pytest.raises(InvalidApprovalEditError) as caught:
        validated_arguments("send_invoice", INVOICE_SCHEMA, {"amount": "x", "extra": 1})
    message = str(caught.value)
    assert "'customer' is a required property" in message and "amount: 'x' is not of type 'integer'" in message
    with pytest.raises(InvalidApprovalEditError, match="object with string keys"):
        validated_arguments("send_invoice", INVOICE_SCHEMA, ["customer", "x"])
    assert validated_arguments("send_invoice", INVOICE_SCHEMA, {"customer": "a", "amount": 2}) == {
        "customer": "a",
        "amount": 2,
    }


def test_records_refuse_what_they_should() -> None:
    with pytest.raises(ValidationError, match="denial carries no arguments"):
        Decision(approved=False, arguments={"a": 1})
    with pytest.raises(ValidationError):
        Decision.model_validate({"approved": True, "surprise": 1})
    with pytest.raises(ValueError, match="ttl"):
        DurableApprovals(ttl=-1)
    with pytest.raises(ValueError, match="timeout"):
        CallbackApprovals(lambda request: True, timeout=0)
    with pytest.raises(ValueError, match="ttl"):
        AskOncePerSession(ttl=-5)


def test_hook_round_trips_through_agent_serialization() -> None:
    hook = ApprovalHook(
        {
            "send_invoice": AlwaysAskPolicy(),
            ("web_search", "read_tool_result"): AskOncePerSession(ttl=60, per_arguments=True),
            "*": AskWhen(bool),
        }
    )
    # No tools: the test's tool functions live outside Haystack's deserialization allowlist; the hook is what matters.
    agent = Agent(chat_generator=MockChatGenerator(responses="ok"), hooks={"before_tool": [hook]})
    data = agent.to_dict()
    json.dumps(data)  # plain JSON: tuple keys became JSON-array strings
    rules = data["init_parameters"]["hooks"]["before_tool"][0]["init_parameters"]["rules"]
    assert set(rules) == {"send_invoice", '["web_search", "read_tool_result"]', "*"}

    restored = Agent.from_dict(data).hooks["before_tool"][0]
    assert isinstance(restored, ApprovalHook)
    assert isinstance(restored.rules["send_invoice"], AlwaysAskPolicy)
    once = restored.rules[("web_search", "read_tool_result")]
    assert isinstance(once, AskOncePerSession) and (once.ttl, once.per_arguments) == (60.0, True)
    ask_when = restored.rules["*"]
    assert isinstance(ask_when, AskWhen) and ask_when.predicate is bool


async def test_a_live_channel_never_touches_serialization(tmp_path: Path, ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    before = agent.to_dict()
    store = FsspecToolResultStore(f"memory://approvals-{tmp_path.name}").for_session("acme", "chat-1")
    unserializable = CallbackApprovals(lambda request: Decision.approve())  # a lambda: cannot be serialized

    await agent.run_async(
        [plan(("send_invoice", {"customer": "a", "amount": 1}, "c1"))],
        hook_context=offload_context(store, approval_channel=unserializable),
    )
    assert agent.to_dict() == before


def test_request_expiry_is_inclusive() -> None:
    from haystack_integrations.offload.approvals.approval_records import ApprovalRequest

    created = datetime(2026, 1, 1, tzinfo=UTC)
    request = ApprovalRequest(
        request_id="r",
        step_id="s",
        tenant="t",
        session="s",
        position=0,
        tool_call_id="c",
        tool_name="x",
        arguments={},
        arguments_digest=arguments_digest({}),
        parameters={},
        rule="AlwaysAskPolicy",
        created=created,
        expires=created + timedelta(seconds=10),
    )
    assert not request.expired(created + timedelta(seconds=9))
    assert request.expired(created + timedelta(seconds=10))
    with pytest.raises(ValidationError):
        ApprovalRequest.model_validate({**request.model_dump(), "created": datetime(2026, 1, 1)})  # naive time
