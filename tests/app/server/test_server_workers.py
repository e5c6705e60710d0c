"""
Two real server processes sharing one S3 store (moto's server over HTTP): no session state lives in either process.

- a conversation whose requests alternate between the processes keeps every turn, in order;
- an approval requested through one process is listed and decided through the other, and the call runs once;
- two simultaneous messages to one session, one through each process: one wins, the other gets 409, nothing is lost
  or interleaved, and the loser's message goes through when sent again.
"""

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from server_processes import ServerProcess, serve
from server_tenants import ACME_TOKEN, GLOBEX_TOKEN, TOKENS

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.testing.local_s3 import LocalS3Server

pytestmark = [pytest.mark.s3, pytest.mark.slow]

RESEARCH = "Research heat pumps, dump the invoices table and chart revenue"


@pytest.fixture(scope="module")
def shared_store(s3_server: LocalS3Server) -> tuple[str, dict[str, Any]]:
    """One S3 prefix both processes serve."""
    return f"{s3_server.bucket_url}/workers-{uuid.uuid4().hex[:8]}", s3_server.storage_options()


@pytest.fixture(scope="module")
def servers(
    shared_store: tuple[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two `offload-haystack serve` processes on the same store, started in parallel."""
    url, options = shared_store
    logs = tmp_path_factory.mktemp("server-logs")
    with (
        serve(store=url, storage_options=options, tokens=TOKENS, log=logs / "a.log") as first,
        serve(store=url, storage_options=options, tokens=TOKENS, log=logs / "b.log") as second,
    ):
        assert first.worker != second.worker  # two processes, not one answering twice
        yield first, second


def _send(server: ServerProcess, session: str, text: str, token: str = ACME_TOKEN) -> httpx.Response:
    with server.client(token) as client:
        return client.post(f"/api/sessions/{session}/messages", json={"text": text})


def _transcript(server: ServerProcess, session: str, token: str = ACME_TOKEN) -> dict[str, Any]:
    with server.client(token) as client:
        body: dict[str, Any] = client.get(f"/api/sessions/{session}/messages").json()
        return body


def _user_texts(transcript: dict[str, Any]) -> list[str]:
    return [message["text"] for message in transcript["messages"] if message["role"] == "user"]


def test_a_conversation_alternating_between_two_processes_keeps_every_turn(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    session = f"alternate-{uuid.uuid4().hex[:6]}"
    texts = [RESEARCH, "Check the logs of billing and payroll", 'Read back the search results for "result 7"']
    for server, text in zip([a, b, a], texts, strict=True):
        response = _send(server, session, text)
        assert response.status_code == 200, response.text
    # The third turn, on process A, found the pointer that turn 1 left in the history both processes share.
    assert "result 7" in response.json()["reply"]
    for server in (a, b):
        transcript = _transcript(server, session)
        assert _user_texts(transcript) == texts and transcript["turns"] == 3
    with b.client(GLOBEX_TOKEN) as client:
        assert client.get(f"/api/sessions/{session}/results").json()["results"] == []


def test_an_approval_requested_on_one_process_is_decided_on_the_other(
    servers: tuple[ServerProcess, ServerProcess], shared_store: tuple[str, dict[str, Any]]
) -> None:
    a, b = servers
    session = f"approval-{uuid.uuid4().hex[:6]}"
    asked = _send(a, session, "Send an invoice to Hooli for 300 EUR").json()
    assert asked["status"] == "approval_required"
    [request] = asked["pending"]
    with b.client(ACME_TOKEN) as client:
        assert [p["request_id"] for p in client.get(f"/api/sessions/{session}/approvals").json()["pending"]] == [
            request["request_id"]
        ]
        decided = client.post(f"/api/sessions/{session}/approvals/{request['request_id']}", json={"approved": True})
    assert decided.status_code == 200, decided.text
    assert "Invoice INV-" in decided.json()["resumed"]["reply"]
    # Process A sees the resumed conversation; the audit shows one execution, by process B.
    transcript = _transcript(a, session)
    assert transcript["status"] == "completed" and "Invoice INV-" in transcript["messages"][-1]["text"]
    with a.client(ACME_TOKEN) as client:
        events = client.get(f"/api/sessions/{session}/audit").json()["events"]
    executed = [event for event in events if event["event"] == "approval.executed"]
    assert len(executed) == 1 and executed[0]["actor"] == b.worker
    url, options = shared_store
    assert FsspecToolResultStore(url, storage_options=options).for_session("acme", session).list() == []


def _race(a: ServerProcess, b: ServerProcess, session: str, texts: tuple[str, str]) -> list[httpx.Response]:
    barrier = threading.Barrier(2)
    responses: list[httpx.Response | None] = [None, None]

    def send(position: int, server: ServerProcess) -> None:
        with server.client(ACME_TOKEN) as client:
            barrier.wait(timeout=30)
            responses[position] = client.post(f"/api/sessions/{session}/messages", json={"text": texts[position]})

    threads = [threading.Thread(target=send, args=(n, server)) for n, server in enumerate((a, b))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(response is not None for response in responses)
    return [response for response in responses if response is not None]


def test_two_simultaneous_messages_to_one_session_one_wins_and_nothing_is_lost(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    saw_conflict = False
    # Both requests start at the same moment; each turn takes several S3 round trips, so they almost always overlap.
    # Whether they did or not, the history must hold exactly the messages that were answered.
    for attempt in range(5):
        session = f"race-{attempt}-{uuid.uuid4().hex[:6]}"
        texts = (f"{RESEARCH} (from A)", f"{RESEARCH} (from B)")
        responses = _race(a, b, session, texts)
        statuses = [response.status_code for response in responses]
        assert set(statuses) <= {200, 409}, [response.text for response in responses]
        assert 200 in statuses
        answered = [text for text, status in zip(texts, statuses, strict=True) if status == 200]
        refused = [text for text, status in zip(texts, statuses, strict=True) if status == 409]
        for response in responses:
            if response.status_code == 409:
                assert response.json()["error"] == "session_busy"
        transcript = _transcript(a, session)
        assert sorted(_user_texts(transcript)) == sorted(answered)
        assert transcript["turns"] == len(answered)
        # Nothing is lost: the refused message goes through when sent again, after the winner's turn.
        for text in refused:
            assert _send(b, session, text).status_code == 200
        assert sorted(_user_texts(_transcript(b, session))) == sorted(texts)
        if refused:
            saw_conflict = True
            break
    assert saw_conflict, "in five simultaneous pairs, no request ever got 409: the session was never contended"


def test_results_written_through_one_process_are_read_through_the_other(
    servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = servers
    session = f"results-{uuid.uuid4().hex[:6]}"
    references = _send(a, session, RESEARCH).json()["new_results"]
    with b.client(ACME_TOKEN) as client:
        listed = {item["reference"] for item in client.get(f"/api/sessions/{session}/results").json()["results"]}
        assert listed == set(references)
        for reference in references:
            assert client.get(f"/api/sessions/{session}/results/{reference}?offset=0&length=64").status_code == 200
    with b.client(GLOBEX_TOKEN) as client:
        assert client.get(f"/api/sessions/{session}/results/{references[0]}").status_code == 404
