"""
The reference server's history under injected S3 faults: a turn claimed or ended through a connection reset is still
its sender's, and a competitor's claim is still refused, because every turn document carries its writer's token.

Everything runs against moto's server over HTTP behind `FaultProxy`; ``roots.direct`` reads what really got stored.
"""

import json
from datetime import UTC, datetime

import pytest
from haystack.dataclasses import ChatMessage
from ops_helpers import FAST_RETRY, Roots

from haystack_integrations.offload.sessions.conversation_cache import ConversationCache
from haystack_integrations.offload.sessions.history import (
    CHAIN_LIMIT,
    SessionBusyError,
    SessionHistory,
    StaleHistoryError,
    TurnEnd,
)
from haystack_integrations.offload.testing.faults import Fault, FaultProxy
from haystack_integrations.offload.testing.local_s3 import RequestLog

pytestmark = pytest.mark.s3


async def test_one_reset_on_a_turn_start_leaves_the_turn_to_its_sender(
    roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog
) -> None:
    history = SessionHistory(roots.faulty.for_session("acme", "chat-1"), worker="web-1")
    state = await history.read()
    # The start lands, its answer is lost, aiohttp resends it and the resend's 412 is the first answer the store sees.
    fault_proxy.inject(Fault.RESET_AFTER, method="PUT")
    s3_requests.clear()
    turn = await history.begin(state, kind="message", text="hello")
    assert [request.status for request in s3_requests.filter(method="PUT")] == [200, 412]
    # The same for its end: the sender is not told its turn was abandoned, and the session is free at once (not 409
    # for the whole lease).
    fault_proxy.inject(Fault.RESET_AFTER, method="PUT")
    conversation = [ChatMessage.from_user("hello"), ChatMessage.from_assistant("hi")]
    await history.finish(turn, status="completed", messages=conversation, reply="hi")
    state = await SessionHistory(roots.direct.for_session("acme", "chat-1"), worker="reader").read()
    assert state.next_turn == 2 and state.conversation == conversation and not state.busy(datetime.now(UTC))
    assert state.last_end is not None and state.last_end.status == "completed"

    # A competitor whose claim of the same turn goes through a reset still loses: the bytes found are not its own.
    rival = SessionHistory(roots.faulty.for_session("acme", "chat-1"), worker="web-2")
    late = await rival.read()
    await history.begin(late, kind="message", text="second")
    fault_proxy.inject(Fault.RESET_AFTER, method="PUT")
    with pytest.raises(SessionBusyError):
        await rival.begin(late, kind="message", text="rival")
    assert [start.text for start in await history.starts()] == ["hello", "second"]


async def test_a_head_that_could_not_be_written_costs_a_longer_read_never_a_wrong_conversation(
    roots: Roots, fault_proxy: FaultProxy
) -> None:
    # Every try of the session's first head PUT (its tenth turn's) answers 503: the turn is recorded all the same, and
    # readers find its checkpoint by reading on from what the store does hold.
    history = SessionHistory(roots.faulty.for_session("acme", "chat-1"), worker="web-1", cache=ConversationCache())
    for number in range(1, CHAIN_LIMIT):
        await _claimed_turn(history, number)
    fault_proxy.inject(*[Fault.SLOW_DOWN] * FAST_RETRY.attempts, method="PUT", path_contains="/.history/head.json")
    turn = await history.begin(await history.read(), kind="message", text="hello")
    first = [*turn.conversation, ChatMessage.from_user("hello"), ChatMessage.from_assistant("hi")]
    end = await history.finish(turn, status="completed", messages=first, reply="hi")
    assert end.base == "checkpoint" and fault_proxy.faults.counts() == {Fault.SLOW_DOWN: FAST_RETRY.attempts}
    assert len(history.cache) == 0  # what the head is now is unknown here: nothing is kept
    cold = SessionHistory(roots.direct.for_session("acme", "chat-1"), worker="reader", cache=ConversationCache(0))
    state = await cold.read()
    assert state.conversation == first and state.next_turn == CHAIN_LIMIT + 1
    # The next turns, on a worker whose head write works, write one and carry the conversation on.
    conversation = first
    for number in (CHAIN_LIMIT + 1, CHAIN_LIMIT + 2):
        turn = await cold.begin(await cold.read(), kind="message", text=f"q{number}")
        conversation = [*turn.conversation, ChatMessage.from_user(f"q{number}"), ChatMessage.from_assistant("a")]
        await cold.finish(turn, status="completed", messages=conversation, reply="a")
    assert (await history.read()).conversation == conversation


