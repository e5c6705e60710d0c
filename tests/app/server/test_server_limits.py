"""
The server's limits: request bodies are bounded before anything reads them, edited arguments are bounded, and the page
is served with headers that keep other sites from framing it or running script in it.

The body limit is checked three ways: at the ASGI level (the application is never called, ``receive`` never awaited,
for a body declared too large; a streamed body stops being pulled at the limit), through the app with TestClient, and
against a real ``offload-haystack serve`` process with raw sockets (a 256 MiB Content-Length answered at once; a
chunked body answered while it is still being sent; the worker's peak memory does not grow with either).
"""

import json
import re
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from server_processes import ServerProcess, serve
from server_tenants import ACME_TOKEN, TOKENS, bearer

from offload_haystack_app.server import ServerSettings, create_app
from offload_haystack_app.server.app import STATIC_DIR, BodyLimitMiddleware
from offload_haystack_app.server.routes import (
    MAX_ARGUMENTS_BYTES,
    MAX_ARGUMENTS_DEPTH,
    MAX_ARGUMENTS_VALUES,
    check_arguments_bounds,
)
from offload_haystack_app.server.settings import DEFAULT_MAX_BODY_BYTES

MiB = 1024 * 1024
CHUNK = 64 * 1024
ACME = bearer(ACME_TOKEN)
MESSAGES = "/api/sessions/chat-1/messages"


