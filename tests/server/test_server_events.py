"""
A turn's progress as server-sent events: the message POST with ``Accept: text/event-stream``.

The events come from real scripted runs (the shared Agent, Haystack's streaming callback, the progress hooks); the
stream is scoped like the request (a tenant sees its own run only); refusals before the turn are the usual JSON
answers; a client that does not ask gets JSON, and its model is not asked to stream; a slow reader loses events, not
the turn; a client that leaves does not end the turn.
"""

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from server_processes import serve
from server_tenants import ACME_TOKEN, GLOBEX_TOKEN, TOKENS, bearer

from haystack_integrations.offload.server import ServerSettings, create_app
from haystack_integrations.offload.server.events import turn_events, wants_event_stream
from haystack_integrations.offload.server.progress import TurnProgress, result_size, summarize_arguments

RESEARCH = "Research solar panels, dump the invoices table and chart revenue"
INVOICE = "Send an invoice to Initech for 250 EUR"
STREAM = {"Accept": "text/event-stream"}


def read_events(client: TestClient | httpx.Client, session: str, text: str, token: str) -> list[tuple[str, Any]]:
    """Send `text` asking for a stream; return its events as (kind, data), in order."""
    headers = {**bearer(token), **STREAM}
    with client.stream("POST", f"/api/sessions/{session}/messages", json={"text": text}, headers=headers) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return parse(response.iter_lines())


def parse(lines: Iterator[str]) -> list[tuple[str, Any]]:
    events: list[tuple[str, Any]] = []
    kind = None
    for line in lines:
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            assert kind is not None
            events.append((kind, json.loads(line.removeprefix("data: "))))
            kind = None
    return events


def position(events: list[tuple[str, Any]], kind: str, **match: Any) -> int:
    found = [i for i, (k, data) in enumerate(events) if k == kind and all(data.get(n) == v for n, v in match.items())]
    assert len(found) == 1, (kind, match, events)
    return found[0]


def test_a_streamed_turn_tells_its_tool_calls_and_offloads_in_order(client: TestClient) -> None:
    events = read_events(client, "streamed", RESEARCH, ACME_TOKEN)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "turn" and events[0][1] == {"turn": 1}
    assert kinds[-1] == "done"
    done = events[-1][1]
    assert done["status"] == "completed" and "scripted summary" in done["reply"]
    offloaded: list[str] = []
    for tool, arguments in [("web_search", f"query={RESEARCH[:39]}…"), ("sql_query", "table=invoices")]:
        call = position(events, "tool_call", tool_name=tool)
        assert events[call][1]["arguments"] == arguments
        call_id = events[call][1]["tool_call_id"]
        result = position(events, "tool_result", tool_call_id=call_id)
        stored = position(events, "offloaded", tool_call_id=call_id)
        assert call < result < stored < kinds.index("reply")
        assert events[result][1]["error"] is False and events[result][1]["size"] > 4000
        assert events[stored][1]["size"] == events[result][1]["size"]
        offloaded += events[stored][1]["references"]
    chart = position(events, "offloaded", tool_name="render_chart")
    assert [reference.rsplit(".", 1)[-1] for reference in events[chart][1]["references"]] == ["txt", "png"]
    offloaded += events[chart][1]["references"]
    # The offload events name exactly what the turn stored, and each reference reads back in this session.
    assert sorted(offloaded) == sorted(done["new_results"])
    for reference in offloaded:
        assert client.get(f"/api/sessions/streamed/results/{reference}", headers=bearer(ACME_TOKEN)).status_code == 200
    # The model replied once, after the tools; the answer is the JSON a plain POST returns, and it is stored.
    assert kinds.count("reply") == 1
    stored = client.get("/api/sessions/streamed/messages", headers=bearer(ACME_TOKEN)).json()
    assert stored["turns"] == 1 and stored["messages"][-1]["text"] == done["reply"]
    plain = client.post("/api/sessions/plain/messages", json={"text": RESEARCH}, headers=bearer(ACME_TOKEN))
    assert plain.headers["content-type"] == "application/json"
    assert plain.json().keys() == done.keys() and plain.json()["status"] == done["status"]


