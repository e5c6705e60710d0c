"""
The HTTP API with two tenants: isolation of sessions, results and approvals; bad tokens; bad ids; paging; conflicts.

Every test runs the real app (FastAPI's TestClient, lifespan included) with the real Agent, hooks and scripted model,
on a memory store and on a local directory. "Another tenant's X answers exactly as a missing X" is checked by
comparing the whole response (status and body) with the response for something that never existed.
"""

import base64
from typing import Any

import pytest
from fastapi.testclient import TestClient
from httpx import Response
from server_tenants import ACME_TOKEN, GLOBEX_TOKEN, TOKENS, bearer

from haystack_integrations.offload import FsspecToolResultStore, Quota
from haystack_integrations.offload.sessions.history import SessionHistory
from haystack_integrations.offload.stores.names import new_object_name
from offload_haystack_app.demo.tools import chart_png, search_results
from offload_haystack_app.server import ServerSettings, create_app

RESEARCH = "Research solar panels, dump the invoices table and chart revenue"
INVOICE = "Send an invoice to Initech for 250 EUR"
ACME = bearer(ACME_TOKEN)
GLOBEX = bearer(GLOBEX_TOKEN)


def _send(client: TestClient, session: str, text: str, headers: dict[str, str]) -> dict[str, Any]:
    response = client.post(f"/api/sessions/{session}/messages", json={"text": text}, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _same(first: Response, second: Response) -> None:
    assert (first.status_code, first.json()) == (second.status_code, second.json())


def _missing_reference() -> str:
    return new_object_name(key="never.txt", kind="text", tool_name="web_search")


def test_a_session_is_private_to_its_tenant_even_under_the_same_session_id(
    client: TestClient, root: FsspecToolResultStore
) -> None:
    turn = _send(client, "chat-1", RESEARCH, ACME)
    assert turn["status"] == "completed" and len(turn["new_results"]) == 4
    assert "pointer" in turn["reply"]

    # globex's "chat-1" is globex's own, empty session: no messages, no results.
    theirs = client.get("/api/sessions/chat-1/messages", headers=GLOBEX).json()
    assert theirs["messages"] == [] and theirs["turns"] == 0
    assert client.get("/api/sessions/chat-1/results", headers=GLOBEX).json()["results"] == []
    # ...and what they write stays theirs.
    _send(client, "chat-1", "Chart revenue", GLOBEX)
    mine = {item["reference"] for item in client.get("/api/sessions/chat-1/results", headers=ACME).json()["results"]}
    assert mine == set(turn["new_results"])
    assert len(root.for_session("globex", "chat-1").list()) == 2
    first = client.get("/api/sessions/chat-1/messages", headers=ACME).json()["messages"][0]
    assert first["text"] == RESEARCH


def test_another_tenants_result_answers_exactly_like_a_missing_one(client: TestClient) -> None:
    reference = _send(client, "chat-1", RESEARCH, ACME)["new_results"][0]
    assert client.get(f"/api/sessions/chat-1/results/{reference}", headers=ACME).status_code == 200

    missing = client.get(f"/api/sessions/chat-1/results/{_missing_reference()}", headers=GLOBEX)
    assert missing.status_code == 404
    for attempt in (
        f"/api/sessions/chat-1/results/{reference}",
        f"/api/sessions/chat-1/results/{reference}?offset=0&length=10",
        f"/api/sessions/other-chat/results/{reference}",
        f"/api/sessions/chat-1/results/..%2F..%2Facme%2Fchat-1%2F{reference}",
        f"/api/sessions/chat-1/results/%2E%2E%2F{reference}",
    ):
        _same(client.get(attempt, headers=GLOBEX), missing)
    # The owner's other sessions do not see it either.
    _same(client.get(f"/api/sessions/chat-2/results/{reference}", headers=ACME), missing)


def test_approvals_are_private_to_their_session(client: TestClient) -> None:
    turn = _send(client, "chat-1", INVOICE, ACME)
    assert turn["status"] == "approval_required"
    [pending] = turn["pending"]
    assert pending["tool_name"] == "send_invoice" and pending["arguments"] == {"customer": "Initech", "amount": 250}
    request_id = pending["request_id"]

    assert client.get("/api/sessions/chat-1/approvals", headers=GLOBEX).json()["pending"] == []
    garbage = client.post("/api/sessions/chat-1/approvals/not-a-request", json={"approved": True}, headers=GLOBEX)
    assert garbage.status_code == 404
    stolen = client.post(f"/api/sessions/chat-1/approvals/{request_id}", json={"approved": True}, headers=GLOBEX)
    _same(stolen, garbage)
    assert client.get("/api/sessions/chat-1/audit", headers=GLOBEX).json()["events"] == []
    # Nothing was recorded for acme by globex's attempt: the request still waits, and acme can decide it.
    assert [p["request_id"] for p in client.get("/api/sessions/chat-1/approvals", headers=ACME).json()["pending"]] == [
        request_id
    ]
    decided = client.post(f"/api/sessions/chat-1/approvals/{request_id}", json={"approved": True}, headers=ACME)
    assert decided.status_code == 200
    assert "Invoice INV-" in decided.json()["resumed"]["reply"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer not-a-token-of-anyone"},
        {"Authorization": f"Basic {ACME_TOKEN}"},
        {"Authorization": f"Bearer {ACME_TOKEN}x"},
        {"Authorization": f"Bearer {ACME_TOKEN[:-1]}"},
    ],
)
def test_bad_tokens_get_401_and_nothing_else(client: TestClient, headers: dict[str, str]) -> None:
    for method, path in [
        ("GET", "/api/me"),
        ("GET", "/api/sessions/chat-1/messages"),
        ("POST", "/api/sessions/chat-1/messages"),
        ("GET", "/api/sessions/chat-1/results"),
        ("GET", "/api/sessions/chat-1/approvals"),
        ("GET", "/api/sessions/../results"),
    ]:
        response = client.request(method, path, json={"text": "hi"}, headers=headers)
        if path.endswith("../results"):
            assert response.status_code in {401, 404}  # the client normalises '..' away before sending
            continue
        assert response.status_code == 401, (method, path)
        assert response.json()["error"] == "unauthorized"
        assert response.headers["www-authenticate"] == "Bearer"
    assert client.get("/api/health").json()["scripted"] is True
    assert client.get("/api/me", headers=ACME).json()["tenant"] == "acme"


