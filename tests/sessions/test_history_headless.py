"""
A session's first turns, before it has a head document (issue 42: a short session pays no head PUT), on every backend.

Cold reads fold those turns from turn 1; a worker's cached conversation is told from a purged and re-created session's
by its newest end. Messages are stored without the fields Haystack leaves at their defaults, and read back exactly.
"""

import json
from datetime import UTC, datetime

import pytest
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.dataclasses.chat_message import TextContent

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.sessions.conversation_cache import ConversationCache
from haystack_integrations.offload.sessions.history import (
    CHAIN_LIMIT,
    SessionHistory,
    StaleHistoryError,
    TurnEnd,
    TurnStart,
)
from haystack_integrations.offload.stores import end_session_async
from haystack_integrations.offload.stores.compact_documents import decompress_document

# Also on the real S3 server's lane, both engines, and there with STS credentials and SSE-C keys per tenant.
pytestmark = [pytest.mark.real_s3, pytest.mark.isolated]


def _session(store: FsspecToolResultStore) -> FsspecToolResultStore:
    return store.for_session("acme", "chat-1")


def _history(store: FsspecToolResultStore, worker: str, cache: ConversationCache | None = None) -> SessionHistory:
    return SessionHistory(_session(store), worker=worker, cache=ConversationCache() if cache is None else cache)


def _exchange(number: int, worker: str = "") -> list[ChatMessage]:
    return [ChatMessage.from_user(f"question {number} {worker}"), ChatMessage.from_assistant(f"answer {number}")]


async def _turn(history: SessionHistory, number: int, messages: list[ChatMessage] | None = None) -> list[ChatMessage]:
    try:
        turn = await history.begin(await history.read(for_turn=True), kind="message", text=f"question {number}")
    except StaleHistoryError:  # the cached conversation was behind: read what the other workers added, claim again
        turn = await history.begin(await history.read(), kind="message", text=f"question {number}")
    assert turn.start.turn == number
    conversation = [*turn.conversation, *(messages or _exchange(number, history.worker))]
    await history.finish(turn, status="completed", messages=conversation, reply=f"answer {number}")
    return conversation


def _names(store: FsspecToolResultStore) -> list[str]:
    return _session(store).documents("history").list()


def _led_to(store: FsspecToolResultStore) -> int:
    """The turn the session's head leads cold reads to."""
    head = json.loads(_session(store).documents("history").get("head.json"))
    return max(int(head["checkpoint"]), int(head.get("segment", 0)))  # a segment of 0 is left out


async def test_a_session_has_no_head_before_its_tenth_turn_and_a_cold_read_folds_it_from_turn_1(
    store: FsspecToolResultStore,
) -> None:
    history = _history(store, "w1")
    for number in range(1, CHAIN_LIMIT):
        conversation = await _turn(history, number)
    assert "head.json" not in _names(store)
    state = await _history(store, "cold", ConversationCache(0)).read()
    assert state.conversation == conversation and state.next_turn == CHAIN_LIMIT
    # The tenth turn writes the first head: from then on a cold read starts where it points.
    conversation = await _turn(_history(store, "cold", ConversationCache(0)), CHAIN_LIMIT)
    assert _led_to(store) == CHAIN_LIMIT
    assert (await _history(store, "cold", ConversationCache(0)).read()).conversation == conversation
    assert (await history.read()).conversation == conversation  # w1's cached conversation saw the head appear


async def test_a_cached_session_without_a_head_is_told_from_a_purged_and_recreated_one_by_its_newest_end(
    store: FsspecToolResultStore,
) -> None:
    first = _history(store, "w1")
    for number in range(1, 4):
        await _turn(first, number)
    await end_session_async(_session(store), documents=True)
    # Purged: the newest end cached here is gone. The claim of turn 4, made beside that check, succeeds, so it is
    # taken back; the turn is claimed again on a fresh read, as turn 1.
    await _refused_and_taken_back(first, 4, store)
    state = await first.read()
    assert (state.next_turn, state.conversation, state.checked) == (1, [], True)
    for number in range(1, 4):
        await _turn(first, number)
    await end_session_async(_session(store), documents=True)
    # Re-created by another worker with as many turns: the same names, other ends.
    other = _history(store, "w2")
    for number in range(1, 4):
        recreated = await _turn(other, number)
    # However `first` now reads for a turn (its cache has seen a stale claim: it may read the next start first), the
    # turn it claims is the re-created session's fourth, on its conversation, and no claim is left behind.
    try:
        turn = await first.begin(await first.read(for_turn=True), kind="message", text="again")
    except StaleHistoryError:
        turn = await first.begin(await first.read(), kind="message", text="again")
    assert (turn.start.turn, turn.conversation) == (4, recreated)


