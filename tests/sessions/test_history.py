"""
`SessionHistory` on every backend: turns claimed with conditional creates, so concurrent requests never interleave.

On S3 the races below are real conditional PUTs (``If-None-Match: *``) against moto's server over HTTP.
"""

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from haystack.dataclasses import ChatMessage, ToolCall

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.sessions import history as history_module
from haystack_integrations.offload.sessions.conversation_cache import ConversationCache
from haystack_integrations.offload.sessions.errors import HistoryRecordError
from haystack_integrations.offload.sessions.history import SessionBusyError, SessionHistory, TurnAbandonedError
from haystack_integrations.offload.sessions.history_records import TurnEnd
from haystack_integrations.offload.stores.compact_documents import decompress_document

# Also on the real S3 server's lane, both engines, and there with STS credentials and SSE-C keys per tenant.
pytestmark = [pytest.mark.real_s3, pytest.mark.isolated]


def _history(store: FsspecToolResultStore, worker: str = "w1", lease: float = 300.0) -> SessionHistory:
    return SessionHistory(store.for_session("acme", "chat-1"), worker=worker, lease=lease)


async def test_turns_carry_the_conversation_forward(store: FsspecToolResultStore) -> None:
    history = _history(store)
    state = await history.read()
    assert (state.next_turn, state.conversation, state.last_end) == (1, [], None)
    turn = await history.begin(state, kind="message", text="hello", actor="acme/alice")
    conversation = [ChatMessage.from_user("hello"), ChatMessage.from_assistant("hi there")]
    await history.finish(turn, status="completed", messages=conversation, reply="hi there")

    state = await _history(store, worker="w2").read()
    assert state.next_turn == 2 and state.conversation == conversation and not state.busy(state.last_end.ended_at)
    # A failed turn keeps the user's text in its start record and leaves the conversation as it was.
    failed = await history.begin(state, kind="message", text="this one fails")
    await history.finish(failed, status="failed", messages=None, error="RuntimeError: model down")
    state = await history.read()
    assert state.conversation == conversation and state.last_end is not None and state.last_end.status == "failed"
    assert [start.text for start in await history.starts()] == ["hello", "this one fails"]
    # Nothing of this session is visible from another session or tenant.
    assert (await SessionHistory(store.for_session("globex", "chat-1"), worker="w").read()).conversation == []


async def test_two_requests_claiming_the_same_turn_get_one_winner(store: FsspecToolResultStore) -> None:
    histories = [_history(store, worker=f"w{n}") for n in range(5)]
    states = [await history.read() for history in histories]  # everyone saw the same, empty history
    outcomes = await asyncio.gather(
        *(
            history.begin(state, kind="message", text=f"m{n}")
            for n, (history, state) in enumerate(zip(histories, states, strict=True))
        ),
        return_exceptions=True,
    )
    winners = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
    losers = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert len(winners) == 1 and len(losers) == 4
    assert all(isinstance(loser, SessionBusyError) for loser in losers)
    # While the winner runs, a fresh request is refused too, before claiming anything.
    state = await histories[0].read()
    assert state.busy(winners[0].start.started_at)
    with pytest.raises(SessionBusyError):
        await histories[1].begin(state, kind="message", text="late")
    assert [start.text for start in await histories[0].starts()] == [winners[0].start.text]


async def test_an_expired_turn_is_abandoned_and_its_late_result_is_dropped(store: FsspecToolResultStore) -> None:
    dead = _history(store, worker="dead", lease=1e-6)
    stuck = await dead.begin(await dead.read(), kind="message", text="never answered")
    alive = _history(store, worker="alive")
    state = await alive.read()
    assert state.open_start is not None and not state.busy(state.open_start.lease_until)
    turn = await alive.begin(state, kind="message", text="next")
    assert turn.start.turn == 2
    await alive.finish(turn, status="completed", messages=[ChatMessage.from_user("next")])
    # The dead worker comes back: its result must not be merged into a conversation that moved on.
    with pytest.raises(TurnAbandonedError):
        await dead.finish(stuck, status="completed", messages=[ChatMessage.from_user("never answered")])
    state = await alive.read()
    assert [message.text for message in state.conversation] == ["next"]


async def test_a_corrupt_history_document_is_a_clear_error(store: FsspecToolResultStore) -> None:
    session = store.for_session("acme", "chat-1")
    await _run_turns(_history(store), 1, 1, chars=10)
    session.documents("history").put("turn.00000001.end.json", b"{not json")
    with pytest.raises(HistoryRecordError, match=r"turn\.00000001\.end\.json"):
        await SessionHistory(session, worker="w", cache=ConversationCache(0)).read()
    session.documents("history").put("head.json", b"[]")
    with pytest.raises(HistoryRecordError, match=r"head\.json"):
        await SessionHistory(session, worker="w", cache=ConversationCache(0)).read()


