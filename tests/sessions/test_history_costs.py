"""
What a turn of `SessionHistory` costs on S3, counted on moto's server: the same at turn 10 as at turn 200.

A turn is what `ChatService` does per message: read the history for a turn (``read(for_turn=True)``), claim the next
turn, record its end; a claim refused on a cached conversation (`StaleHistoryError`) reads again and claims again.
"""

import json
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage

from haystack_integrations.offload import FsspecToolResultStore, RetryPolicy, StorageError
from haystack_integrations.offload.sessions import ChatService
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
from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from haystack_integrations.offload.testing.relay import LatencyProxy

pytestmark = pytest.mark.s3


def _store(server: LocalS3Server) -> FsspecToolResultStore:
    root = FsspecToolResultStore(f"{server.bucket_url}/{uuid.uuid4().hex}", storage_options=server.storage_options())
    return root.for_session("acme", "chat-1")


def _exchange(number: int) -> list[ChatMessage]:
    return [ChatMessage.from_user(f"question {number} " + "q" * 300), ChatMessage.from_assistant(f"answer {number}")]


async def _turn(history: SessionHistory, number: int) -> list[ChatMessage]:
    try:
        turn = await history.begin(await history.read(for_turn=True), kind="message", text=f"question {number}")
    except StaleHistoryError:  # the cached conversation was behind: read what the other workers added, claim again
        turn = await history.begin(await history.read(), kind="message", text=f"question {number}")
    assert turn.start.turn == number
    conversation = [*turn.conversation, *_exchange(number)]
    await history.finish(turn, status="completed", messages=conversation, reply=f"answer {number}")
    return conversation


async def _session_at(server: LocalS3Server, turns: int) -> tuple[FsspecToolResultStore, list[ChatMessage]]:
    store = _store(server)
    history = SessionHistory(store, worker="seed", cache=ConversationCache())
    conversation: list[ChatMessage] = []
    for number in range(1, turns + 1):
        conversation = await _turn(history, number)
    return store, conversation


async def _measured_turn(
    store: FsspecToolResultStore, log: RequestLog, history: SessionHistory, number: int
) -> tuple[Counter[str], int]:
    log.clear()
    await _turn(history, number)
    requests = [
        request for request in log.snapshot() if "/acme/chat-1/" in request.path or "list-type" in request.query
    ]
    kinds = Counter("LIST" if "list-type" in request.query else request.method for request in requests)
    reads = sum(request.bytes_sent for request in requests if request.method == "GET" and request.status == 200)
    return kinds, reads


