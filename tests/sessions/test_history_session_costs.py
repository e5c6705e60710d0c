"""
What a session's history costs over its whole life, counted on moto's S3 server (issue 42): short sessions included,
whose first turns are new, and a cold read's bytes against the text the model is sent.

A turn is what `ChatService` does per message: read the history for a turn (``read(for_turn=True)``), claim the next
turn, record its end. Prices are AWS S3's list prices; the turn's 4 result PUTs (the issue's reference turn) are added.
"""

import uuid
from collections import Counter

import pytest
from haystack.dataclasses import ChatMessage

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.sessions.conversation_cache import ConversationCache
from haystack_integrations.offload.sessions.errors import StaleHistoryError
from haystack_integrations.offload.sessions.history import CHAIN_LIMIT, SessionHistory
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

pytestmark = pytest.mark.s3

DOLLARS_PER_REQUEST = {"PUT": 0.005 / 1000, "LIST": 0.005 / 1000, "GET": 0.0004 / 1000}
RESULT_PUTS = 4
"""The reference turn's offloaded results, one PUT each: $20 of the $31 a million turns may cost."""


def _store(server: LocalS3Server) -> FsspecToolResultStore:
    root = FsspecToolResultStore(f"{server.bucket_url}/{uuid.uuid4().hex}", storage_options=server.storage_options())
    return root.for_session("acme", "chat-1")


def _exchange(number: int) -> list[ChatMessage]:
    # As benchmarks/scale.py: two messages of 300 characters.
    return [
        ChatMessage.from_user(f"question {number} " + "q" * 300),
        ChatMessage.from_assistant(f"answer {number} " + "a" * 300),
    ]


async def _turn(history: SessionHistory, number: int) -> list[ChatMessage]:
    try:
        turn = await history.begin(await history.read(for_turn=True), kind="message", text=f"question {number}")
    except StaleHistoryError:
        turn = await history.begin(await history.read(), kind="message", text=f"question {number}")
    assert turn.start.turn == number
    conversation = [*turn.conversation, *_exchange(number)]
    await history.finish(turn, status="completed", messages=conversation, reply=f"answer {number}")
    return conversation


def _history_requests(log: RequestLog) -> Counter[str]:
    # The session's history only: a store's first conditional create also checks, once per process and root, that the
    # storage refuses a second one (`check_exclusive_creates`), which is no turn's cost.
    return Counter(
        "LIST" if "list-type" in request.query else request.method
        for request in log.snapshot()
        if "/.history/" in request.path or "list-type" in request.query
    )


@pytest.mark.slow
async def test_a_whole_session_costs_at_most_31_dollars_a_million_turns_at_2_10_and_50_turns(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    for length in (2, 10, 50):
        history = SessionHistory(_store(s3_server), worker="w1", cache=ConversationCache())
        s3_requests.clear()
        for number in range(1, length + 1):
            await _turn(history, number)
        requests = _history_requests(s3_requests)
        dollars = sum(DOLLARS_PER_REQUEST[kind] * count for kind, count in requests.items())
        per_million = 1e6 * (dollars / length + RESULT_PUTS * DOLLARS_PER_REQUEST["PUT"])
        assert per_million <= 31, (length, per_million, requests)  # before: $33.10, $31.94 and $31.21
        # Each turn: its claim and its end (conditional creates), one GET (the head, or before the session has one its
        # newest end; the first turn also looks for a first claim). The head is written by one turn in CHAIN_LIMIT,
        # and never in a session's first CHAIN_LIMIT - 1 turns (it was written at turns 1, 3 and 6 of 10).
        assert requests == Counter({"PUT": 2 * length + length // CHAIN_LIMIT, "GET": length + 1}), length


@pytest.mark.slow
async def test_a_cold_read_fetches_at_most_1_2x_the_text_the_model_is_sent_at_10_and_200_turns(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    ratios = {}
    for size in (10, 200):
        store = _store(s3_server)
        seed = SessionHistory(store, worker="seed", cache=ConversationCache())
        for number in range(1, size + 1):
            conversation = await _turn(seed, number)
        s3_requests.clear()
        state = await SessionHistory(store, worker="cold", cache=ConversationCache(0)).read()
        assert state.conversation == conversation
        read = sum(request.bytes_sent for request in s3_requests.snapshot() if request.status == 200)
        ratios[size] = read / sum(len(message.text or "") for message in conversation)
    # The head, the checkpoint and segment it names and the ends after them, each message stored without the fields
    # Haystack leaves at their defaults: before, 1.38x at 10 turns and 1.22x at 200.
    assert ratios[10] <= 1.2 and ratios[200] <= 1.15, ratios  # now 1.15x and 1.11x
