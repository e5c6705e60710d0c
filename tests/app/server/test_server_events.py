"""
A turn's progress as server-sent events: the message POST, and a decision that resumes a held step, with
``Accept: text/event-stream``.

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

from haystack_integrations.offload.sessions.progress import TurnProgress, result_size, summarize_arguments
from offload_haystack_app.server import ServerSettings, create_app
from offload_haystack_app.server.events import turn_events, wants_event_stream

RESEARCH = "Research solar panels, dump the invoices table and chart revenue"
INVOICE = "Send an invoice to Initech for 250 EUR"
STREAM = {"Accept": "text/event-stream"}


def read_events(client: TestClient | httpx.Client, session: str, text: str, token: str) -> list[tuple[str, Any]]:
    """Send `text` asking for a stream; return its events as (kind, data), in order."""
    return post_events(client, f"/api/sessions/{session}/messages", {"text": text}, token)


def post_events(client: TestClient | httpx.Client, url: str, body: dict[str, Any], token: str) -> list[tuple[str, Any]]:
    """POST `body` to `url` asking for a stream; return its events as (kind, data), in order."""
    with client.stream("POST", url, json=body, headers={**bearer(token), **STREAM}) as response:
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
    from haystack_integrations.offload.sessions.errors import RunFailedError

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


# A decision that resumes a held step streams the resumed run as a message streams its turn.


def hold(client: TestClient, session: str, token: str = ACME_TOKEN, text: str = INVOICE) -> str:
    """Ask for an invoice with a plain JSON POST; return the id of the approval request the turn stopped for."""
    held = client.post(f"/api/sessions/{session}/messages", json={"text": text}, headers=bearer(token)).json()
    assert held["status"] == "approval_required", held
    [request] = held["pending"]
    return str(request["request_id"])


def decision_url(session: str, request_id: str) -> str:
    return f"/api/sessions/{session}/approvals/{request_id}"


@pytest.fixture
def small_offload_client() -> Iterator[TestClient]:
    """The app offloading every result over 20 characters, so the invoice confirmation is stored too."""
    settings = ServerSettings(store=f"memory://events-{uuid.uuid4().hex}", tokens=TOKENS, offload_over_chars=20)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_an_approval_streams_the_resumed_run_in_order(small_offload_client: TestClient) -> None:
    client = small_offload_client
    request_id = hold(client, "approved")
    events = post_events(client, decision_url("approved", request_id), {"approved": True}, ACME_TOKEN)
    # The resume turn is claimed, the approved call runs, returns and is stored, the model answers: in that order.
    assert [kind for kind, _ in events] == ["turn", "tool_call", "tool_result", "offloaded", "reply", "done"]
    (_, turn), (_, call), (_, result), (_, stored), _, (_, done) = events
    assert turn == {"turn": 2}
    assert call["tool_name"] == "send_invoice" and call["arguments"] == "customer=Initech, amount=250"
    assert result == {"tool_call_id": call["tool_call_id"], "tool_name": "send_invoice", "error": False, "size": 49}
    assert stored["tool_call_id"] == call["tool_call_id"] and stored["size"] == result["size"]
    # done is the JSON a plain decision answers with: the decision, and the resumed turn that stored the result.
    assert done["decision"]["request_id"] == request_id and done["decision"]["approved"] is True
    assert done["pending"] == [] and done["resumed_elsewhere"] is False
    assert done["resumed"]["turn"] == 2 and done["resumed"]["status"] == "completed"
    assert done["resumed"]["new_results"] == stored["references"]
    assert [item["outcome"] for item in done["resumed"]["approval_outcomes"]] == ["executed"]
    [reference] = stored["references"]
    text = client.get(f"/api/sessions/approved/results/{reference}", headers=bearer(ACME_TOKEN)).text
    assert "sent to Initech for 250 EUR" in text
    transcript = client.get("/api/sessions/approved/messages", headers=bearer(ACME_TOKEN)).json()
    assert transcript["turns"] == 2 and transcript["status"] == "completed"
    assert transcript["messages"][-1]["text"] == done["resumed"]["reply"]
    # A plain decision answers the same JSON (same keys, same shape), not a stream.
    other = hold(client, "approved-plain")
    plain = client.post(decision_url("approved-plain", other), json={"approved": True}, headers=bearer(ACME_TOKEN))
    assert plain.headers["content-type"] == "application/json"
    assert plain.json().keys() == done.keys() and plain.json()["resumed"].keys() == done["resumed"].keys()


def test_an_edited_approval_streams_the_call_as_it_runs(client: TestClient) -> None:
    request_id = hold(client, "edited")
    edit = {"approved": True, "arguments": {"customer": "Initech", "amount": 50}}
    events = post_events(client, decision_url("edited", request_id), edit, ACME_TOKEN)
    # A short result is not offloaded: no offloaded event, the rest as for any approval.
    assert [kind for kind, _ in events] == ["turn", "tool_call", "tool_result", "reply", "done"]
    assert events[1][1]["arguments"] == "customer=Initech, amount=50"
    done = events[-1][1]
    assert done["decision"]["edited"] is True and "sent to Initech for 50 EUR" in done["resumed"]["reply"]


def test_a_denial_streams_and_ends_with_done(client: TestClient) -> None:
    request_id = hold(client, "denied")
    events = post_events(client, decision_url("denied", request_id), {"approved": False, "reason": "No."}, ACME_TOKEN)
    # The denied call never runs (no tool_call, no tool_result); the model is told, and answers.
    assert [kind for kind, _ in events] == ["turn", "reply", "done"]
    done = events[-1][1]
    assert done["decision"]["approved"] is False
    assert done["resumed"]["status"] == "completed" and "did not run" in done["resumed"]["reply"]
    assert [item["outcome"] for item in done["resumed"]["approval_outcomes"]] == ["denied"]
    events_after = client.get("/api/sessions/denied/audit", headers=bearer(ACME_TOKEN)).json()["events"]
    assert [event["event"] for event in events_after][-1] == "approval.denied"


def test_decision_refusals_before_the_resume_are_plain_json_answers(client: TestClient) -> None:
    request_id = hold(client, "refused")
    url = decision_url("refused", request_id)
    stream = {**bearer(ACME_TOKEN), **STREAM}
    # Another tenant's decision on acme's request, in a session of the same id: 404, exactly like an unknown request.
    stolen = client.post(url, json={"approved": True}, headers={**bearer(GLOBEX_TOKEN), **STREAM})
    unknown = client.post(decision_url("refused", "not-a-request"), json={"approved": True}, headers=stream)
    assert stolen.status_code == unknown.status_code == 404
    assert stolen.headers["content-type"] == unknown.headers["content-type"] == "application/json"
    assert stolen.json() == unknown.json()
    assert client.get("/api/sessions/refused/audit", headers=bearer(GLOBEX_TOKEN)).json()["events"] == []
    no_token = client.post(url, json={"approved": True}, headers={**bearer("not-a-token-0123456789"), **STREAM})
    assert no_token.status_code == 401 and no_token.headers["content-type"] == "application/json"
    bad_edit = client.post(
        url, json={"approved": True, "arguments": {"customer": "Initech", "amount": -5}}, headers=stream
    )
    assert bad_edit.status_code == 422 and bad_edit.json()["error"] == "invalid_decision"
    malformed = client.post(url, json={"approved": "maybe"}, headers=stream)
    assert malformed.status_code == 422 and malformed.headers["content-type"] == "application/json"
    huge = client.post(url, content=b"x" * (2 << 20), headers=stream)
    assert huge.status_code == 413 and huge.json()["error"] == "body_too_large"
    # None of that decided anything: acme's request still waits, and its decision streams.
    pending = client.get("/api/sessions/refused/approvals", headers=bearer(ACME_TOKEN)).json()["pending"]
    assert [item["request_id"] for item in pending] == [request_id]
    assert post_events(client, url, {"approved": True}, ACME_TOKEN)[-1][0] == "done"
    again = client.post(url, json={"approved": True}, headers=stream)
    assert again.status_code == 409 and again.json()["error"] == "already_decided"


def test_a_tenant_sees_only_its_own_resumed_run(client: TestClient) -> None:
    # Both tenants hold an invoice in a session of the same id; each decision streams its own tenant's call only.
    requests = {
        "acme": hold(client, "shared"),
        "globex": hold(client, "shared", GLOBEX_TOKEN, "Send an invoice to Globex for 9 EUR"),
    }
    acme = post_events(client, decision_url("shared", requests["acme"]), {"approved": True}, ACME_TOKEN)
    globex = post_events(client, decision_url("shared", requests["globex"]), {"approved": True}, GLOBEX_TOKEN)
    assert "Initech" in json.dumps(acme) and "Globex" not in json.dumps(acme)
    assert "Globex" in json.dumps(globex) and "Initech" not in json.dumps(globex)


def test_json_decisions_run_as_before_and_watched_ones_get_the_callback(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = client.app.state.service.agent  # type: ignore[attr-defined]
    seen: list[dict[str, Any]] = []
    original = agent.run_async

    async def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        return await original(*args, **kwargs)

    plain = hold(client, "plain-decision")
    monkeypatch.setattr(agent, "run_async", spy)
    answer = client.post(decision_url("plain-decision", plain), json={"approved": True}, headers=bearer(ACME_TOKEN))
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    [continued] = seen
    assert continued.get("streaming_callback") is None and "offload.progress" not in continued["hook_context"]
    monkeypatch.setattr(agent, "run_async", original)
    watched = hold(client, "watched-decision")
    monkeypatch.setattr(agent, "run_async", spy)
    post_events(client, decision_url("watched-decision", watched), {"approved": True}, ACME_TOKEN)
    assert seen[-1]["streaming_callback"] is not None
    assert isinstance(seen[-1]["hook_context"]["offload.progress"], TurnProgress)


def test_a_client_that_leaves_a_decision_does_not_end_the_resumed_run(slow_client: TestClient) -> None:
    request_id = hold(slow_client, "left-decision")
    url = decision_url("left-decision", request_id)
    with slow_client.stream("POST", url, json={"approved": True}, headers={**bearer(ACME_TOKEN), **STREAM}) as response:
        lines = response.iter_lines()
        assert next(lines) == "event: turn"  # the resume turn is claimed; the client goes away while the call runs
    deadline = time.monotonic() + 30
    while True:
        stored = slow_client.get("/api/sessions/left-decision/messages", headers=bearer(ACME_TOKEN)).json()
        if stored["status"] == "completed" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert stored["status"] == "completed" and "sent to Initech" in stored["messages"][-1]["text"]
