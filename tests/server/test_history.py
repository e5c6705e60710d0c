"""
`SessionHistory` on every backend: turns claimed with conditional creates, so concurrent requests never interleave.

On S3 the races below are real conditional PUTs (``If-None-Match: *``) against moto's server over HTTP.
"""

import asyncio

import pytest
from haystack.dataclasses import ChatMessage

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.server.history import (
    HistoryRecordError,
    SessionBusyError,
    SessionHistory,
    TurnAbandonedError,
)


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
    session.documents("history").put("turn.00000001.end.json", b"{not json")
    with pytest.raises(HistoryRecordError, match=r"turn\.00000001\.end\.json"):
        await SessionHistory(session, worker="w").read()


def test_history_needs_a_session_store_and_a_positive_lease(store: FsspecToolResultStore) -> None:
    with pytest.raises(ValueError, match="one session"):
        SessionHistory(store.for_tenant("acme"), worker="w")
    with pytest.raises(ValueError, match="lease"):
        SessionHistory(store.for_session("acme", "chat-1"), worker="w", lease=0)
