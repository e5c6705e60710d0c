"""`OffloadHook`: Haystack's pointer format, per-tool policies, the run's store, concurrency and backends."""

import asyncio
import base64
import threading
from pathlib import Path
from typing import Any

import pytest
from haystack.dataclasses import ChatMessage, FileContent, ImageContent, TextContent, ToolCall
from haystack.hooks.compaction import ToolResultPruningCompactor
from haystack.hooks.tool_result_offloading import (
    AlwaysOffload,
    FileSystemToolResultStore,
    NeverOffload,
    OffloadOverChars,
    ToolResultOffloadHook,
)
from haystack.hooks.tool_result_offloading.types import OffloadPolicy
from haystack.token_counters import ApproximateTokenCounter
from hook_scripts import (
    ALLOW_EXPERIMENTAL,
    OFFLOADED,
    RecordingStore,
    make_agent,
    make_state,
    page,
    references,
    tool_results,
    tool_step,
)

from haystack_integrations.offload import FsspecToolResultStore, OffloadHook, offload_context
from haystack_integrations.offload.hooks import pointers
from haystack_integrations.offload.testing.local_s3 import RequestLog

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4).decode()
PDF = base64.b64encode(b"%PDF-1.4 " + b"\x00\xff" * 300).decode()


# Haystack compatibility


@pytest.mark.parametrize(
    ("content", "preview_chars"),
    [
        ("y" * 5000, 200),
        ("short enough to show whole", 200),
        ("z" * 300, 0),
        (
            [
                TextContent(text="a chart of results " * 50),
                ImageContent(base64_image=PNG, mime_type="image/png"),
                FileContent(base64_data=PDF, mime_type="application/pdf", filename="report.pdf"),
                ImageContent(base64_image=PNG),
            ],
            40,
        ),
    ],
)
async def test_the_pointer_and_meta_are_haystacks_own(content: Any, preview_chars: int) -> None:
    messages = [ChatMessage.from_user("go"), *tool_step(("fetch", content), ("clock", "small"), step=3)]
    strategies: dict[str | tuple[str, ...], OffloadPolicy] = {"fetch": AlwaysOffload()}
    stock_state, sync_state, async_state = (make_state(messages, step=3) for _ in range(3))

    ToolResultOffloadHook(store=RecordingStore(), offload_strategies=strategies, preview_chars=preview_chars).run(
        stock_state
    )
    OffloadHook(strategies, store=RecordingStore(), preview_chars=preview_chars).run(sync_state)
    await OffloadHook(strategies, store=RecordingStore(), preview_chars=preview_chars).run_async(async_state)

    expected = stock_state.data["messages"]
    assert expected[2].meta[OFFLOADED]  # the stock hook did offload: the comparison is not between two no-ops
    assert sync_state.data["messages"] == expected
    assert async_state.data["messages"] == expected


@ALLOW_EXPERIMENTAL
def test_haystack_recognises_our_pointers() -> None:
    messages = [ChatMessage.from_user("go"), *tool_step(("fetch", "x" * 8000), step=0)]
    state = make_state(messages)
    OffloadHook({"*": AlwaysOffload()}, store=RecordingStore()).run(state)
    offloaded = state.data["messages"]
    later = [*offloaded, *tool_step(("fetch", "w" * 8000), step=1), *tool_step(("fetch", "v" * 8000), step=2)]

    # The pruning compactor skips offloaded results by their meta: our pointer survives, the raw result is pruned.
    pruned = ToolResultPruningCompactor(min_tokens=0).compact(later, 10, ApproximateTokenCounter())
    assert pruned is not None
    assert pruned[2] == offloaded[2]
    assert pruned[4].tool_call_result is not None
    assert pruned[4].tool_call_result.result.startswith("[Tool result removed")

    # Haystack's own hook does not offload a pointer again.
    stock_state = make_state(offloaded)
    ToolResultOffloadHook(store=RecordingStore(), offload_strategies={"*": AlwaysOffload()}).run(stock_state)
    assert stock_state.data["messages"] == offloaded


