"""Both hooks survive `to_dict`/`from_dict`, alone and inside `Agent.to_dict()`/`Agent.from_dict()`, allowlist as is."""

import json
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.core.errors import DeserializationError, SerializationError
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.hooks.compaction import SlidingWindowCompactor, ToolResultPruningCompactor
from haystack.hooks.tool_result_offloading import (
    AlwaysOffload,
    NeverOffload,
    OffloadOverChars,
    ToolResultOffloadHook,
)
from haystack.hooks.tool_result_offloading.types import OffloadPolicy
from haystack.token_counters import ApproximateTokenCounter
from hook_scripts import ALLOW_EXPERIMENTAL, TOOLS, page, references

from haystack_integrations.offload import FsspecToolResultStore, OffloadCompactionHook, OffloadHook, offload_context

STRATEGIES: dict[str | tuple[str, ...], OffloadPolicy] = {
    "fetch": OffloadOverChars(4000),
    ("clock", "calendar"): NeverOffload(),
    "*": AlwaysOffload(),
}


def _policies(hook: OffloadHook) -> dict[str | tuple[str, ...], tuple[type, dict[str, Any]]]:
    return {key: (type(policy), vars(policy)) for key, policy in hook.offload_strategies.items()}


def test_offload_hook_round_trip() -> None:
    hook = OffloadHook(STRATEGIES, store=FsspecToolResultStore("memory://fallback"), preview_chars=64)
    data = hook.to_dict()
    json.dumps(data)  # plain data only
    assert data["type"] == "haystack_integrations.offload.hooks.offload.OffloadHook"
    restored = OffloadHook.from_dict(data)
    assert _policies(restored) == _policies(hook)
    assert restored.preview_chars == 64
    assert isinstance(restored.store, FsspecToolResultStore)
    assert restored.store.url == "memory://fallback"


def test_strategies_are_serialized_in_haystacks_format_and_read_from_it() -> None:
    ours = OffloadHook(STRATEGIES).to_dict()["init_parameters"]["offload_strategies"]
    stock = ToolResultOffloadHook(store=FsspecToolResultStore("memory://x"), offload_strategies=STRATEGIES).to_dict()
    assert ours == stock["init_parameters"]["offload_strategies"]
    from_stock = OffloadHook.from_dict(
        {
            "type": "haystack_integrations.offload.hooks.offload.OffloadHook",
            "init_parameters": {**stock["init_parameters"], "store": None},
        }
    )
    assert _policies(from_stock) == _policies(OffloadHook(STRATEGIES))


def test_policies_from_modules_outside_the_allowlist_are_refused() -> None:
    data = OffloadHook({"*": AlwaysOffload()}).to_dict()
    data["init_parameters"]["offload_strategies"]["*"]["type"] = "os.system"
    with pytest.raises(DeserializationError):
        OffloadHook.from_dict(data)


def test_a_store_with_credentials_in_clear_is_not_serialized() -> None:
    store = FsspecToolResultStore("s3://bucket/prefix", storage_options={"key": "AKIA...", "secret": "shh"})
    with pytest.raises(SerializationError, match="credential in clear"):
        OffloadHook({"*": AlwaysOffload()}, store=store).to_dict()


@ALLOW_EXPERIMENTAL
def test_compaction_hook_round_trip() -> None:
    hook = OffloadCompactionHook(
        context_window=50_000,
        compact_at=0.8,
        compact_to=0.3,
        token_counter=ApproximateTokenCounter(chars_per_token=3.0),
        min_keep_steps=2,
        min_tokens=50,
        preview_chars=10,
        chain=[ToolResultPruningCompactor(min_tokens=10), SlidingWindowCompactor()],
    )
    data = hook.to_dict()
    json.dumps(data)
    restored = OffloadCompactionHook.from_dict(data)
    settings = ("context_window", "compact_at", "compact_to", "min_keep_steps", "min_tokens", "preview_chars", "store")
    assert {name: getattr(restored, name) for name in settings} == {name: getattr(hook, name) for name in settings}
    assert isinstance(restored.token_counter, ApproximateTokenCounter)
    assert restored.token_counter.chars_per_token == 3.0
    assert [type(compactor) for compactor in restored.chain] == [ToolResultPruningCompactor, SlidingWindowCompactor]
    assert restored.chain[0].min_tokens == 10  # type: ignore[attr-defined]


@ALLOW_EXPERIMENTAL
async def test_an_agent_round_trips_with_both_hooks_and_runs(store: FsspecToolResultStore) -> None:
    # The script is a cycling list (a response_fn in a test module is, rightly, not importable under the allowlist);
    # tools are given per run for the same reason. The hooks need no allowlist change. The replies report no usage,
    # so compaction counts the whole conversation itself.
    no_usage = {"usage": {}}
    script: list[str | ChatMessage] = [
        ChatMessage.from_assistant(
            tool_calls=[
                ToolCall(tool_name="fetch", arguments={"query": "rt a"}, id="a"),
                ToolCall(tool_name="notes", arguments={"query": "rt b"}, id="b"),
            ],
            meta=no_usage,
        ),
        ChatMessage.from_assistant(
            tool_calls=[ToolCall(tool_name="notes", arguments={"query": "rt c"}, id="c")], meta=no_usage
        ),
        ChatMessage.from_assistant(
            tool_calls=[ToolCall(tool_name="notes", arguments={"query": "rt d"}, id="d")], meta=no_usage
        ),
        ChatMessage.from_assistant("done", meta=no_usage),
    ]
    agent = Agent(
        chat_generator=MockChatGenerator(responses=script),
        hooks={
            "after_tool": [OffloadHook({"fetch": AlwaysOffload()})],
            "before_llm": [OffloadCompactionHook(context_window=1500, chain=[ToolResultPruningCompactor()])],
        },
    )
    data = agent.to_dict()
    json.dumps(data)
    restored = Agent.from_dict(data)
    assert [type(hook) for hook in restored.hooks["after_tool"]] == [OffloadHook]
    (compaction,) = restored.hooks["before_llm"]
    assert isinstance(compaction, OffloadCompactionHook)
    assert compaction.context_window == 1500
    assert [type(compactor) for compactor in compaction.chain] == [ToolResultPruningCompactor]

    session = store.for_session("roundtrip", "chat-1")
    result = await restored.run_async(
        [ChatMessage.from_user("go")], tools=list(TOOLS), hook_context=offload_context(session)
    )
    assert result["messages"][-1].text == "done"
    assert session.read(references(result, compacted=False)[0]) == page("rt a")
    compacted = references(result, compacted=True)
    assert compacted
    assert session.read(compacted[0]) == page("rt b", lines=40)