async def test_an_end_stores_the_reply_once_and_leaves_out_fields_at_their_defaults(
    store: FsspecToolResultStore,
) -> None:
    # ChatService records the reply as the last message's text: stored twice, it was a third of a plain exchange.
    history = _history(store)
    reply = "the answer is " + "a" * 300
    turn = await history.begin(await history.read(), kind="message", text="q")
    await history.finish(
        turn, status="completed", messages=[ChatMessage.from_user("q"), ChatMessage.from_assistant(reply)], reply=reply
    )
    stored = store.for_session("acme", "chat-1").documents("history").get("turn.00000001.end.json")
    document = decompress_document(stored)
    assert document.count(reply.encode()) == 1 and len(stored) < len(document)  # and gzipped
    assert b'"error"' not in document and b'"segment"' not in document
    # Read back, a cold worker's conversation ends with the reply all the same.
    cold = SessionHistory(store.for_session("acme", "chat-1"), worker="w2", cache=ConversationCache(0))
    assert (await cold.read()).conversation[-1].text == reply


def test_history_needs_a_session_store_and_a_positive_lease(store: FsspecToolResultStore) -> None:
    with pytest.raises(ValueError, match="one session"):
        SessionHistory(store.for_tenant("acme"), worker="w")
    with pytest.raises(ValueError, match="lease"):
        SessionHistory(store.for_session("acme", "chat-1"), worker="w", lease=0)


# Append, do not snapshot


def _exchange(turn: int, chars: int) -> list[ChatMessage]:
    """One turn's new messages: a question, a tool call and its result, and an answer, `chars` characters each."""
    call = ToolCall(tool_name="search", arguments={"query": f"q{turn}", "pages": [1, 2]}, id=f"call_{turn}")
    return [
        ChatMessage.from_user(f"question {turn} " + "q" * chars),
        ChatMessage.from_assistant(tool_calls=[call], meta={"model": "mock", "usage": {"prompt_tokens": turn}}),
        ChatMessage.from_tool(f"result {turn} " + "r" * chars, origin=call),
        ChatMessage.from_assistant(f"answer {turn} " + "a" * chars),
    ]


async def _run_turns(history: SessionHistory, first: int, last: int, chars: int) -> list[ChatMessage]:
    conversation: list[ChatMessage] = []
    for number in range(first, last + 1):
        turn = await history.begin(await history.read(), kind="message", text=f"question {number}")
        conversation = [*turn.conversation, *_exchange(number, chars)]
        await history.finish(turn, status="completed", messages=conversation, reply=f"answer {number}")
    return conversation


def _stored_bytes(store: FsspecToolResultStore) -> int:
    documents = store.for_session("acme", "chat-1").documents("history")
    return sum(len(documents.get(name)) for name in documents.list())


def _end(store: FsspecToolResultStore, turn: int) -> dict[str, object]:
    # As the history reads it: a stored end leaves out the fields at their defaults.
    documents = store.for_session("acme", "chat-1").documents("history")
    return TurnEnd.model_validate_json(decompress_document(documents.get(f"turn.{turn:08d}.end.json"))).model_dump()


@pytest.mark.slow
async def test_stored_history_grows_with_the_conversation_not_its_square(store: FsspecToolResultStore) -> None:
    history = _history(store)
    await _run_turns(history, 1, 30, chars=1000)
    after_30 = _stored_bytes(store)
    conversation = await _run_turns(history, 31, 60, chars=1000)
    after_60 = _stored_bytes(store)
    # Snapshots stored 60 x 61 / 2 turns' worth (3.7x the bytes of 30 turns, 30x the conversation); appends with
    # doubling checkpoints stay within a few conversations, and twice the turns cost about twice the bytes.
    size = len(json.dumps([message.to_dict() for message in conversation]))
    assert after_60 < 4 * size
    assert after_60 < 2.5 * after_30
    assert (await history.read()).conversation == conversation
    # Turn 60 holds a segment or checkpoint (one turn in CHAIN_LIMIT does, with the head); the turn before it appends.
    assert _end(store, 59)["base"] == "append" and len(_end(store, 59)["messages"]) == 4  # type: ignore[arg-type]