# Which results are offloaded


def _offloaded_tools(state_messages: list[ChatMessage]) -> list[str]:
    return [
        message.tool_call_result.origin.tool_name
        for message in state_messages
        if message.tool_call_result is not None and message.meta.get(OFFLOADED)
    ]


def test_the_most_specific_key_wins() -> None:
    big, small = "b" * 500, "s" * 50
    messages = [
        ChatMessage.from_user("go"),
        *tool_step(
            ("exact", big),
            ("in_tuple", small),
            ("wild", big),
            ("wild", small),
            ("opted_out", big),
            ("exact_over", big),
        ),
    ]
    hook = OffloadHook(
        {
            "exact": AlwaysOffload(),
            ("in_tuple", "other"): AlwaysOffload(),
            "opted_out": NeverOffload(),
            "exact_over": OffloadOverChars(1000),
            "*": OffloadOverChars(100),
        },
        store=RecordingStore(),
    )
    state = make_state(messages)
    hook.run(state)
    assert _offloaded_tools(state.data["messages"]) == ["exact", "in_tuple", "wild"]


def test_without_a_wildcard_unlisted_tools_stay() -> None:
    state = make_state([ChatMessage.from_user("go"), *tool_step(("listed", "a" * 10), ("unlisted", "b" * 10_000))])
    OffloadHook({"listed": AlwaysOffload()}, store=RecordingStore()).run(state)
    assert _offloaded_tools(state.data["messages"]) == ["listed"]


def test_custom_policies_see_the_tool_the_payload_and_the_state() -> None:
    seen: list[tuple[str, int, int]] = []

    class EveryOtherStep(OffloadPolicy):
        def should_offload(self, tool_name: str, result: str, state: Any) -> bool:
            seen.append((tool_name, len(result), state.data["step_count"]))
            return bool(state.data["step_count"] % 2)

    messages = [ChatMessage.from_user("go"), *tool_step(("fetch", "q" * 1234))]
    for step, offloaded in ((1, True), (2, False)):
        state = make_state(messages, step=step)
        OffloadHook({"*": EveryOtherStep()}, store=RecordingStore()).run(state)
        assert bool(_offloaded_tools(state.data["messages"])) is offloaded
    assert seen == [("fetch", 1234, 1), ("fetch", 1234, 2)]


def test_read_back_tools_are_never_offloaded() -> None:
    store = RecordingStore()
    messages = [
        ChatMessage.from_user("go"),
        *tool_step(("read_tool_result", "r" * 9000), ("list_tool_results", "l" * 9000), ("fetch", "f" * 9000)),
    ]
    state = make_state(messages)
    OffloadHook({"*": AlwaysOffload(), "read_tool_result": NeverOffload()}, store=store).run(state)
    assert _offloaded_tools(state.data["messages"]) == ["fetch"]
    assert len(store.written) == 1


@pytest.mark.parametrize("key", ["read_tool_result", ("list_tool_results", "fetch")])
def test_a_read_back_tool_given_an_offloading_policy_is_refused(key: str | tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="never offloaded"):
        OffloadHook({key: AlwaysOffload()})