@pytest.mark.parametrize("session", ["a b", ".hidden", "x" * 129, "semi;colon", "%00", "caf%C3%A9"])
def test_bad_session_ids_are_refused_with_400(client: TestClient, session: str) -> None:
    for method, suffix in [("GET", "/messages"), ("POST", "/messages"), ("GET", "/results"), ("GET", "/approvals")]:
        response = client.request(method, f"/api/sessions/{session}{suffix}", json={"text": "hi"}, headers=ACME)
        assert response.status_code == 400, (method, suffix, response.text)
        assert response.json()["error"] == "invalid_id"


def test_bad_request_ids_and_references_are_not_found(client: TestClient) -> None:
    _send(client, "chat-1", INVOICE, ACME)
    for request_id in ["x", "0" * 300, "20261129T213400123456Z-5f3a9c1e7b2d-0", "..%2F..%2Fglobex"]:
        response = client.post(f"/api/sessions/chat-1/approvals/{request_id}", json={"approved": True}, headers=ACME)
        assert response.status_code == 404, request_id
    for reference in ["x", "a.txt", "%2Fetc%2Fpasswd", "..", "%2E%2E"]:
        response = client.get(f"/api/sessions/chat-1/results/{reference}", headers=ACME)
        assert response.status_code == 404, reference


def test_text_results_page_on_character_boundaries_and_join_back_exactly(client: TestClient) -> None:
    turn = _send(client, "chat-1", RESEARCH, ACME)
    listing = client.get("/api/sessions/chat-1/results", headers=ACME).json()["results"]
    search = next(item for item in listing if item["tool_name"] == "web_search")
    assert search["media_type"] == "text/plain; charset=utf-8" and search["reference"] in turn["new_results"]
    pages, offset = [], 0
    while True:
        page = client.get(
            f"/api/sessions/chat-1/results/{search['reference']}?offset={offset}&length=1001", headers=ACME
        )
        assert page.status_code == 200
        assert page.headers["x-result-size"] == str(search["size"])
        assert page.headers["x-result-start"] == str(offset)
        pages.append(page.content.decode("utf-8"))  # every page decodes on its own: no character is split
        if "x-next-offset" not in page.headers:
            break
        offset = int(page.headers["x-next-offset"])
    assert "".join(pages) == search_results(RESEARCH)
    assert len(pages) > 20
    whole = client.get(f"/api/sessions/chat-1/results/{search['reference']}", headers=ACME)
    assert whole.text == search_results(RESEARCH)
    assert whole.headers["cache-control"] == "private, no-store"