def test_an_approval_stop_is_streamed_with_its_request(client: TestClient) -> None:
    events = read_events(client, "held", INVOICE, ACME_TOKEN)
    assert [kind for kind, _ in events] == ["turn", "approval_requested", "done"]
    requested, done = events[1][1], events[2][1]
    assert done["status"] == "approval_required"
    assert requested == {
        "request_id": done["pending"][0]["request_id"],
        "tool_call_id": requested["tool_call_id"],
        "tool_name": "send_invoice",
        "arguments": "customer=Initech, amount=250",
    }
    # The held call never ran: no tool_call event for it. Approving resumes as before (a plain JSON answer).
    decided = client.post(
        f"/api/sessions/held/approvals/{requested['request_id']}", json={"approved": True}, headers=bearer(ACME_TOKEN)
    )
    assert decided.status_code == 200 and "sent to Initech" in decided.json()["resumed"]["reply"]


def test_refusals_before_the_turn_are_plain_json_answers(client: TestClient) -> None:
    read_events(client, "refusals", INVOICE, ACME_TOKEN)
    url = "/api/sessions/refusals/messages"
    held = client.post(url, json={"text": "hello"}, headers={**bearer(ACME_TOKEN), **STREAM})
    assert held.status_code == 409 and held.json()["error"] == "approval_pending"
    unknown = client.post(url, json={"text": "hello"}, headers={**bearer("not-a-token-0123456789"), **STREAM})
    assert unknown.status_code == 401 and unknown.headers["content-type"] == "application/json"
    empty = client.post(url, json={"text": ""}, headers={**bearer(ACME_TOKEN), **STREAM})
    assert empty.status_code == 422
    huge = client.post(url, content=b"x" * (2 << 20), headers={**bearer(ACME_TOKEN), **STREAM})
    assert huge.status_code == 413 and huge.json()["error"] == "body_too_large"
    bad_id = client.post("/api/sessions/../messages", json={"text": "hi"}, headers={**bearer(ACME_TOKEN), **STREAM})
    assert bad_id.status_code in (400, 404)