@pytest.mark.parametrize(
    ("strategies", "error", "match"),
    [
        ({"": AlwaysOffload()}, ValueError, "must not be empty"),
        ({(): AlwaysOffload()}, ValueError, "one or more tool names"),
        ({("a", ""): AlwaysOffload()}, ValueError, "one or more tool names"),
        ({3: AlwaysOffload()}, TypeError, "keys must be tool names"),
        ({"a": "always"}, TypeError, "must be an OffloadPolicy"),
        ({"a": AlwaysOffload(), ("b", "a"): NeverOffload()}, ValueError, "under two offload_strategies keys"),
        ([("a", AlwaysOffload())], TypeError, "must be a dict"),
    ],
)
def test_bad_strategies_get_a_clear_error(strategies: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        OffloadHook(strategies)


@pytest.mark.parametrize("preview_chars", [-1, 2.5, True])
def test_bad_preview_chars_is_refused(preview_chars: Any) -> None:
    with pytest.raises(ValueError, match="preview_chars"):
        OffloadHook({"*": AlwaysOffload()}, preview_chars=preview_chars)


def test_errors_empty_results_history_and_earlier_pointers_stay() -> None:
    store = RecordingStore()
    earlier_pointer = ChatMessage.from_tool(
        tool_result="Tool result offloaded to ...",
        origin=ToolCall(tool_name="fetch", arguments={}, id="p"),
        meta={OFFLOADED: ["ref/old"]},
    )
    history = [ChatMessage.from_user("go"), *tool_step(("fetch", "h" * 9000), step=0)]
    step = [
        ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="fetch", arguments={}, id="p")]),
        earlier_pointer,
        *tool_step(("fetch", "e" * 9000), step=1, error=True)[1:],
        *tool_step(("fetch", ""), ("fetch", [TextContent(text="")]), step=2)[1:],
    ]
    state = make_state(history + step)
    OffloadHook({"*": AlwaysOffload()}, store=store).run(state)
    assert state.data["messages"] == history + step
    assert store.written == {}


def test_image_results_stay_with_a_text_only_store() -> None:
    class TextOnlyStore(RecordingStore):
        supports_binary_content = False

    image = [ImageContent(base64_image=PNG, mime_type="image/png")]
    state = make_state([ChatMessage.from_user("go"), *tool_step(("render", image), ("fetch", "t" * 9000))])
    OffloadHook({"*": AlwaysOffload()}, store=TextOnlyStore()).run(state)
    assert _offloaded_tools(state.data["messages"]) == ["fetch"]


# Which store


def test_the_runs_store_wins_over_the_constructor_store() -> None:
    fallback, own = RecordingStore(), RecordingStore()
    state = make_state([ChatMessage.from_user("go"), *tool_step(("fetch", "x" * 9000))], store=own)
    OffloadHook({"*": AlwaysOffload()}, store=fallback).run(state)
    assert len(own.written) == 1
    assert fallback.written == {}


def test_the_constructor_store_serves_runs_without_one() -> None:
    fallback = RecordingStore()
    agent = make_agent({"after_tool": [OffloadHook({"fetch": AlwaysOffload()}, store=fallback)]})
    result = agent.run([ChatMessage.from_user("solo: fetch")])
    assert list(fallback.written) == references(result)
    assert fallback.written[references(result)[0]] == page("solo step 0 call 0")


async def test_a_run_without_any_store_fails_loudly() -> None:
    agent = make_agent({"after_tool": [OffloadHook({"*": AlwaysOffload()})]})
    with pytest.raises(ValueError, match=r"offload_context\(store\)"):
        await agent.run_async([ChatMessage.from_user("lost: fetch")])


def test_hook_context_holding_no_store_is_refused() -> None:
    agent = make_agent({"after_tool": [OffloadHook({"*": AlwaysOffload()})]})
    with pytest.raises(TypeError, match="must be a ToolResultStore"):
        agent.run([ChatMessage.from_user("odd: fetch")], hook_context={"tool_result_store": "s3://bucket"})


def test_the_hook_point_is_enforced() -> None:
    with pytest.raises(ValueError, match="only supports: after_tool"):
        make_agent({"before_llm": [OffloadHook({"*": AlwaysOffload()})]})


def test_the_write_path_runs_one_way() -> None:
    # The hook decides, `writes` writes (sync, async or behind), `pointers` only plans and renders: never calling back.
    assert "hooks.write" not in Path(pointers.__file__).read_text()


# Concurrency and the event loop