async def test_a_rewritten_conversation_is_a_checkpoint_and_reads_back_exactly(store: FsspecToolResultStore) -> None:
    history = _history(store)
    await _run_turns(history, 1, 1, chars=500)  # a first turn large enough that the next two append to it
    await _run_turns(history, 2, 3, chars=50)
    assert [_end(store, turn)["base"] for turn in (1, 2, 3)] == ["checkpoint", "append", "append"]
    # A compaction-style turn: earlier messages are rewritten (the old tool result offloaded to a pointer).
    turn = await history.begin(await history.read(), kind="message", text="question 4")
    compacted = [
        ChatMessage.from_tool("[offloaded: see result 1]", origin=message.tool_call_result.origin)
        if message.tool_call_result is not None and message.tool_call_result.result.startswith("result 1 ")
        else message
        for message in turn.conversation
    ]
    assert compacted != turn.conversation
    conversation = [*compacted, *_exchange(4, 50)]
    await history.finish(turn, status="completed", messages=conversation, reply="answer 4")
    assert _end(store, 4)["base"] == "checkpoint" and len(_end(store, 4)["messages"]) == 16  # type: ignore[arg-type]
    # Later turns append to the rewritten conversation; a failed turn and an unchanged one store no messages.
    conversation = await _run_turns(history, 5, 6, chars=50)
    failed = await history.begin(await history.read(), kind="message", text="fails")
    await history.finish(failed, status="failed", messages=None, error="boom")
    unchanged = await history.begin(await history.read(), kind="resume")
    await history.finish(unchanged, status="failed", messages=list(unchanged.conversation), error="nothing ran")
    assert [_end(store, turn)["base"] for turn in (5, 6)] == ["append", "append"]
    assert _end(store, 7)["messages"] is None and _end(store, 8)["messages"] == []
    state = await _history(store, worker="another").read()
    assert state.conversation == conversation and state.conversation[2].tool_call_result is not None
    assert state.conversation[2].tool_call_result.result == "[offloaded: see result 1]"
    assert state.next_turn == 9 and state.last_end is not None and state.last_end.status == "failed"


async def test_a_cold_read_fetches_the_head_then_its_chain_at_once(store: FsspecToolResultStore) -> None:
    history = _history(store)
    await _run_turns(history, 1, 40, chars=200)
    bases = [_end(store, turn)["base"] for turn in range(1, 41)]
    # Checkpoints at least double in size; in between, a segment every CHAIN_LIMIT turns bounds what a read gets.
    assert "segment" in bases and bases.count("checkpoint") <= 6
    head = json.loads(history.documents.get("head.json"))
    base = max(head["checkpoint"], head.get("segment", 0))
    assert 40 - base < history_module.CHAIN_LIMIT
    read: list[str] = []
    cold = SessionHistory(history.store, worker="cold", cache=ConversationCache(0))
    get_async = cold.documents.get_async

    async def counting(name: str) -> bytes:
        read.append(name)
        return await get_async(name)

    cold.documents.get_async = counting  # type: ignore[method-assign]
    state = await cold.read()
    assert state.conversation == (await history.read()).conversation and state.next_turn == 41
    batch = range(base, base + history_module.CHAIN_LIMIT + 1)
    checkpoint = [f"turn.{head['checkpoint']:08d}.end.json"] if head.get("segment") else []
    expected = ["head.json", *checkpoint, *(f"turn.{turn:08d}.end.json" for turn in batch), "turn.00000041.start.json"]
    assert sorted(read) == sorted(expected)


async def test_two_claims_with_the_same_content_still_get_one_winner(
    store: FsspecToolResultStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Same worker name, same text, same clock reading: only the writer token tells the two claims apart, so that
    # "already exists" read back is recognised as the other request's claim, not as our own create.
    moment = datetime.now(UTC)
    monkeypatch.setattr(history_module, "_now", lambda: moment)
    histories = [_history(store, worker="web-1") for _ in range(2)]
    state = await histories[0].read()
    outcomes = await asyncio.gather(
        *(history.begin(state, kind="message", text="same") for history in histories), return_exceptions=True
    )
    assert sum(not isinstance(outcome, BaseException) for outcome in outcomes) == 1
    assert sum(isinstance(outcome, SessionBusyError) for outcome in outcomes) == 1


async def test_an_abandoned_turn_keeps_the_conversation_and_the_next_turn_appends(
    store: FsspecToolResultStore,
) -> None:
    history = _history(store)
    await _run_turns(history, 1, 1, chars=500)
    conversation = await _run_turns(history, 2, 2, chars=20)
    dead = _history(store, worker="dead", lease=1e-6)
    await dead.begin(await dead.read(), kind="message", text="never answered")
    alive = _history(store, worker="alive")
    turn = await alive.begin(await alive.read(), kind="message", text="next")
    assert turn.start.turn == 4 and turn.conversation == conversation
    assert _end(store, 3)["status"] == "abandoned" and _end(store, 3)["checkpoint"] == 1
    conversation = [*turn.conversation, *_exchange(4, 20)]
    await alive.finish(turn, status="completed", messages=conversation)
    assert _end(store, 4)["base"] == "append"
    assert (await alive.read()).conversation == conversation


def test_history_ends_carry_a_token_and_time_moves_on() -> None:
    # Tokens are unique per record, so no two writers' documents are ever byte-identical.
    at = datetime.now(UTC)
    starts = [
        history_module.TurnStart(turn=1, kind="message", worker="w", started_at=at, lease_until=at + timedelta(1))
        for _ in range(2)
    ]
    assert starts[0].token != starts[1].token and starts[0].model_dump_json() != starts[1].model_dump_json()