def test_json_clients_get_json_and_their_model_is_not_asked_to_stream(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = client.app.state.service.agent  # type: ignore[attr-defined]
    seen: list[dict[str, Any]] = []
    original = agent.run_async

    async def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return await original(*args, **kwargs)

    monkeypatch.setattr(agent, "run_async", spy)
    for accept in (None, "application/json", "text/event-stream;q=0, application/json"):
        headers = bearer(ACME_TOKEN) | ({"Accept": accept} if accept else {})
        reply = client.post(f"/api/sessions/json-{len(seen)}/messages", json={"text": "Chart revenue"}, headers=headers)
        assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    assert [call["streaming_callback"] for call in seen] == [None, None, None]
    assert all("offload.progress" not in call["hook_context"] for call in seen)
    read_events(client, "watched", "Chart revenue", ACME_TOKEN)
    assert seen[-1]["streaming_callback"] is not None


@pytest.fixture
def slow_client() -> Iterator[TestClient]:
    """The app with tools that take a while, so two tenants' turns overlap."""
    settings = ServerSettings(store=f"memory://events-{uuid.uuid4().hex}", tokens=TOKENS, scripted_tool_delay=0.5)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_a_tenant_sees_only_its_own_run(slow_client: TestClient) -> None:
    # Two tenants, the same session id, at the same time: each stream tells its own run and nothing of the other's.
    streams: dict[str, list[tuple[str, Any]]] = {}
    asks = {"acme": (ACME_TOKEN, "Research solar panels"), "globex": (GLOBEX_TOKEN, "Dump the payroll table")}

    def watch(tenant: str) -> None:
        token, text = asks[tenant]
        streams[tenant] = read_events(slow_client, "shared-id", text, token)

    threads = [threading.Thread(target=watch, args=(tenant,)) for tenant in asks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    tools = {tenant: {data.get("tool_name") for _, data in events} - {None} for tenant, events in streams.items()}
    assert tools == {"acme": {"web_search"}, "globex": {"sql_query"}}
    assert "payroll" not in json.dumps(streams["acme"]) and "solar" not in json.dumps(streams["globex"])
    for tenant, other in (("acme", "globex"), ("globex", "acme")):
        (references,) = [data["references"] for kind, data in streams[tenant] if kind == "offloaded"]
        for reference in references:
            url = f"/api/sessions/shared-id/results/{reference}"
            assert slow_client.get(url, headers=bearer(asks[tenant][0])).status_code == 200
            assert slow_client.get(url, headers=bearer(asks[other][0])).status_code == 404
    # There is nothing else to subscribe to: events exist only in the response of the request that runs the turn.
    assert slow_client.get("/api/sessions/shared-id/events", headers=bearer(GLOBEX_TOKEN)).status_code in (404, 405)


def test_a_slow_reader_loses_progress_events_not_the_answer() -> None:
    async def scenario() -> list[str]:
        progress = TurnProgress(max_events=2)

        async def turn() -> str:
            for number in range(5):
                progress.publish("tool_call", tool_call_id=f"call_{number}")  # never waits, whoever reads
            return "the answer"

        task = asyncio.ensure_future(turn())
        await task  # the reader has not read anything yet
        return [chunk async for chunk in turn_events(task, progress, lambda outcome: {"reply": outcome})]

    chunks = asyncio.run(scenario())
    assert [chunk.split("\n", 1)[0] for chunk in chunks] == [
        "event: tool_call",
        "event: tool_call",
        "event: dropped",
        "event: done",
    ]
    assert chunks[2] == 'event: dropped\ndata: {"count":3}\n\n' and '"reply":"the answer"' in chunks[3]


def test_a_failed_run_ends_the_stream_with_an_error_event() -> None:
    from haystack_integrations.offload.server.errors import RunFailedError

    async def scenario() -> list[str]:
        progress = TurnProgress()

        async def turn() -> None:
            progress.turn_started(1)
            raise RunFailedError("The agent failed to answer: ToolInvocationError.")

        task = asyncio.ensure_future(turn())
        return [chunk async for chunk in turn_events(task, progress, lambda outcome: {})]

    assert asyncio.run(scenario())[-1] == (
        'event: error\ndata: {"status":502,"error":"run_failed",'
        '"detail":"The agent failed to answer: ToolInvocationError."}\n\n'
    )


@pytest.mark.slow
def test_a_client_that_leaves_does_not_end_the_turn(tmp_path: Path) -> None:
    environment = {"OFFLOAD_SERVER_SCRIPTED_TOOL_DELAY": "1.5"}
    log = tmp_path / "server.log"
    with (
        serve(store=str(tmp_path / "results"), tokens=TOKENS, log=log, environment=environment) as server,
        server.client(ACME_TOKEN) as client,
    ):
        url = "/api/sessions/left/messages"
        with client.stream("POST", url, json={"text": RESEARCH}, headers=STREAM) as response:
            lines = response.iter_lines()
            assert next(lines) == "event: turn"  # the turn is claimed; the client goes away before the tools end
        deadline = time.monotonic() + 30
        while True:
            stored = client.get(url).json()
            if stored["status"] == "completed" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert stored["status"] == "completed", log.read_text()
        assert "scripted summary" in stored["messages"][-1]["text"]
        assert len(client.get("/api/sessions/left/results").json()["results"]) == 4
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize(
    ("accept", "wanted"),
    [
        (None, False),
        ("application/json", False),
        ("text/event-stream", True),
        ("application/json, Text/Event-Stream; q=0.5", True),
        ("text/event-stream;q=0", False),
        ("*/*", False),
    ],
)
def test_which_accept_headers_ask_for_a_stream(accept: str | None, wanted: bool) -> None:
    assert wants_event_stream(accept) is wanted


def test_event_summaries_stay_short() -> None:
    long = summarize_arguments({"query": "x" * 500, "limit": 5, "filters": {"year": 2024}})
    assert len(long) <= 120 and long.startswith("query=xxx") and "…" in long
    assert summarize_arguments({"customer": "Initech", "amount": 250}) == "customer=Initech, amount=250"
    assert result_size("héllo") == 6