class BarrierStore(RecordingStore):
    """Every write waits until `parties` writes are in flight at once: sequential writes would never get through."""

    def __init__(self, parties: int) -> None:
        super().__init__()
        self.barrier = asyncio.Barrier(parties)
        self.tool_names: list[str] = []

    async def write_async(self, *, key: str, content: str | bytes, tool_name: str | None = None) -> str:
        async with asyncio.timeout(10):
            await self.barrier.wait()
        self.tool_names.append(str(tool_name))
        return self.write(key=key, content=content)


async def test_a_steps_results_and_blocks_are_written_concurrently() -> None:
    # Two results, one of them two blocks: three writes, released only if all three are in flight together.
    store = BarrierStore(parties=3)
    two_blocks = [TextContent(text="t" * 5000), ImageContent(base64_image=PNG, mime_type="image/png")]
    state = make_state([ChatMessage.from_user("go"), *tool_step(("fetch", "f" * 5000), ("render", two_blocks))])
    await OffloadHook({"*": AlwaysOffload()}, store=store).run_async(state)
    assert _offloaded_tools(state.data["messages"]) == ["fetch", "render"]
    assert sorted(store.tool_names) == ["fetch", "render", "render"]


async def test_a_sync_only_store_is_written_off_the_event_loop(tmp_path: Path) -> None:
    threads: list[int] = []

    class ThreadRecordingStore(FileSystemToolResultStore):
        def write(self, *, key: str, content: str | bytes) -> str:
            threads.append(threading.get_ident())
            return super().write(key=key, content=content)

    store = ThreadRecordingStore(tmp_path)
    agent = make_agent({"after_tool": [OffloadHook({"fetch": AlwaysOffload()})]})
    result = await agent.run_async([ChatMessage.from_user("disk: fetch+fetch")], hook_context=offload_context(store))
    assert len(references(result)) == 2
    assert threading.get_ident() not in threads
    assert [store.read(reference) for reference in references(result)] == [
        page("disk step 0 call 0"),
        page("disk step 0 call 1"),
    ]


# Real Agent on every backend


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_agent_offloads_into_the_runs_session(store: FsspecToolResultStore, mode: str) -> None:
    agent = make_agent({"after_tool": [OffloadHook({"fetch": OffloadOverChars(4000), "*": NeverOffload()})]})
    session = store.for_session("acme", f"chat-{mode}")
    messages = [ChatMessage.from_user("acme: fetch+notes+clock, fetch")]
    if mode == "sync":
        result = agent.run(messages, hook_context=offload_context(session))
    else:
        result = await agent.run_async(messages, hook_context=offload_context(session))

    refs = references(result)
    assert [session.read(reference) for reference in refs] == [page("acme step 0 call 0"), page("acme step 1 call 0")]
    assert sorted((record.reference, record.tool_name) for record in session.list()) == sorted(
        (reference, "fetch") for reference in refs
    )
    kept = [m.tool_call_result.result for m in tool_results(result) if not m.meta.get(OFFLOADED)]  # type: ignore[union-attr]
    assert kept == [page("acme step 0 call 1", lines=40), "12:00 for acme step 0 call 2"]
    assert result["messages"][-1].text == "acme: finished after 2 steps"
    # Nothing outside the run's session was written.
    assert {record.reference.rsplit("/", 1)[0] for record in store.list()} == {f"acme/chat-{mode}"}


@pytest.mark.s3
async def test_on_s3_an_offloaded_result_is_one_put(s3_server: Any, s3_requests: RequestLog) -> None:
    root = FsspecToolResultStore(f"{s3_server.bucket_url}/one-put", storage_options=s3_server.storage_options())
    await root.warm_up_async()
    agent = make_agent({"after_tool": [OffloadHook({"fetch": AlwaysOffload()})]})
    s3_requests.clear()
    result = await agent.run_async(
        [ChatMessage.from_user("s3: fetch+fetch+fetch, fetch")],
        hook_context=offload_context(root.for_session("acme", "chat-1")),
    )
    assert len(references(result)) == 4
    assert s3_requests.methods() == {"PUT": 4}