@pytest.mark.slow
async def test_a_turn_on_the_worker_that_served_the_last_one_costs_the_same_at_10_and_200_turns(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    costs = {}
    for size in (10, 200):
        store, _ = await _session_at(s3_server, size)
        warm = SessionHistory(store, worker="warm", cache=ConversationCache())
        await _turn(warm, size + 1)  # the worker now holds the session's conversation
        costs[size] = await _measured_turn(store, s3_requests, warm, size + 2)
    (methods_10, read_10), (methods_200, read_200) = costs[10], costs[200]
    # The head alone, one small GET whatever the length, and never a LIST: the claim (a conditional create) is what
    # tells whether another worker ran the next turn, so no GET probes for it.
    assert methods_10["GET"] == methods_200["GET"] == 1 and methods_10["LIST"] == methods_200["LIST"] == 0
    assert read_200 <= 1.5 * read_10
    assert methods_10["PUT"] <= 3 and methods_200["PUT"] <= 3  # the claim, the end, and maybe the head


@pytest.mark.slow
async def test_a_turn_on_a_cold_worker_costs_the_same_at_10_and_200_turns(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    costs, sent = {}, {}
    for size in (10, 200):
        store, conversation = await _session_at(s3_server, size)
        cold = SessionHistory(store, worker="cold", cache=ConversationCache(0))
        costs[size] = await _measured_turn(store, s3_requests, cold, size + 1)
        sent[size] = len(json.dumps([message.to_dict() for message in conversation]))
    (methods_10, read_10), (methods_200, read_200) = costs[10], costs[200]
    # The head, the checkpoint, one batch of ends from the newest segment, the next claim: no LIST at any length.
    assert methods_10["LIST"] == methods_200["LIST"] == 0
    assert abs(methods_200["GET"] - methods_10["GET"]) <= 1 and methods_200["GET"] <= CHAIN_LIMIT + 4
    # It reads about the conversation the model is sent, not the history behind it (at 10 short turns each end's own
    # fields weigh a little more).
    assert read_10 <= 1.25 * sent[10] and read_200 <= 1.2 * sent[200]


async def test_a_cached_conversation_follows_turns_run_by_other_workers(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    store, _ = await _session_at(s3_server, 20)  # checkpoint at 16: the next turns append
    cache = ConversationCache()
    first = SessionHistory(store, worker="w1", cache=cache)
    await _turn(first, 21)
    other = SessionHistory(store, worker="w2", cache=ConversationCache())
    await _turn(other, 22)
    conversation = await _turn(other, 23)
    assert [
        json.loads(decompress_document(store.documents("history").get(f"turn.{n}.end.json")))["base"]
        for n in ("00000022", "00000023")
    ] == ["append", "append"]
    s3_requests.clear()
    state = await first.read()
    assert state.conversation == conversation and state.next_turn == 24
    assert s3_requests.count(method="GET") == 2 + 2 * 2  # head and claim; then an end and a claim per turn behind


async def test_a_claim_on_a_cached_conversation_that_is_behind_is_refused_and_the_turn_read_again(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    store, _ = await _session_at(s3_server, 20)
    first = SessionHistory(store, worker="w1", cache=ConversationCache())
    await _turn(first, 21)
    conversation = await _turn(SessionHistory(store, worker="w2", cache=ConversationCache()), 22)  # an append
    s3_requests.clear()
    stale = await first.read(for_turn=True)
    assert not stale.checked and stale.next_turn == 22
    # The claim is what finds it taken: nothing claimed, nothing run, turn 22 still w2's. The head alone was read
    # beside it (one GET), unchanged by an append: the cached conversation could not show turn 22.
    with pytest.raises(StaleHistoryError):
        await first.begin(stale, kind="message", text="late")
    assert s3_requests.count(method="GET", path_contains="head.json") == 1
    assert json.loads(store.documents("history").get("turn.00000022.start.json"))["worker"] == "w2"
    state = await first.read()
    assert state.checked and state.conversation == conversation and state.next_turn == 23
    assert await _turn(first, 23) == [*conversation, *_exchange(23)]


async def test_a_claim_first_read_tells_a_purged_and_recreated_session_by_its_head(s3_server: LocalS3Server) -> None:
    store, _ = await _session_at(s3_server, 3)
    history = SessionHistory(store, worker="w1", cache=ConversationCache())
    await _turn(history, 4)
    await end_session_async(store, documents=True)
    # Purged: no head. The claim of turn 5, made beside that check, succeeded, so it is taken back, and the turn is
    # claimed again on a fresh read, as turn 1.
    with pytest.raises(StaleHistoryError):
        await history.begin(await history.read(for_turn=True), kind="message", text="late")
    assert "turn.00000005.start.json" not in store.documents("history").list()
    state = await history.read()
    assert (state.next_turn, state.conversation, state.checked) == (1, [], True)
    await _turn(history, 1)
    await end_session_async(store, documents=True)
    # Re-created by another worker with two turns: its head is not the one cached here (tokens differ).
    other = SessionHistory(store, worker="w2", cache=ConversationCache())
    await _turn(other, 1)
    recreated = await _turn(other, 2)
    # However this worker now reads for a turn (its cache has seen a stale claim: it may read the next start first),
    # the turn it claims is the re-created session's third, on its conversation.
    try:
        turn = await history.begin(await history.read(for_turn=True), kind="message", text="again")
    except StaleHistoryError:
        turn = await history.begin(await history.read(), kind="message", text="again")
    assert (turn.start.turn, turn.conversation) == (3, recreated)


async def test_workers_taking_turns_about_claim_first_at_most_once_each(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    # Round-robin routing: each worker's cached conversation is behind at every visit. A refused claim costs a PUT,
    # so after one a worker checks the next turn's start first again (as before claiming first existed).
    store = _store(s3_server)
    caches = [ConversationCache(), ConversationCache()]
    services = [_service(cache) for cache in caches]
    refused: Counter[int] = Counter()
    for number in range(1, 17):
        s3_requests.clear()
        outcome = await services[number % 2].send_message(store, f"question {number} " + "q" * 300)
        assert outcome.turn == number
        claims = s3_requests.filter(method="PUT", path_contains="/.history/")
        refused[number % 2] += sum(request.status == 412 for request in claims)
    assert max(refused.values()) <= 1 and not any(cache.claims_first for cache in caches)
    texts = [message.text for message in (await services[0].transcript(store)).messages if message.role == "user"]
    assert texts == [f"question {number} " + "q" * 300 for number in range(1, 17)]


async def test_a_cached_conversation_is_not_used_after_the_session_is_purged(s3_server: LocalS3Server) -> None:
    store, _ = await _session_at(s3_server, 2)
    cache = ConversationCache()
    history = SessionHistory(store, worker="w1", cache=cache)
    await _turn(history, 3)
    assert len(cache) == 1
    await end_session_async(store, documents=True)
    state = await history.read()
    assert (state.next_turn, state.conversation, state.last_end) == (1, [], None)
    assert await _turn(history, 1) == _exchange(1)


async def test_a_session_stored_before_head_documents_reads_and_carries_on(s3_server: LocalS3Server) -> None:
    # The documents the previous layout wrote: starts, ends with no segment field, and no head.
    store = _store(s3_server)
    documents = store.documents("history")
    conversation: list[ChatMessage] = []
    for number in range(1, 13):
        start = TurnStart(
            turn=number, kind="message", text=f"q{number}", worker="old", started_at=_at(), lease_until=_at()
        )
        documents.put(f"turn.{number:08d}.start.json", start.model_dump_json().encode())
        added = _exchange(number)
        checkpoint = number == 1
        end = TurnEnd(
            turn=number,
            status="completed",
            base="checkpoint" if checkpoint else "append",
            messages=[message.to_dict() for message in ([*conversation, *added] if checkpoint else added)],
            checkpoint=1,
            worker="old",
            ended_at=_at(),
        )
        documents.put(f"turn.{number:08d}.end.json", end.model_dump_json(exclude={"segment"}).encode())
        conversation = [*conversation, *added]
    history = SessionHistory(store, worker="new", cache=ConversationCache(0))
    state = await history.read()
    assert state.conversation == conversation and state.next_turn == 13
    # Its next turn is due a checkpoint or segment (12 turns since the checkpoint): from then on a head leads reads.
    assert await _turn(history, 13) == [*conversation, *_exchange(13)]
    head = json.loads(documents.get("head.json"))
    assert max(head["checkpoint"], head.get("segment", 0)) == 13
    assert (await history.read()).conversation == [*conversation, *_exchange(13)]


def _at() -> datetime:
    return datetime.now(UTC)


def _service(cache: ConversationCache) -> ChatService:
    # A real Agent whose scripted model answers at once: the turn's storage is all the history's.
    return ChatService(Agent(chat_generator=MockChatGenerator("ok " + "a" * 300)), conversation_cache=cache)


async def _served_turn(service: ChatService, store: FsspecToolResultStore, log: RequestLog, text: str) -> Counter[str]:
    log.clear()
    outcome = await service.send_message(store, text)
    assert outcome.status == "completed"
    return Counter("LIST" if "list-type" in request.query else request.method for request in log.snapshot())


@pytest.mark.slow
async def test_a_chat_service_turn_sends_the_same_requests_at_10_and_200_turns(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    counts = {}
    for size in (10, 200):
        store = _store(s3_server)
        service = _service(ConversationCache())
        for number in range(size):
            await service.send_message(store, f"question {number} " + "q" * 300)
        warm = await _served_turn(service, store, s3_requests, "warm")
        cold = await _served_turn(_service(ConversationCache(0)), store, s3_requests, "cold")
        counts[size] = (warm, cold)
    (warm_10, cold_10), (warm_200, cold_200) = counts[10], counts[200]
    # The head only (the claim is the check that no other worker ran the next turn), at both lengths.
    assert warm_10["GET"] == warm_200["GET"] == 1 and warm_10["LIST"] == warm_200["LIST"] == 0
    assert warm_10["PUT"] <= 3 and warm_200["PUT"] <= 3  # the claim, the end, and the head at most one turn in 10
    assert cold_200["GET"] <= cold_10["GET"] + 1 and cold_10["LIST"] == cold_200["LIST"] == 0


async def test_a_warm_turn_reads_its_head_while_it_claims(s3_server: LocalS3Server) -> None:
    # A warm turn's two requests before the Agent runs: the head's GET and the claim's conditional PUT. Sent one after
    # the other, the claim left only once the head's answer was back; now both are in flight at once. The proxy holds
    # every answer LATENCY seconds, so one after the other the claim arrives at least LATENCY after the GET.
    latency = 2.0
    with LatencyProxy(s3_server.endpoint_url) as proxy:
        options = {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        root = FsspecToolResultStore(f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=options)
        history = SessionHistory(root.for_session("acme", "chat-1"), worker="w1", cache=ConversationCache())
        for number in range(1, CHAIN_LIMIT + 1):  # the tenth turn writes the session's first head
            await _turn(history, number)
        proxy.latency = latency
        proxy.requests.clear()
        turn = await history.begin(await history.read(for_turn=True), kind="message", text="one more")
        assert turn.start.turn == CHAIN_LIMIT + 1
        head, claim = (
            next(
                request for request in proxy.requests.snapshot() if request.method == method and name in request.target
            )
            for method, name in (("GET", "head.json"), ("PUT", f"turn.{CHAIN_LIMIT + 1:08d}.start.json"))
        )
    # The head's answer reached the client no sooner than `latency` after the GET arrived: the claim came before it.
    assert claim.at < head.at + latency


async def test_a_head_that_cannot_be_read_takes_the_claim_back(s3_endpoint: Any) -> None:
    # The warm turn's head GET fails (a 503 with one attempt allowed) while its claim lands: the request fails, and no
    # claim is left to hold the session's next turn until its lease runs out.
    plan = FaultPlan()
    with FaultProxy(s3_endpoint.endpoint_url, plan=plan) as proxy:
        options = {**s3_endpoint.storage_options(), "endpoint_url": proxy.endpoint_url}
        root = FsspecToolResultStore(
            f"{s3_endpoint.bucket_url}/{uuid.uuid4().hex}", storage_options=options, retry=RetryPolicy(attempts=1)
        )
        store = root.for_session("acme", "chat-1")
        history = SessionHistory(store, worker="w1", cache=ConversationCache())
        for number in range(1, CHAIN_LIMIT + 1):
            await _turn(history, number)
        plan.script(Fault.SLOW_DOWN, method="GET", path_contains="head.json")
        with pytest.raises(StorageError):
            await history.begin(await history.read(for_turn=True), kind="message", text="one more")
        assert proxy.faults.counts()[Fault.SLOW_DOWN] == 1
        assert f"turn.{CHAIN_LIMIT + 1:08d}.start.json" not in store.documents("history").list()
        assert await _turn(history, CHAIN_LIMIT + 1)  # the next request claims it