def test_images_are_served_as_images_and_other_bytes_as_downloads(
    client: TestClient, root: FsspecToolResultStore
) -> None:
    _send(client, "chat-1", "Chart revenue", ACME)
    listing = client.get("/api/sessions/chat-1/results", headers=ACME).json()["results"]
    image = next(item for item in listing if item["media_type"] == "image/png")
    response = client.get(f"/api/sessions/chat-1/results/{image['reference']}", headers=ACME)
    assert response.headers["content-type"] == "image/png"
    assert response.content == chart_png("revenue")
    # A tool that stored HTML must not get it rendered as a page of this origin.
    reference = root.for_session("acme", "chat-1").write(key="page.html", content=b"<script>alert(1)</script>")
    served = client.get(f"/api/sessions/chat-1/results/{reference}", headers=ACME)
    assert served.headers["content-type"] == "application/octet-stream"
    assert served.headers["content-disposition"] == "attachment"
    assert "sandbox" in served.headers["content-security-policy"]


def test_a_message_waits_while_approvals_are_pending_and_decisions_are_checked(client: TestClient) -> None:
    request_id = _send(client, "chat-1", INVOICE, ACME)["pending"][0]["request_id"]
    blocked = client.post("/api/sessions/chat-1/messages", json={"text": "Chart revenue"}, headers=ACME)
    assert blocked.status_code == 409
    assert blocked.json()["error"] == "approval_pending"
    assert [p["request_id"] for p in blocked.json()["pending"]] == [request_id]

    bad_edit = {"approved": True, "arguments": {"customer": "Initech", "amount": -5}}
    response = client.post(f"/api/sessions/chat-1/approvals/{request_id}", json=bad_edit, headers=ACME)
    assert response.status_code == 422 and response.json()["error"] == "invalid_decision"
    response = client.post(f"/api/sessions/chat-1/approvals/{request_id}", json={"approved": "maybe"}, headers=ACME)
    assert response.status_code == 422

    denied = client.post(
        f"/api/sessions/chat-1/approvals/{request_id}", json={"approved": False, "reason": "Too much."}, headers=ACME
    ).json()
    assert denied["decision"]["approved"] is False
    assert "did not run" in denied["resumed"]["reply"] and "Too much." in denied["resumed"]["reply"]
    assert [item["outcome"] for item in denied["resumed"]["approval_outcomes"]] == ["denied"]
    again = client.post(f"/api/sessions/chat-1/approvals/{request_id}", json={"approved": True}, headers=ACME)
    assert again.status_code == 409 and again.json()["error"] == "already_decided"
    # The conversation goes on, and the audit has the whole story, with no execution.
    assert _send(client, "chat-1", "Chart revenue", ACME)["status"] == "completed"
    events = [event["event"] for event in client.get("/api/sessions/chat-1/audit", headers=ACME).json()["events"]]
    assert events == ["approval.requested", "approval.decided", "approval.resumed", "approval.denied"]


def test_an_edited_approval_runs_with_the_edited_arguments(client: TestClient) -> None:
    request_id = _send(client, "chat-1", INVOICE, ACME)["pending"][0]["request_id"]
    edit = {"approved": True, "arguments": {"customer": "Initech", "amount": 125}}
    outcome = client.post(f"/api/sessions/chat-1/approvals/{request_id}", json=edit, headers=ACME).json()
    assert outcome["decision"]["edited"] is True
    assert "sent to Initech for 125 EUR" in outcome["resumed"]["reply"]


def test_the_conversation_is_carried_across_requests(client: TestClient) -> None:
    _send(client, "chat-1", RESEARCH, ACME)
    # The second request reads back a pointer that only the stored history of the first request contains.
    reply = _send(client, "chat-1", 'Read back the search results for "result 7"', ACME)["reply"]
    assert "result 7" in reply and "matches" in reply
    transcript = client.get("/api/sessions/chat-1/messages", headers=ACME).json()
    users = [message["text"] for message in transcript["messages"] if message["role"] == "user"]
    assert users == [RESEARCH, 'Read back the search results for "result 7"']
    assert transcript["turns"] == 2 and transcript["status"] == "completed" and not transcript["busy"]
    offloaded = [m["tool_result"]["offloaded"] for m in transcript["messages"] if m.get("tool_result")]
    assert any(offloaded)