async def _refused_and_taken_back(history: SessionHistory, turn: int, store: FsspecToolResultStore) -> None:
    """A claim on `history`'s cached conversation, in a session purged under it: refused, and nothing left claimed."""
    with pytest.raises(StaleHistoryError):
        await history.begin(await history.read(for_turn=True), kind="message", text="late")
    assert f"turn.{turn:08d}.start.json" not in _names(store)


async def test_a_cached_session_without_a_head_follows_another_worker_past_the_first_head(
    store: FsspecToolResultStore,
) -> None:
    first, other = _history(store, "w1"), _history(store, "w2")
    for number in range(1, 4):
        await _turn(first, number)
    for number in range(4, CHAIN_LIMIT + 5):
        conversation = await _turn(other, number)
    assert "head.json" in _names(store)
    # The claim on the cached conversation is refused; the read after it finds the head and starts there.
    assert await _turn(first, CHAIN_LIMIT + 5) == [*conversation, *_exchange(CHAIN_LIMIT + 5, "w1")]
    conversation = await _turn(other, CHAIN_LIMIT + 6)
    state = await first.read()
    assert state.conversation == conversation and state.next_turn == CHAIN_LIMIT + 7


async def test_a_turn_that_stores_no_messages_when_the_head_is_due_still_moves_it(
    store: FsspecToolResultStore,
) -> None:
    history = _history(store, "w1")
    for number in range(1, CHAIN_LIMIT):
        conversation = await _turn(history, number)
    failed = await history.begin(await history.read(), kind="message", text="fails")
    await history.finish(failed, status="failed", messages=None, error="boom")
    # Otherwise every cold read would fold the session from turn 1 until a later turn stored messages.
    assert _led_to(store) == CHAIN_LIMIT
    state = await _history(store, "cold", ConversationCache(0)).read()
    assert state.conversation == conversation and state.last_end is not None and state.last_end.status == "failed"


async def test_messages_are_stored_without_the_fields_left_at_their_defaults_and_read_back_exactly(
    store: FsspecToolResultStore,
) -> None:
    call = ToolCall(tool_name="search", arguments={"query": "q", "pages": [1, 2]}, id="call_1")
    messages = [
        ChatMessage.from_system("Be brief."),
        ChatMessage.from_user("plain"),
        ChatMessage.from_user("named", name="alice"),
        ChatMessage.from_user(content_parts=[TextContent("two"), TextContent("parts")]),
        ChatMessage.from_assistant(tool_calls=[call], meta={"model": "mock", "usage": {"prompt_tokens": 3}}),
        ChatMessage.from_tool("result", origin=call),
        ChatMessage.from_assistant("", meta={"finish_reason": "stop"}),
    ]
    conversation = await _turn(_history(store, "w1"), 1, messages)
    stored = json.loads(decompress_document(_session(store).documents("history").get("turn.00000001.end.json")))[
        "messages"
    ]
    assert stored[1] == {"role": "user", "content": "plain"}
    assert stored[2] == {"role": "user", "name": "alice", "content": "named"}
    assert stored[3]["content"] == [{"text": "two"}, {"text": "parts"}]
    assert "meta" in stored[4] and "name" not in stored[4]
    state = await _history(store, "cold", ConversationCache(0)).read()
    assert state.conversation == conversation
    assert [message.to_dict() for message in state.conversation] == [message.to_dict() for message in conversation]


async def test_a_short_session_stored_before_head_documents_reads_from_turn_1_and_carries_on(
    store: FsspecToolResultStore,
) -> None:
    # What the layout before heads wrote: starts, ends with Haystack's whole dicts and no segment field, and no head.
    documents = _session(store).documents("history")
    conversation: list[ChatMessage] = []
    at = datetime.now(UTC)
    for number in range(1, 6):
        start = TurnStart(turn=number, kind="message", text=f"q{number}", worker="old", started_at=at, lease_until=at)
        documents.put(f"turn.{number:08d}.start.json", start.model_dump_json().encode())
        added = _exchange(number, "old")
        end = TurnEnd(
            turn=number,
            status="completed",
            base="checkpoint" if number == 1 else "append",
            messages=[message.to_dict() for message in ([*conversation, *added] if number == 1 else added)],
            checkpoint=1,
            worker="old",
            ended_at=at,
        )
        documents.put(f"turn.{number:08d}.end.json", end.model_dump_json(exclude={"segment"}).encode())
        conversation = [*conversation, *added]
    state = await _history(store, "new", ConversationCache(0)).read()
    assert state.conversation == conversation and state.next_turn == 6
    history = _history(store, "new")
    assert await _turn(history, 6) == [*conversation, *_exchange(6, "new")]
    assert await _turn(history, 7) == [*conversation, *_exchange(6, "new"), *_exchange(7, "new")]
