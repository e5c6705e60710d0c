"""
The list of a tenant's sessions (``GET /api/sessions``) and the approval events the transcript marks for the page.

The list is one LIST of the caller's tenant's scope, whatever the number of sessions: no document is read. A tenant
never sees another's sessions, not even one whose id is a prefix of its own ("acme" and "acme2" list different
directories that share a string prefix).
"""

from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from haystack.dataclasses import ChatMessage, ToolCall
from server_tenants import ACME_TOKEN, GLOBEX_TOKEN, bearer

from haystack_integrations.offload.approvals.outcomes import denial_result, denied_by_person, edit_note, expired
from haystack_integrations.offload.stores.io import SyncBackedIO
from offload_haystack_app.server import ServerSettings, create_app
from offload_haystack_app.server.views import approval_event

ACME2_TOKEN = "acme2-token-0123456789abcdef"  # noqa: S105 - a test token for an in-process app
TOKENS = {ACME_TOKEN: "acme", ACME2_TOKEN: "acme2", GLOBEX_TOKEN: "globex"}
ACME = bearer(ACME_TOKEN)
ACME2 = bearer(ACME2_TOKEN)
GLOBEX = bearer(GLOBEX_TOKEN)
INVOICE = "Send an invoice to Initech for 250 EUR"


@pytest.fixture
def client(store_url: str) -> Iterator[TestClient]:
    """The app with three tenants, two of them sharing a string prefix."""
    with TestClient(create_app(ServerSettings(store=store_url, tokens=TOKENS))) as test_client:
        yield test_client


