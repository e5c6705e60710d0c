"""
How hooks write to a store they know only by its Protocols (`types`): Haystack's plain store, a third-party store with
an async twin with or without the tool name, this library's store, and write-behind.
"""

import asyncio
import threading
import uuid
from typing import Any

from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading import AlwaysOffload
from hook_scripts import OFFLOADED, RecordingStore, make_state, tool_step

from haystack_integrations.offload import FsspecToolResultStore, OffloadHook
from haystack_integrations.offload.hooks import writes
from haystack_integrations.offload.types import (
    AsyncWrites,
    ListableResults,
    RangedResults,
    SessionDocumentSource,
    TaggedWrites,
    WriteBehind,
)


class ThreadRecordingStore(RecordingStore):
    """Haystack's protocol only (sync ``write``, no tool name); remembers the thread of each write."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def write(self, *, key: str, content: str | bytes) -> str:
        self.threads.append(threading.get_ident())
        return super().write(key=key, content=content)


class UntaggedAsyncStore(RecordingStore):
    """A third-party store with an async twin that takes no tool name."""

    def __init__(self) -> None:
        super().__init__()
        self.awaited: list[str] = []

    async def write_async(self, *, key: str, content: str | bytes) -> str:
        self.awaited.append(key)
        return self.write(key=key, content=content)


class TaggedStore(RecordingStore):
    """`TaggedWrites` proper: both writes record the tool."""

    def __init__(self) -> None:
        super().__init__()
        self.tool_names: list[tuple[str, str | None]] = []

    def write(self, *, key: str, content: str | bytes, tool_name: str | None = None) -> str:  # type: ignore[override]
        self.tool_names.append(("sync", tool_name))
        return super().write(key=key, content=content)

    async def write_async(self, *, key: str, content: str | bytes, tool_name: str | None = None) -> str:
        self.tool_names.append(("async", tool_name))
        return super().write(key=key, content=content)


class KeywordsStore(RecordingStore):
    """A store whose writes take any keyword: it is given the tool name."""

    def __init__(self) -> None:
        super().__init__()
        self.keywords: list[dict[str, Any]] = []

    def write(self, *, key: str, content: str | bytes, **keywords: Any) -> str:  # type: ignore[override]
        self.keywords.append(keywords)
        return super().write(key=key, content=content)


def test_a_runtime_protocol_check_cannot_tell_a_tagged_async_twin_from_an_untagged_one() -> None:
    # Why the tool name is read from the method's parameters: by names alone both are TaggedWrites (and AsyncWrites).
    assert isinstance(UntaggedAsyncStore(), TaggedWrites) and isinstance(UntaggedAsyncStore(), AsyncWrites)
    assert isinstance(TaggedStore(), TaggedWrites) and isinstance(TaggedStore(), AsyncWrites)
    assert not isinstance(RecordingStore(), AsyncWrites) and not isinstance(RecordingStore(), WriteBehind)


def test_the_librarys_store_offers_every_protocol() -> None:
    session = FsspecToolResultStore(f"memory://protocols-{uuid.uuid4().hex}").for_session("acme", "chat-1")
    for protocol in (TaggedWrites, AsyncWrites, WriteBehind, RangedResults, ListableResults, SessionDocumentSource):
        assert isinstance(session, protocol), protocol.__name__
    assert writes.can_write_behind(session)


def test_a_plain_haystack_store_is_written_without_a_tool_name_and_off_the_event_loop() -> None:
    store = ThreadRecordingStore()
    assert writes.write_block(store, key="a.txt", content="a", tool_name="fetch") == "ref/a.txt"

    async def run() -> tuple[str, int]:
        reference = await writes.write_block_async(store, key="b.txt", content="b", tool_name="fetch")
        return reference, threading.get_ident()

    reference, loop_thread = asyncio.run(run())
    assert reference == "ref/b.txt"
    assert store.written == {"ref/a.txt": "a", "ref/b.txt": "b"}
    assert store.threads[1] != loop_thread  # the async run's write went to a worker thread
    assert not writes.can_write_behind(store)


async def test_an_untagged_async_twin_is_awaited_without_the_tool_name() -> None:
    store = UntaggedAsyncStore()
    assert await writes.write_block_async(store, key="a.txt", content="a", tool_name="fetch") == "ref/a.txt"
    assert writes.write_block(store, key="b.txt", content="b", tool_name="fetch") == "ref/b.txt"
    assert store.awaited == ["a.txt"]
    assert store.written == {"ref/a.txt": "a", "ref/b.txt": "b"}


async def test_an_untagged_async_twin_serves_the_offload_hook() -> None:
    store = UntaggedAsyncStore()
    state = make_state([ChatMessage.from_user("go"), *tool_step(("fetch", "f" * 5000), ("notes", "n" * 5000))])
    await OffloadHook({"*": AlwaysOffload()}, store=store).run_async(state)
    offloaded = [message for message in state.data["messages"] if message.meta.get(OFFLOADED)]
    assert len(offloaded) == 2
    assert len(store.awaited) == 2 and len(store.written) == 2


async def test_a_tagged_store_is_given_the_tool_name_by_both_writes() -> None:
    store = TaggedStore()
    writes.write_block(store, key="a.txt", content="a", tool_name="fetch")
    await writes.write_block_async(store, key="b.txt", content="b", tool_name="notes")
    assert store.tool_names == [("sync", "fetch"), ("async", "notes")]


async def test_a_store_taking_any_keyword_is_given_the_tool_name() -> None:
    store = KeywordsStore()
    writes.write_block(store, key="a.txt", content="a", tool_name="fetch")
    await writes.write_block_async(store, key="b.txt", content="b", tool_name="notes")  # sync only: in a thread
    assert store.keywords == [{"tool_name": "fetch"}, {"tool_name": "notes"}]


def test_capabilities_are_worked_out_once_per_store_class() -> None:
    writes._capabilities_of.cache_clear()
    for _ in range(3):
        writes.write_block(UntaggedAsyncStore(), key="a.txt", content="a", tool_name="fetch")
    info = writes._capabilities_of.cache_info()
    assert (info.misses, info.hits) == (1, 2)


async def test_write_behind_follows_the_protocol() -> None:
    class Behind(UntaggedAsyncStore):
        async def begin_write_async(self, *, key: str, content: str | bytes, tool_name: str | None = None) -> Any:
            raise NotImplementedError

    assert writes.can_write_behind(Behind())
    assert not writes.can_write_behind(UntaggedAsyncStore())
