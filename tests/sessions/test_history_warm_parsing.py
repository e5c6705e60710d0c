"""
A warm read parses only what it has not parsed before (issue 42): the cached conversation keeps its messages as
`ChatMessage`s, so a turn's CPU no longer grows with the conversation (it was 1.45x a turn held in memory at 500 and
1,000 turns on Ceph RGW, `benchmarks/turn_vs_memory.py`), and each request gets a list of its own.
"""

import pytest
from haystack.dataclasses import ChatMessage

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.sessions.conversation_cache import ConversationCache
from haystack_integrations.offload.sessions.history import SessionHistory


def _exchange(number: int) -> list[ChatMessage]:
    return [ChatMessage.from_user(f"question {number}"), ChatMessage.from_assistant(f"answer {number}")]


async def _turn(history: SessionHistory, number: int) -> list[ChatMessage]:
    turn = await history.begin(await history.read(), kind="message", text=f"question {number}")
    conversation = [*turn.conversation, *_exchange(number)]
    await history.finish(turn, status="completed", messages=conversation, reply=f"answer {number}")
    return conversation


@pytest.mark.parametrize("turns", [10, 200])
async def test_a_warm_read_parses_only_the_newest_turns_messages(turns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    root = FsspecToolResultStore(f"memory://warm-parsing-{turns}")
    history = SessionHistory(root.for_session("acme", "chat-1"), worker="w1", cache=ConversationCache())
    for number in range(1, turns + 1):
        conversation = await _turn(history, number)
    parsed = []
    from_dict = ChatMessage.from_dict.__func__  # type: ignore[attr-defined]

    def counting(cls: type[ChatMessage], data: dict) -> ChatMessage:  # type: ignore[type-arg]
        parsed.append(data)
        return from_dict(cls, data)

    monkeypatch.setattr(ChatMessage, "from_dict", classmethod(counting))
    state = await history.read()
    assert state.conversation == conversation
    # The newest turn's two messages, which its end added to the cache unparsed; before, all of them (20 and 400).
    assert len(parsed) == 2
    assert len((await history.read()).conversation) == 2 * turns and len(parsed) == 2


async def test_each_read_gets_a_list_of_its_own() -> None:
    history = SessionHistory(
        FsspecToolResultStore("memory://lists").for_session("a", "s"), worker="w", cache=ConversationCache()
    )
    await _turn(history, 1)
    first = (await history.read()).conversation
    first.append(ChatMessage.from_user("only in this request"))
    assert len((await history.read()).conversation) == 2