def _exchange(number: int) -> list[ChatMessage]:
    return [ChatMessage.from_user(f"question {number} " + "q" * 300), ChatMessage.from_assistant(f"answer {number}")]


async def _claimed_turn(history: SessionHistory, number: int) -> tuple[list[ChatMessage], TurnEnd]:
    """One turn as `ChatService` claims it: on the read for a turn, and again on a full read if the claim was stale."""
    try:
        turn = await history.begin(await history.read(for_turn=True), kind="message", text=f"question {number}")
    except StaleHistoryError:
        turn = await history.begin(await history.read(), kind="message", text=f"question {number}")
    assert turn.start.turn == number
    conversation = [*turn.conversation, *_exchange(number)]
    return conversation, await history.finish(turn, status="completed", messages=conversation, reply="a")


async def test_a_worker_lost_between_a_segment_and_its_head_leaves_every_reader_the_right_conversation(
    roots: Roots, fault_proxy: FaultProxy, s3_requests: RequestLog
) -> None:
    # The turn's end (a segment) is stored and its head PUT fails every try: the store then holds what a worker killed
    # between the two leaves, a head naming the checkpoint before. Readers walk past it (docs/design.md).
    warm = SessionHistory(roots.faulty.for_session("acme", "chat-1"), worker="web-1", cache=ConversationCache())
    for number in range(1, 30):
        conversation, _ = await _claimed_turn(warm, number)
    documents = roots.direct.for_session("acme", "chat-1").documents("history")
    behind = json.loads(documents.get("head.json"))
    lost = SessionHistory(roots.faulty.for_session("acme", "chat-1"), worker="web-2", cache=ConversationCache())
    fault_proxy.inject(*[Fault.SLOW_DOWN] * FAST_RETRY.attempts, method="PUT", path_contains="/.history/head.json")
    conversation, end = await _claimed_turn(lost, 30)
    assert end.base == "segment" and fault_proxy.faults.counts() == {Fault.SLOW_DOWN: FAST_RETRY.attempts}
    assert json.loads(documents.get("head.json")) == behind and behind["checkpoint"] + CHAIN_LIMIT == 30

    # A cold reader: the head, a batch of ends from the checkpoint it names (all there, the segment last), a second
    # batch to find the newest end, the next start; never a LIST.
    cold = SessionHistory(roots.direct.for_session("acme", "chat-1"), worker="cold", cache=ConversationCache(0))
    s3_requests.clear()
    state = await cold.read()
    assert state.conversation == conversation and state.next_turn == 31 and state.log.segment == 30
    assert s3_requests.count(method="GET") == 1 + 2 * (CHAIN_LIMIT + 1) + 1
    assert s3_requests.count(query_contains="list-type") == 0

    # The worker that served turn 29 still holds the stale head: unchanged, so its claim of turn 30 is what finds the
    # turn taken; it reads the segment and claims turn 31, which is still due a head (CHAIN_LIMIT turns past the one
    # the head names): it writes a segment and the head, so the session heals at once.
    s3_requests.clear()
    conversation, end = await _claimed_turn(warm, 31)
    assert conversation == [*state.conversation, *_exchange(31)] and end.base == "segment" and end.segment == 31
    assert json.loads(documents.get("head.json"))["segment"] == 31
    assert [request.status for request in s3_requests.filter(method="PUT", path_contains="start")] == [412, 200]
    fresh = SessionHistory(roots.direct.for_session("acme", "chat-1"), worker="cold", cache=ConversationCache(0))
    assert (await fresh.read()).conversation == conversation
    assert [start.worker for start in await fresh.starts()] == ["web-1"] * 29 + ["web-2", "web-1"]