@pytest.fixture
def small_client() -> Iterator[TestClient]:
    """The app with a 2 KiB body limit, on a memory store."""
    settings = ServerSettings(store="memory://server-limits", tokens=TOKENS, max_body_bytes=2048)
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture(scope="module")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`offload-haystack serve` with the default settings (1 MiB bodies), one worker: the process is the worker."""
    directory = tmp_path_factory.mktemp("limits")
    with serve(store=str(directory / "results"), tokens=TOKENS, log=directory / "server.log") as server:
        yield server


# The body limit at the ASGI level: what the application behind the middleware sees


def _scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": MESSAGES,
        "raw_path": MESSAGES.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


async def test_a_declared_oversized_body_is_refused_before_the_app_runs_or_a_byte_is_read() -> None:
    events: list[str] = []
    sent: list[dict[str, Any]] = []

    async def application(scope: Any, receive: Any, send: Any) -> None:
        events.append("application called")

    async def receive() -> dict[str, Any]:
        events.append("body read")
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    middleware = BodyLimitMiddleware(application, max_body_bytes=DEFAULT_MAX_BODY_BYTES)
    await middleware(_scope([(b"content-length", str(256 * MiB).encode())]), receive, send)

    assert events == []
    assert sent[0]["status"] == 413
    assert (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"] == "body_too_large"


async def test_a_streamed_body_stops_being_pulled_at_the_limit_and_the_app_never_sees_more() -> None:
    """The real app, no token, a chunked body of up to 64 MiB: the 413 goes out once 1 MiB has passed."""
    pulled = 0
    sent: list[dict[str, Any]] = []
    chunk = b"a" * CHUNK

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        pulled += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": pulled < 64 * MiB}

    async def send(message: Any) -> None:
        sent.append(message)

    app = create_app(ServerSettings(store="memory://server-limits", tokens=TOKENS))
    await app(_scope([(b"transfer-encoding", b"chunked"), (b"content-type", b"application/json")]), receive, send)

    assert pulled <= DEFAULT_MAX_BODY_BYTES + CHUNK
    starts = [message for message in sent if message["type"] == "http.response.start"]
    assert [start["status"] for start in starts] == [413]  # whatever the app made of the error was dropped
    body = b"".join(message.get("body", b"") for message in sent if message["type"] == "http.response.body")
    assert json.loads(body)["error"] == "body_too_large"


async def test_other_connection_types_pass_through_untouched() -> None:
    seen: list[str] = []

    async def application(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    async def nothing() -> dict[str, Any]:
        raise AssertionError("not called")

    async def ignore(message: Any) -> None:
        raise AssertionError("not called")

    await BodyLimitMiddleware(application, max_body_bytes=1024)({"type": "lifespan"}, nothing, ignore)
    assert seen == ["lifespan"]


# The body limit through the app


def test_the_limit_comes_from_the_settings_and_applies_before_the_token_check(small_client: TestClient) -> None:
    under = small_client.post(MESSAGES, json={"text": "x" * 1500}, headers=ACME)
    assert under.status_code == 200, under.text

    for headers in (ACME, {}, bearer("not-a-token-at-all-000")):
        over = small_client.post(MESSAGES, json={"text": "x" * 2100}, headers=headers)
        assert over.status_code == 413
        assert over.json() == {
            "error": "body_too_large",
            "detail": "The request body is larger than the server's limit of 2048 bytes.",
        }


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_SERVER_MAX_BODY_BYTES", "4096")
    settings = ServerSettings(tokens=TOKENS)
    assert settings.max_body_bytes == 4096
    assert settings.environment()["OFFLOAD_SERVER_MAX_BODY_BYTES"] == "4096"  # workers get it too
    assert ServerSettings(tokens=TOKENS, max_body_bytes=DEFAULT_MAX_BODY_BYTES).max_body_bytes == 1024 * 1024
    with pytest.raises(ValueError, match="max_body_bytes"):
        ServerSettings(tokens=TOKENS, max_body_bytes=10)


# The body limit against a real server process, with raw sockets (an HTTP client would not send a lying length)


def _address(server: ServerProcess) -> tuple[str, int]:
    parts = urlsplit(server.base_url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _head(server: ServerProcess, framing: str) -> bytes:
    host, port = _address(server)
    return (
        f"POST {MESSAGES} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()


def _status(response: bytes) -> int:
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", response)
    assert match, response[:200]
    return int(match.group(1))


def _read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    received = b""
    try:
        while data := sock.recv(65536):
            received += data
    except ConnectionResetError:
        pass  # the server closed with our unread body in its buffer; what it sent first was read already
    return received


def _peak_memory(server: ServerProcess) -> int:
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    match = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    assert match
    return int(match.group(1)) * 1024


def _send_chunked(server: ServerProcess, total: int) -> tuple[bytes, int, bool]:
    """
    Stream a chunked body of up to `total` bytes, reading whenever the server answers.

    :returns: The response, the body bytes handed to the socket, and whether the whole body was sent.
    """
    frame = f"{CHUNK:x}\r\n".encode() + b"a" * CHUNK + b"\r\n"
    with socket.create_connection(_address(server), timeout=30) as sock:
        sock.sendall(_head(server, "Transfer-Encoding: chunked"))
        sock.setblocking(False)
        handed, pending, finished = 0, memoryview(b""), False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            writing = [sock] if not finished or pending else []
            readable, writable, _ = select.select([sock], writing, [], 1.0)
            if readable:
                break  # the server answered: stop sending
            if not writable:
                continue
            if not pending:
                if handed < total:
                    pending, handed = memoryview(frame), handed + CHUNK
                else:
                    pending, finished = memoryview(b"0\r\n\r\n"), True
            try:
                pending = pending[sock.send(pending) :]
            except (BrokenPipeError, ConnectionResetError):
                break
        complete = finished and not pending
        sock.setblocking(True)
        return _read_until_closed(sock, timeout=30), handed, complete


def test_a_huge_declared_body_is_answered_at_once_without_being_read(live_server: ServerProcess) -> None:
    before = _peak_memory(live_server)
    for _ in range(4):  # the measured attack: four unauthenticated 256 MiB POSTs
        with socket.create_connection(_address(live_server), timeout=30) as sock:
            sock.sendall(_head(live_server, f"Content-Length: {256 * MiB}") + b"{}")
            # Nothing more is sent: a server that waited for the body would never answer within the timeout.
            response = _read_until_closed(sock, timeout=10)
        assert _status(response) == 413
        assert b"connection: close" in response.lower()
        assert json.loads(response.split(b"\r\n\r\n", 1)[1])["error"] == "body_too_large"
    assert _peak_memory(live_server) - before < 16 * MiB
    assert httpx.get(f"{live_server.base_url}/api/health", timeout=10).status_code == 200


def test_a_chunked_body_is_answered_while_it_is_still_being_sent(live_server: ServerProcess) -> None:
    before = _peak_memory(live_server)
    for _ in range(2):
        response, handed, complete = _send_chunked(live_server, total=64 * MiB)
        assert _status(response) == 413
        # The server stopped reading at 1 MiB: only what the two sockets' buffers hold went out beyond that.
        assert not complete and handed < 32 * MiB
    assert _peak_memory(live_server) - before < 16 * MiB
    assert httpx.get(f"{live_server.base_url}/api/health", timeout=10).status_code == 200


# Edited arguments of a decision


def _pending_invoice(client: TestClient) -> str:
    turn = client.post(MESSAGES, json={"text": "Send an invoice to Initech for 250 EUR"}, headers=ACME).json()
    [request] = turn["pending"]
    return str(request["request_id"])


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"customer": "Initech", "amount": 1}
    for _ in range(depth - 1):
        value = {"next": value}
    return value


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        (_nested(MAX_ARGUMENTS_DEPTH + 1), f"nest deeper than {MAX_ARGUMENTS_DEPTH} levels"),
        ({"items": list(range(MAX_ARGUMENTS_VALUES))}, f"more than {MAX_ARGUMENTS_VALUES} keys and list items"),
        ({f"key-{number}": number for number in range(MAX_ARGUMENTS_VALUES + 1)}, f"more than {MAX_ARGUMENTS_VALUES}"),
        # Valid for the tool's schema: only the bound stops it.
        ({"customer": "x" * MAX_ARGUMENTS_BYTES, "amount": 1}, f"more than {MAX_ARGUMENTS_BYTES}"),
    ],
    ids=["too-deep", "too-many-items", "too-many-keys", "too-large"],
)
def test_oversized_edited_arguments_are_refused_with_422_and_the_request_stays_pending(
    client: TestClient, arguments: dict[str, Any], problem: str
) -> None:
    request_id = _pending_invoice(client)
    refused = client.post(
        f"/api/sessions/chat-1/approvals/{request_id}", json={"approved": True, "arguments": arguments}, headers=ACME
    )
    assert refused.status_code == 422
    assert refused.json()["error"] == "invalid_request"
    assert refused.json()["detail"].startswith("body.arguments: ")
    assert problem in refused.json()["detail"]
    pending = client.get("/api/sessions/chat-1/approvals", headers=ACME).json()["pending"]
    assert [item["request_id"] for item in pending] == [request_id]

    edited = {"customer": "Initech", "amount": 200}
    decided = client.post(
        f"/api/sessions/chat-1/approvals/{request_id}", json={"approved": True, "arguments": edited}, headers=ACME
    )
    assert decided.status_code == 200, decided.text
    assert "200 EUR" in decided.json()["resumed"]["reply"]


def test_arguments_at_the_bounds_pass() -> None:
    check_arguments_bounds(_nested(MAX_ARGUMENTS_DEPTH))
    check_arguments_bounds({"items": list(range(MAX_ARGUMENTS_VALUES - 1))})
    check_arguments_bounds({"text": "x" * (MAX_ARGUMENTS_BYTES - len('{"text":""}'))})
    with pytest.raises(ValueError, match="bytes as JSON"):
        check_arguments_bounds({"text": "é" * (MAX_ARGUMENTS_BYTES // 2)})  # counted in UTF-8 bytes, not characters


# The page's headers


@pytest.mark.parametrize("path", ["/", "/static/index.html", "/static/app.js", "/static/style.css"])
def test_the_page_and_its_files_cannot_be_framed_and_run_only_their_own_script(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    policy = {
        directive.split()[0]: directive.split()[1:]
        for directive in response.headers["Content-Security-Policy"].split(";")
        if directive.strip()
    }
    assert policy["default-src"] == ["'self'"]
    assert policy["script-src"] == ["'self'"]
    assert policy["style-src"] == ["'self'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["base-uri"] == ["'none'"]
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "no-referrer"


def test_the_page_has_no_inline_script_or_style_the_policy_would_block() -> None:
    page = (STATIC_DIR / "index.html").read_text()
    assert re.findall(r"<script\b[^>]*>", page) == ['<script src="/static/app.js">']
    assert "<style" not in page
    assert not re.search(r"\sstyle\s*=", page)
    assert not re.search(r"\son[a-z]+\s*=", page)  # inline event handlers
    assert not re.search(r"javascript:", page, re.IGNORECASE)
    script = (STATIC_DIR / "app.js").read_text()
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function", script)
    assert not re.search(r"setAttribute\(\s*[\"']style", script)


def test_the_page_names_an_icon_that_is_served(client: TestClient) -> None:
    # Without a <link rel="icon">, browsers ask for /favicon.ico, which answers 404 (and logs an error) on every load.
    page = client.get("/").text
    icon = re.search(r'<link rel="icon" href="([^"]+)"', page)
    assert icon is not None
    served = client.get(icon.group(1))
    assert served.status_code == 200 and served.headers["content-type"].startswith("image/svg+xml")
