"""ApprovalHook is traced as Haystack's ConfirmationHook is: one strategy span per call asked about, with its tags."""

from typing import Any

import pytest
from haystack import tracing
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.hooks.human_in_the_loop import (
    AlwaysAskPolicy,
    BlockingConfirmationStrategy,
    ConfirmationHook,
    ConfirmationUIResult,
)
from haystack.tools import Tool
from tracing_spy import RecordingTracer

from haystack_integrations.offload import ApprovalHook, CallbackApprovals, Decision

STRATEGY_SPAN = "haystack.agent.hook.human_in_the_loop.strategy"


class Answer:
    """A confirmation UI with a fixed answer."""

    def __init__(self, action: str, feedback: str = "because") -> None:
        self.action = action
        self.feedback = feedback

    def get_user_confirmation(self, tool_name: str, tool_description: str, tool_params: dict[str, Any]) -> Any:
        return ConfirmationUIResult(action=self.action, feedback=self.feedback)


def script(messages: list[ChatMessage]) -> ChatMessage:
    if messages[-1].is_from(ChatRole.USER):
        calls = [ToolCall(tool_name="echo", arguments={"text": str(n)}, id=f"call_{n}") for n in (1, 2)]
        return ChatMessage.from_assistant(tool_calls=calls)
    return ChatMessage.from_assistant("done")


def run(hook: Any, **kwargs: Any) -> None:
    echo = Tool(name="echo", description="Echo.", parameters={"type": "object"}, function=lambda text: text)
    agent = Agent(chat_generator=MockChatGenerator(response_fn=script), tools=[echo], hooks={"before_tool": [hook]})
    agent.warm_up()
    agent.run([ChatMessage.from_user("go")], **kwargs)


async def run_async(hook: Any) -> None:
    echo = Tool(name="echo", description="Echo.", parameters={"type": "object"}, function=lambda text: text)
    agent = Agent(chat_generator=MockChatGenerator(response_fn=script), tools=[echo], hooks={"before_tool": [hook]})
    agent.warm_up()
    await agent.run_async([ChatMessage.from_user("go")])


def strategy_spans(tracer: RecordingTracer) -> list[dict[str, Any]]:
    return [span.tags for span in tracer.spans if span.operation_name == STRATEGY_SPAN]


@pytest.mark.parametrize("action", ["confirm", "reject"])
def test_the_strategy_spans_match_confirmation_hooks(action: str, recording_tracer: RecordingTracer) -> None:
    def strategy() -> BlockingConfirmationStrategy:
        return BlockingConfirmationStrategy(confirmation_policy=AlwaysAskPolicy(), confirmation_ui=Answer(action))

    run(ConfirmationHook(confirmation_strategies={"echo": strategy()}))
    theirs = strategy_spans(recording_tracer)
    recording_tracer.spans.clear()
    run(ApprovalHook(confirmation_strategies={"echo": strategy()}))
    ours = strategy_spans(recording_tracer)

    assert len(ours) == len(theirs) == 2
    assert [sorted(tags) for tags in ours] == [sorted(tags) for tags in theirs]
    for key in ("haystack.tool.name", "haystack.tool.call.id", f"{STRATEGY_SPAN}.type", f"{STRATEGY_SPAN}.decision"):
        assert [tags[key] for tags in ours] == [tags[key] for tags in theirs]


def test_a_channel_is_traced_with_its_decision(recording_tracer: RecordingTracer) -> None:
    answers = iter([Decision.approve(), Decision.approve({"text": "edited"})])
    run(
        ApprovalHook({"echo": AlwaysAskPolicy()}),
        hook_context={"approval_channel": CallbackApprovals(lambda request: next(answers))},
    )
    spans = strategy_spans(recording_tracer)
    assert [tags[f"{STRATEGY_SPAN}.decision"] for tags in spans] == ["confirm", "modify"]
    assert [tags["haystack.tool.call.id"] for tags in spans] == ["call_1", "call_2"]
    assert all(tags[f"{STRATEGY_SPAN}.type"].endswith("CallbackApprovals") for tags in spans)


async def test_a_rejections_feedback_is_in_the_strategy_spans_output(
    recording_tracer: RecordingTracer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Haystack's test_adds_decision_tags_to_tool_span_async, through both hooks: the feedback is in the output tag.
    monkeypatch.setattr(tracing.tracer, "is_content_tracing_enabled", True)

    def strategy() -> BlockingConfirmationStrategy:
        ui = Answer("reject", feedback="sensitive rejection feedback")
        return BlockingConfirmationStrategy(confirmation_policy=AlwaysAskPolicy(), confirmation_ui=ui)

    await run_async(ConfirmationHook(confirmation_strategies={"echo": strategy()}))
    theirs = strategy_spans(recording_tracer)
    recording_tracer.spans.clear()
    await run_async(ApprovalHook(confirmation_strategies={"echo": strategy()}))
    hook_spans = recording_tracer.hook_spans("before_tool")
    spans = [span for span in recording_tracer.spans if span.operation_name == STRATEGY_SPAN]

    assert len(spans) == 2 and all(span.parent is hook_spans[0] for span in spans)
    for tags, stock in zip((span.tags for span in spans), theirs, strict=True):
        assert tags[f"{STRATEGY_SPAN}.decision"] == "reject"
        assert tags[f"{STRATEGY_SPAN}.input"]["tool_params"] == {"text": tags["haystack.tool.call.id"][-1]}
        output = tags[f"{STRATEGY_SPAN}.output"]
        assert "sensitive rejection feedback" in output["feedback"]
        assert {key: output[key] for key in stock[f"{STRATEGY_SPAN}.output"]} == stock[f"{STRATEGY_SPAN}.output"]