async def test_a_session_busy_with_another_turn_answers_409_until_its_lease_passes(
    client: TestClient, root: FsspecToolResultStore
) -> None:
    store = root.for_session("acme", "chat-1")
    # Another worker holds turn 1 (its request is still running): this one must not run at all.
    history = SessionHistory(store, worker="another-worker")
    await history.begin(await history.read(), kind="message", text="slow question")
    busy = client.post("/api/sessions/chat-1/messages", json={"text": "Chart revenue"}, headers=ACME)
    assert busy.status_code == 409 and busy.json()["error"] == "session_busy"
    assert store.list() == []
    assert client.get("/api/sessions/chat-1/messages", headers=ACME).json()["busy"] is True

    # A worker that died: its turn's lease has passed, so the next request ends it as abandoned and goes on.
    expired = SessionHistory(root.for_session("acme", "chat-2"), worker="dead-worker", lease=1e-6)
    await expired.begin(await expired.read(), kind="message", text="lost question")
    turn = _send(client, "chat-2", "Chart revenue", ACME)
    assert turn["turn"] == 2 and turn["status"] == "completed"
    starts = await SessionHistory(root.for_session("acme", "chat-2"), worker="check").starts()
    assert [start.text for start in starts] == ["lost question", "Chart revenue"]


def test_the_page_is_served_with_a_strict_content_security_policy(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "offload-haystack" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/../app.py").status_code == 404


def test_messages_are_validated(client: TestClient) -> None:
    for body in [{}, {"text": ""}, {"text": "x" * 20_001}, {"text": "hi", "tenant": "globex"}, {"text": 5}]:
        response = client.post("/api/sessions/chat-1/messages", json=body, headers=ACME)
        assert response.status_code == 422, body
        assert response.json()["error"] == "invalid_request"


def test_base64_of_images_never_reaches_the_transcript(client: TestClient) -> None:
    _send(client, "chat-1", "Chart revenue", ACME)
    transcript = client.get("/api/sessions/chat-1/messages", headers=ACME).json()
    encoded = base64.b64encode(chart_png("revenue")).decode()[:40]
    assert encoded not in str(transcript)


def test_expired_approvals_are_resumed_on_request_and_the_model_is_told(store_url: str) -> None:
    app = create_app(ServerSettings(store=store_url, tokens=TOKENS, approval_ttl=1e-6))
    with TestClient(app) as client:
        nothing = client.post("/api/sessions/chat-1/resume", headers=ACME)
        assert nothing.status_code == 409 and nothing.json()["error"] == "nothing_to_resume"
        held = _send(client, "chat-1", INVOICE, ACME)
        assert held["status"] == "approval_required" and held["pending"] == []  # expired as soon as it was asked
        blocked = client.post("/api/sessions/chat-1/messages", json={"text": "Chart revenue"}, headers=ACME)
        assert blocked.status_code == 409 and blocked.json()["pending"] == []
        resumed = client.post("/api/sessions/chat-1/resume", headers=ACME)
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["approval_outcomes"][0]["outcome"] == "expired"
        assert "did not run" in resumed.json()["reply"]
        assert _send(client, "chat-1", "Chart revenue", ACME)["status"] == "completed"


def test_a_tenant_over_its_quota_gets_a_clear_refusal_and_its_sessions_stay_readable(store_url: str) -> None:
    # A turn's first document would pass the tenant's bytes, in either of its sessions: refused before it runs.
    quota = Quota(tenant_bytes=1)
    with TestClient(create_app(ServerSettings(store=store_url, tokens=TOKENS, quota=quota))) as client:
        refused = client.post("/api/sessions/chat-1/messages", json={"text": "Hello"}, headers=ACME)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"] == "quota_exceeded"
        assert refused.json()["detail"].startswith("Quota exceeded for tenant 'acme'")
        streamed = client.post(
            "/api/sessions/chat-2/messages",
            json={"text": "Hello"},
            headers={**ACME, "Accept": "text/event-stream"},
        )
        assert streamed.status_code == 403 and streamed.json()["error"] == "quota_exceeded"
        for session in ("chat-1", "chat-2"):
            transcript = client.get(f"/api/sessions/{session}/messages", headers=ACME)
            assert transcript.status_code == 200 and transcript.json()["turns"] == 0