def _send(client: TestClient, session: str, text: str, headers: dict[str, str]) -> dict[str, Any]:
    response = client.post(f"/api/sessions/{session}/messages", json={"text": text}, headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _sessions(client: TestClient, headers: dict[str, str], **params: Any) -> dict[str, Any]:
    response = client.get("/api/sessions", headers=headers, params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _ids(listing: dict[str, Any]) -> list[str]:
    return [item["session"] for item in listing["sessions"]]


def test_the_session_list_holds_the_callers_sessions_only(client: TestClient) -> None:
    assert _sessions(client, ACME) == {"sessions": [], "total": 0}
    _send(client, "chat-help", "hello", ACME)  # a help text: no result, no approval, so no time in any name
    held = _send(client, "chat-invoice", INVOICE, ACME)
    client.post(
        f"/api/sessions/chat-invoice/approvals/{held['pending'][0]['request_id']}",
        json={"approved": True},
        headers=ACME,
    )
    _send(client, "chat-chart", "Chart revenue", ACME)
    _send(client, "chat-chart", "Check the logs of billing", ACME)
    _send(client, "chat-chart", "Chart revenue", GLOBEX)  # the same id in another tenant

    mine = _sessions(client, ACME)
    assert mine["total"] == 3
    assert [(item["session"], item["turns"], item["results"]) for item in mine["sessions"]] == [
        ("chat-chart", 2, 2),  # the newest activity first
        ("chat-invoice", 2, 0),  # dated by its audit events
        ("chat-help", 1, 0),  # undated: after the dated ones
    ]
    first, second, last = (item["last_activity"] for item in mine["sessions"])
    assert datetime.fromisoformat(first) > datetime.fromisoformat(second) and last is None

    theirs = _sessions(client, GLOBEX)
    assert [(item["session"], item["turns"], item["results"]) for item in theirs["sessions"]] == [("chat-chart", 1, 2)]
    # "acme2" lists a directory whose name starts with "acme": it sees nothing of acme's.
    assert _sessions(client, ACME2) == {"sessions": [], "total": 0}
    _send(client, "chat-help", "hello", ACME2)
    assert _ids(_sessions(client, ACME2)) == ["chat-help"]
    assert _ids(_sessions(client, ACME)) == _ids(mine)  # and acme's list is unchanged by acme2's chat


def test_the_session_list_is_one_listing_and_reads_no_document(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    for session in ("one", "two", "three"):
        _send(client, session, "Chart revenue", ACME)
    calls: list[str] = []
    find_async, get_async = SyncBackedIO.find_async, SyncBackedIO.get_async

    async def counted_find(self: SyncBackedIO, path: str) -> dict[str, int]:
        calls.append(f"LIST {path.rsplit('/', 1)[-1]}")
        return await find_async(self, path)

    async def counted_get(self: SyncBackedIO, path: str) -> bytes:
        calls.append("GET")
        return await get_async(self, path)

    # Patched on the class, so whichever I/O the store picked for the backend (memory, local disk) is counted.
    monkeypatch.setattr(SyncBackedIO, "find_async", counted_find)
    monkeypatch.setattr(SyncBackedIO, "get_async", counted_get)
    listing = _sessions(client, ACME)
    assert calls == ["LIST acme"]
    assert sorted(_ids(listing)) == ["one", "three", "two"]


def test_the_session_list_is_limited_and_needs_a_token(client: TestClient) -> None:
    for session in ("one", "two", "three"):
        _send(client, session, "Chart revenue", ACME)
    limited = _sessions(client, ACME, limit=2)
    assert len(limited["sessions"]) == 2 and limited["total"] == 3
    assert _ids(limited) == _ids(_sessions(client, ACME))[:2]
    for limit in (0, 1001, "many"):
        refused = client.get("/api/sessions", headers=ACME, params={"limit": limit})
        assert refused.status_code == 422 and refused.json()["error"] == "invalid_request"
    for headers in ({}, {"Authorization": "Bearer not-a-token-of-anyone"}):
        response = client.get("/api/sessions", headers=headers)
        assert response.status_code == 401 and response.json()["error"] == "unauthorized"


def test_the_transcript_marks_approval_events(client: TestClient) -> None:
    held = _send(client, "chat-1", INVOICE, ACME)
    [request_id] = [item["request_id"] for item in held["pending"]]
    waiting = client.get("/api/sessions/chat-1/messages", headers=ACME).json()["messages"][-1]
    assert waiting["role"] == "assistant"
    assert waiting["event"] == {"kind": "approval_required", "request_ids": [request_id]}

    edited = {"customer": "Initech", "amount": 50}
    client.post(
        f"/api/sessions/chat-1/approvals/{request_id}", json={"approved": True, "arguments": edited}, headers=ACME
    )
    denied = _send(client, "chat-1", "Send an invoice to Globex for 9 EUR", ACME)
    client.post(
        f"/api/sessions/chat-1/approvals/{denied['pending'][0]['request_id']}",
        json={"approved": False, "reason": "over budget"},
        headers=ACME,
    )
    messages = client.get("/api/sessions/chat-1/messages", headers=ACME).json()["messages"]
    events = [(message["role"], message["event"]) for message in messages if "event" in message]
    assert events == [
        (
            "user",  # Haystack's note on the edit: a user message, which the page shows as an event
            {
                "kind": "approved",
                "edited": True,
                "tool_name": "send_invoice",
                "tool_call_id": "call_1_0",
                "arguments": edited,
            },
        ),
        (
            "tool",
            {
                "kind": "denied",
                "tool_name": "send_invoice",
                "tool_call_id": "call_6_0",
                "request_id": denied["pending"][0]["request_id"],
                "reason": "over budget",
            },
        ),
    ]
    # The user's own messages carry no event, even one worded like a note for a call that is not the next one.
    assert [message["text"] for message in messages if message["role"] == "user" and "event" not in message] == [
        INVOICE,
        "Send an invoice to Globex for 9 EUR",
    ]


def test_offloaded_results_carry_their_media_type(client: TestClient) -> None:
    _send(client, "chat-1", "Chart revenue", ACME)
    [tool] = [
        m for m in client.get("/api/sessions/chat-1/messages", headers=ACME).json()["messages"] if m["role"] == "tool"
    ]
    kinds = [(item["kind"], item["media_type"]) for item in tool["tool_result"]["offloaded_results"]]
    assert kinds == [("text", "text/plain; charset=utf-8"), ("bytes", "image/png")]
    assert [item["reference"] for item in tool["tool_result"]["offloaded_results"]] == tool["tool_result"]["offloaded"]


# `approval_event` on messages built as the approval hook builds them, in both result formats


CALL = ToolCall(tool_name="send_invoice", arguments={"customer": "Initech", "amount": 250}, id="call_1")


@pytest.mark.parametrize("result_format", ["haystack", "structured"])
@pytest.mark.parametrize(("reason", "shown"), [("over budget", "over budget"), (None, None)])
def test_a_denial_event_carries_the_persons_reason(result_format: Any, reason: str | None, shown: str | None) -> None:
    message = denial_result(CALL, denied_by_person(reason), request_id="r-1", result_format=result_format)
    assert approval_event([message], 0) == {
        "kind": "denied",
        "tool_name": "send_invoice",
        "tool_call_id": "call_1",
        "request_id": "r-1",
        "reason": shown,
    }


@pytest.mark.parametrize("result_format", ["haystack", "structured"])
def test_an_expiry_event_says_why(result_format: Any) -> None:
    message = denial_result(CALL, expired("asked at noon"), request_id="r-1", result_format=result_format)
    event = approval_event([message], 0)
    assert event is not None and event["kind"] == "expired"
    assert event["reason"] == "No approval was given in time: asked at noon"


def test_an_edit_note_is_an_event_only_before_the_call_it_describes() -> None:
    running = ToolCall(tool_name="send_invoice", arguments={"customer": "Initech", "amount": 50}, id="call_1")
    note = edit_note(CALL, running.arguments)
    conversation = [ChatMessage.from_user("Invoice Initech"), note, ChatMessage.from_assistant(tool_calls=[running])]
    assert approval_event(conversation, 0) is None
    assert approval_event(conversation, 1) == {
        "kind": "approved",
        "edited": True,
        "tool_name": "send_invoice",
        "tool_call_id": "call_1",
        "arguments": {"customer": "Initech", "amount": 50},
    }
    # The same words typed by a person, not followed by that call: an ordinary message.
    assert approval_event([note, ChatMessage.from_assistant("Sure.")], 0) is None
    assert approval_event([note, ChatMessage.from_assistant(tool_calls=[CALL])], 0) is None
    assert approval_event([note], 0) is None


def test_a_listing_that_reaches_a_sibling_prefix_lists_none_of_it() -> None:
    # Backends list by string prefix: S3 may answer "root/acme" with "root/acme2/..." keys too. The store's
    # find_objects leaves those out (tests/stores/test_objects_api.py); here, what is left makes only real sessions.
    from haystack_integrations.offload import FsspecToolResultStore
    from haystack_integrations.offload.sessions.outcomes import session_summaries

    root = FsspecToolResultStore("memory://sessions-sibling")
    result = root.for_session("acme", "mine").write(key="a.txt", content="x", tool_name="web_search")
    root.for_session("acme", "mine").documents("history").put("turn.00000003.end.json", b"{}")
    root.for_session("acme2", "theirs").write(key="a.txt", content="x")
    root.for_session("acme2", "theirs").documents("history").put("turn.00000001.start.json", b"{}")
    found = root.for_tenant("acme").find_objects()
    found |= {"README.txt": 10, "temp/.tmp-0123456789abcdef": 10}  # an operator's file; a write in progress
    [summary] = session_summaries(found, "acme")
    assert (summary.session, summary.turns, summary.results) == ("mine", 3, 1)
    assert result in {path.split("/")[-1] for path in found}
