"""
`FaultProxy` and `FaultPlan`: which requests fail, and what each fault kind does at the wire, seen from both ends.

The client is a store with a single attempt (`RetryPolicy(attempts=1)`), or boto3 with one attempt, so what the proxy
does reaches the test; moto's own request log says whether the server ever handled the request. moto closes every
connection after its answer; `KeepAliveServer` below does not, as real S3 servers do not.
"""

import http.client
import io
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from ops_helpers import proxied_options

from haystack_integrations.offload import FsspecToolResultStore, RetryPolicy, StorageError, StorageUnavailableError
from haystack_integrations.offload.testing.faults import (
    AMBIGUOUS_FAULTS,
    DEFAULT_FAULTS,
    Fault,
    FaultPlan,
    FaultProxy,
)
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from haystack_integrations.offload.testing.relay import ProxiedRequest
from support.sigint import ignore_sigint, interrupted

# One attempt, cut off before the proxy's 5 s hold ends, so a withheld answer always fails the attempt.
ONE_ATTEMPT = RetryPolicy(attempts=1, attempt_timeout=3.0)  # room for a loaded machine (CI runs tests in parallel)


def _request(method: str = "PUT", target: str = "/bucket/key", **headers: str) -> ProxiedRequest:
    fields = tuple((name.replace("_", "-"), value) for name, value in headers.items())
    return ProxiedRequest(method, target, 1, 0.0, (("Host", "127.0.0.1:9000"), *fields))


def test_every_gives_an_exact_share_cycling_through_the_kinds() -> None:
    plan = FaultPlan(every=10, kinds=[Fault.SLOW_DOWN, Fault.RESET])
    decisions = [plan.decide(_request()) for _ in range(100)]
    assert [kind for kind in decisions if kind is not None] == [Fault.SLOW_DOWN, Fault.RESET] * 5
    assert [i for i, kind in enumerate(decisions) if kind is not None] == list(range(9, 100, 10))


def test_rate_is_reproducible_from_the_seed_and_near_the_share() -> None:
    def draw(seed: int) -> list[Fault | None]:
        plan = FaultPlan(rate=0.1, seed=seed)
        return [plan.decide(_request()) for _ in range(2000)]

    assert draw(3) == draw(3)
    assert draw(3) != draw(4)
    failed = sum(kind is not None for kind in draw(3))
    assert 140 <= failed <= 260  # 10% of 2000, far inside any plausible spread
    assert {kind for kind in draw(3) if kind is not None} == set(DEFAULT_FAULTS)
    assert set(DEFAULT_FAULTS) == set(Fault) - {Fault.CONFLICT, Fault.NOT_IMPLEMENTED}


def test_methods_and_scripts_choose_which_requests_fail() -> None:
    plan = FaultPlan(every=1, methods=["put"])
    assert plan.decide(_request("GET")) is None
    assert plan.decide(_request("PUT")) is not None
    scripted = FaultPlan()
    scripted.script(Fault.SLOW_DOWN, "timeout", method="PUT")
    assert scripted.decide(_request("GET")) is None
    assert scripted.decide(_request("PUT")) is Fault.SLOW_DOWN
    assert scripted.decide(_request("PUT")) is Fault.READ_TIMEOUT
    assert scripted.decide(_request("PUT")) is None


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        FaultPlan(rate=1.5)
    with pytest.raises(ValueError, match="not both"):
        FaultPlan(rate=0.1, every=10)
    with pytest.raises(ValueError, match="not both"):
        FaultPlan(every=0)
    with pytest.raises(ValueError, match="at least one"):
        FaultPlan(kinds=[])
    with pytest.raises(ValueError):
        FaultPlan(kinds=["418"])
    with pytest.raises(ValueError, match="negative"):
        FaultProxy("http://127.0.0.1:9", slow_seconds=-1)


def test_the_first_conditional_put_of_each_key_meets_a_conflict_once() -> None:
    plan = FaultPlan(conflict_first_conditional_put=True)
    assert plan.decide(_request("PUT", "/b/k1")) is None  # not conditional
    assert plan.decide(_request("GET", "/b/k1", If_None_Match="*")) is None  # not a write
    assert plan.decide(_request("PUT", "/b/k1?x-id=PutObject", If_None_Match="*")) is Fault.CONFLICT
    assert plan.decide(_request("PUT", "/b/k1", If_None_Match="*")) is None  # once per key
    assert plan.decide(_request("PUT", "/b/k2", **{"if-none-match": "*"})) is Fault.CONFLICT
    scripted = FaultPlan(conflict_first_conditional_put=True)
    scripted.script(Fault.RESET)
    assert scripted.decide(_request("PUT", "/b/k1", If_None_Match="*")) is Fault.RESET  # scripts come first
    assert scripted.decide(_request("PUT", "/b/k1", If_None_Match="*")) is Fault.CONFLICT
    assert FaultPlan(every=1, kinds=["409"]).decide(_request("GET")) is Fault.CONFLICT  # asked for, it is answered


# At the wire: (faults injected on the next PUTs, whether the write fails, PUTs moto handled, whether it stored).
# aiohttp resends an idempotent request once when its connection drops, so a reset must happen twice to be seen.
WIRE = {
    Fault.INTERNAL_ERROR: ([Fault.INTERNAL_ERROR], True, 0, False),
    Fault.SLOW_DOWN: ([Fault.SLOW_DOWN], True, 0, False),
    Fault.RESET: ([Fault.RESET, Fault.RESET], True, 0, False),
    Fault.RESET_AFTER: ([Fault.RESET_AFTER, Fault.RESET_AFTER], True, 2, True),
    Fault.READ_TIMEOUT: ([Fault.READ_TIMEOUT], True, 1, True),
    Fault.SLOW: ([Fault.SLOW], False, 1, True),
}


@pytest.mark.s3
@pytest.mark.parametrize("kind", DEFAULT_FAULTS)
def test_each_fault_at_the_wire(
    kind: Fault, s3_server: LocalS3Server, s3_requests: RequestLog, fault_proxy: FaultProxy
) -> None:
    injected, fails, handled, stored = WIRE[kind]
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    once = FsspecToolResultStore(
        url, storage_options=proxied_options(s3_server, fault_proxy), retry=ONE_ATTEMPT, engine="fsspec"
    ).for_session("acme", "chat-1")
    once.list()  # open the client with one real request
    direct = FsspecToolResultStore(url, storage_options=s3_server.storage_options(), engine="fsspec").for_session(
        "acme", "chat-1"
    )
    s3_requests.clear()

    fault_proxy.inject(*injected, method="PUT")
    if fails:
        with pytest.raises(StorageUnavailableError) as caught:
            once.write(key="k.txt", content="payload")
        assert caught.value.attempts == 1
    else:
        once.write(key="k.txt", content="payload")
    assert s3_requests.count(method="PUT") == handled
    assert [record.size for record in direct.list()] == ([7] if stored else [])
    assert fault_proxy.faults.counts() == {kind: len(injected)}
    assert (kind in AMBIGUOUS_FAULTS) == (fails and stored)


@pytest.mark.s3
def test_one_reset_is_resent_by_aiohttp_below_the_store(
    s3_server: LocalS3Server, s3_requests: RequestLog, fault_proxy: FaultProxy
) -> None:
    once = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options=proxied_options(s3_server, fault_proxy),
        retry=ONE_ATTEMPT,
        engine="fsspec",
    ).for_session("acme", "chat-1")
    once.list()
    fault_proxy.requests.clear()
    s3_requests.clear()
    fault_proxy.inject(Fault.RESET, method="PUT")
    reference = once.write(key="k.txt", content="payload")
    assert fault_proxy.requests.count(method="PUT") == 2  # the reset one, and aiohttp's resend
    assert s3_requests.count(method="PUT") == 1
    assert once.retry_stats.as_dict()["retries"] == 0
    assert once.read(reference) == "payload"


@pytest.mark.s3
def test_errors_reach_get_and_head_too_and_big_bodies_pass_intact(
    s3_server: LocalS3Server, fault_proxy: FaultProxy
) -> None:
    once = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options=proxied_options(s3_server, fault_proxy),
        retry=ONE_ATTEMPT,
        engine="fsspec",
    ).for_session("acme", "chat-1")
    content = bytes(range(256)) * 20_000  # 5 MB each way
    reference = once.write(key="big.bin", content=content)
    assert once.read(reference) == content
    fault_proxy.inject(Fault.SLOW_DOWN, method="GET")
    with pytest.raises(StorageError, match="SlowDown"):
        once.read(reference)
    fault_proxy.inject(Fault.INTERNAL_ERROR, method="HEAD")
    with pytest.raises(StorageError, match="HTTP 500"):
        once.info(reference)
    assert once.read(reference) == content


# A keep-alive server, as real S3 servers are (moto's closes every connection), and kept-alive clients.


class KeepAliveServer(ThreadingHTTPServer):
    """An HTTP/1.1 object server on loopback that keeps connections alive, and logs what it handled."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _KeepAliveHandler)
        self.lock = threading.Lock()
        self.objects: dict[str, bytes] = {}
        self.handled: list[tuple[str, str, str | None]] = []  # method, path, Transfer-Encoding
        self.connections = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _KeepAliveHandler(BaseHTTPRequestHandler):
    """PUT, GET, HEAD and DELETE of objects by path; ``?chunked`` answers chunked, ``?close`` ends the body at close."""

    protocol_version = "HTTP/1.1"  # keep-alive; also answers ``Expect: 100-continue`` with a 100
    timeout = 120  # an idle connection left open by a test ends in the end
    server: KeepAliveServer

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _path(self) -> tuple[str, str]:
        parts = urlsplit(self.path)
        with self.server.lock:
            self.server.handled.append((self.command, parts.path, self.headers.get("Transfer-Encoding")))
        return parts.path, parts.query

    def _read_body(self) -> bytes:
        if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b""
        while size := int(self.rfile.readline().split(b";")[0], 16):
            body += self.rfile.read(size)
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b""):  # trailer fields, then the blank line
            pass
        return body

    def do_PUT(self) -> None:
        path, _ = self._path()
        body = self._read_body()
        with self.server.lock:
            taken = path in self.server.objects
            if not (taken and self.headers.get("If-None-Match") == "*"):
                self.server.objects[path] = body
        self.send_response(412 if taken and self.headers.get("If-None-Match") == "*" else 200)
        self.send_header("ETag", f'"{len(body)}"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self) -> None:
        path, _ = self._path()
        with self.server.lock:
            self.server.objects.pop(path, None)
        self.send_response(204)  # no body, and no Content-Length to say so
        self.end_headers()

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, *, head: bool) -> None:
        path, query = self._path()
        with self.server.lock:
            body = self.server.objects.get(path)
        if body is None:
            body = b"no such object"
            self.send_response(404)
        elif self.headers.get("If-None-Match") == f'"{len(body)}"':
            self.send_response(304)
            self.end_headers()
            return
        else:
            self.send_response(200)
        self.send_header("ETag", f'"{len(body)}"')
        if query == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if not head:
                for start in range(0, len(body), 7000):
                    piece = body[start : start + 7000]
                    self.wfile.write(b"%x;piece=%d\r\n%s\r\n" % (len(piece), start, piece))
                self.wfile.write(b"0\r\nX-Trailer: done\r\n\r\n")
        elif query == "close":
            self.close_connection = True  # neither a length nor chunks: the body ends when the connection does
            self.end_headers()
            if not head:
                self.wfile.write(body)
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)


@pytest.fixture
def keep_alive() -> Iterator[KeepAliveServer]:
    server = KeepAliveServer()
    thread = threading.Thread(target=server.serve_forever, name="keep-alive-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# Generous: no answer in these tests should take long, but a loaded machine must not turn one into a failure.
CLIENT_TIMEOUT = 30.0
# What a failed exchange raises in http.client: resets, a connection closed without an answer, a timeout.
BROKEN = (OSError, http.client.HTTPException)


def _connect(proxy: FaultProxy) -> http.client.HTTPConnection:
    return http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=CLIENT_TIMEOUT)


def _call(
    connection: http.client.HTTPConnection, method: str, path: str, body: Any = None, **headers: str
) -> tuple[int, bytes]:
    connection.request(method, path, body=body, headers={name.replace("_", "-"): v for name, v in headers.items()})
    answer = connection.getresponse()
    return answer.status, answer.read()


def _connections(proxy: FaultProxy) -> list[int]:
    return [request.connection for request in proxy.requests.snapshot()]


def test_a_rate_fails_its_share_of_the_requests_on_kept_alive_connections(keep_alive: KeepAliveServer) -> None:
    keep_alive.objects["/b/seed"] = b"seed" * 100
    total = 200
    with FaultProxy(keep_alive.url, plan=FaultPlan(rate=0.5, seed=11), slow_seconds=0.01, hold_seconds=0.05) as proxy:
        client = _connect(proxy)
        failed = 0
        for i in range(total):
            try:
                if i % 2:
                    status, body = _call(client, "GET", "/b/seed")
                    failed += (status, body) != (200, b"seed" * 100)
                else:
                    status, _ = _call(client, "PUT", f"/b/k{i}", b"x" * 100)
                    failed += status != 200
            except BROKEN:  # a reset, or an answer withheld until the proxy closed: the next request reconnects
                client.close()
                failed += 1
        client.close()

    requests, faults = proxy.requests.snapshot(), proxy.faults.snapshot()
    # Every request had its own decision: the very one the seeded plan makes for the n-th request it sees.
    replay = FaultPlan(rate=0.5, seed=11)
    assert len(requests) == total
    assert [fault.kind for fault in faults] == [kind for kind in map(replay.decide, requests) if kind is not None]
    assert 70 <= len(faults) <= 130
    assert failed == sum(fault.kind is not Fault.SLOW for fault in faults)
    # Over few connections: only resets and withheld answers end one (an error answer keeps it, as S3's do).
    closing = {Fault.RESET, Fault.RESET_AFTER, Fault.READ_TIMEOUT}
    assert len(set(_connections(proxy))) == 1 + sum(fault.kind in closing for fault in faults) < total
    firsts = {request.connection: request for request in reversed(requests)}
    assert sum(fault.request is not firsts[fault.request.connection] for fault in faults) > len(faults) // 2
    # The server handled exactly the requests the proxy forwarded, over no more connections than the client opened.
    unseen = {Fault.INTERNAL_ERROR, Fault.SLOW_DOWN, Fault.RESET}
    assert len(keep_alive.handled) == total - sum(fault.kind in unseen for fault in faults)
    assert keep_alive.connections <= len(set(_connections(proxy)))


# Per kind, on the third request of a kept-alive connection: the status the client sees (None: the exchange breaks),
# what it reads, whether the server handled the request, and whether the connection carries the next request.
MID_CONNECTION: dict[Fault, tuple[int | None, bytes, bool, bool]] = {
    Fault.INTERNAL_ERROR: (500, b"<Code>InternalError</Code>", False, True),
    Fault.SLOW_DOWN: (503, b"<Code>SlowDown</Code>", False, True),
    Fault.CONFLICT: (409, b"<Code>ConditionalRequestConflict</Code>", False, True),
    Fault.NOT_IMPLEMENTED: (501, b"<Code>NotImplemented</Code>", False, True),
    Fault.RESET: (None, b"", False, False),
    Fault.RESET_AFTER: (None, b"", True, False),
    Fault.READ_TIMEOUT: (None, b"", True, False),
    Fault.SLOW: (200, b"", True, True),
}


@pytest.mark.parametrize("kind", list(Fault))
def test_each_fault_hits_the_third_request_of_a_kept_alive_connection(kind: Fault, keep_alive: KeepAliveServer) -> None:
    status, shown, handled, kept = MID_CONNECTION[kind]
    with FaultProxy(keep_alive.url, slow_seconds=0.05, hold_seconds=60.0) as proxy:
        client = _connect(proxy)
        assert _call(client, "PUT", "/b/one", b"1") == (200, b"")
        assert _call(client, "GET", "/b/one") == (200, b"1")
        proxy.inject(kind)
        if kind is Fault.READ_TIMEOUT:
            client.sock.settimeout(1.0)  # the client gives up long before the proxy's hold ends
        try:
            seen = _call(client, "PUT", "/b/three", b"333")
        except BROKEN:
            seen = (None, b"")
            client.close()  # the next request opens a new connection, with the usual timeout
        assert seen[0] == status
        assert shown in seen[1]
        assert _call(client, "GET", "/b/one") == (200, b"1")  # and the next request is served
        client.close()

    assert _connections(proxy) == [1, 1, 1, 1 if kept else 2]
    assert [(fault.kind, fault.request.target, fault.request.connection) for fault in proxy.faults.snapshot()] == [
        (kind, "/b/three", 1)
    ]
    assert (("PUT", "/b/three", None) in keep_alive.handled) is handled
    assert ("/b/three" in keep_alive.objects) is handled


def test_chunked_bodies_pass_intact_and_keep_the_connection_in_step(keep_alive: KeepAliveServer) -> None:
    content = bytes(range(256)) * 1000  # 256 KB, in many chunks each way
    with FaultProxy(keep_alive.url) as proxy:
        client = _connect(proxy)
        pieces = (content[start : start + 10_000] for start in range(0, len(content), 10_000))
        assert _call(client, "PUT", "/b/chunked", pieces) == (200, b"")  # http.client sends an iterable chunked
        assert keep_alive.objects["/b/chunked"] == content
        assert _call(client, "GET", "/b/chunked?chunked") == (200, content)  # chunk extensions and trailer too
        proxy.inject(Fault.SLOW_DOWN, method="PUT")
        assert _call(client, "PUT", "/b/other", iter([b"abc", b"def"]))[0] == 503  # its body read, and dropped
        assert _call(client, "GET", "/b/chunked?chunked") == (200, content)
        client.close()
    assert ("PUT", "/b/chunked", "chunked") in keep_alive.handled
    assert "/b/other" not in keep_alive.objects
    assert _connections(proxy) == [1, 1, 1, 1]


def test_answers_without_a_body_keep_the_connection_in_step(keep_alive: KeepAliveServer) -> None:
    keep_alive.objects["/b/k"] = b"0123456789"
    with FaultProxy(keep_alive.url) as proxy:
        client = _connect(proxy)
        client.request("HEAD", "/b/k")
        answer = client.getresponse()
        assert (answer.status, answer.getheader("Content-Length"), answer.read()) == (200, "10", b"")
        client.request("HEAD", "/b/k?chunked")  # says chunked, sends no body: it answers a HEAD
        answer = client.getresponse()
        assert (answer.status, answer.getheader("Transfer-Encoding"), answer.read()) == (200, "chunked", b"")
        assert _call(client, "GET", "/b/k", If_None_Match='"10"') == (304, b"")
        proxy.inject(Fault.INTERNAL_ERROR, method="HEAD")
        assert _call(client, "HEAD", "/b/k") == (500, b"")
        assert _call(client, "DELETE", "/b/k") == (204, b"")
        assert _call(client, "GET", "/b/k") == (404, b"no such object")
        client.close()
    assert _connections(proxy) == [1] * 6
    assert proxy.faults.counts() == {Fault.INTERNAL_ERROR: 1}


def test_an_answer_that_ends_at_close_closes_the_clients_connection(keep_alive: KeepAliveServer) -> None:
    keep_alive.objects["/b/k"] = b"to the end" * 1000
    with FaultProxy(keep_alive.url) as proxy:
        client = _connect(proxy)
        assert _call(client, "GET", "/b/k") == (200, b"to the end" * 1000)
        assert _call(client, "GET", "/b/k?close") == (200, b"to the end" * 1000)
        proxy.inject(Fault.SLOW_DOWN)
        assert _call(client, "GET", "/b/k")[0] == 503  # on a new connection, decided as well
        assert _call(client, "GET", "/b/k") == (200, b"to the end" * 1000)
        client.close()
    assert _connections(proxy) == [1, 1, 2, 2]


def _raw_answer(stream: io.BufferedReader) -> tuple[bytes, dict[str, str], bytes]:
    status = stream.readline()
    headers = {}
    while (line := stream.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, stream.read(int(headers.get("content-length", "0")))


def test_expect_100_continue_on_a_kept_alive_connection(keep_alive: KeepAliveServer) -> None:
    put = b"PUT /b/%s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    with FaultProxy(keep_alive.url) as proxy, socket.create_connection(("127.0.0.1", proxy.port)) as client:
        client.settimeout(CLIENT_TIMEOUT)
        stream = client.makefile("rb")
        client.sendall(put % b"first")
        assert stream.readline() == b"HTTP/1.1 100 Continue\r\n"  # the server's, passed on at once
        assert stream.readline() == b"\r\n"
        client.sendall(b"hello")
        assert _raw_answer(stream)[0] == b"HTTP/1.1 200 OK\r\n"
        # Mid-connection, the error comes instead of the 100; the body was never sent, so the connection closes.
        proxy.inject(Fault.SLOW_DOWN)
        client.sendall(put % b"second")
        status, headers, body = _raw_answer(stream)
        assert (status, headers["connection"]) == (b"HTTP/1.1 503 Slow Down\r\n", "close")
        assert b"<Code>SlowDown</Code>" in body
        assert stream.read() == b""
    assert keep_alive.objects == {"/b/first": b"hello"}
    assert _connections(proxy) == [1, 1]


def test_pipelined_requests_are_answered_in_order(keep_alive: KeepAliveServer) -> None:
    keep_alive.objects["/b/k"] = b"abc"
    with FaultProxy(keep_alive.url) as proxy, socket.create_connection(("127.0.0.1", proxy.port)) as client:
        client.settimeout(CLIENT_TIMEOUT)
        stream = client.makefile("rb")
        proxy.inject(Fault.SLOW_DOWN, method="HEAD")
        client.sendall(
            b"GET /b/k HTTP/1.1\r\nHost: x\r\n\r\nHEAD /b/k HTTP/1.1\r\nHost: x\r\n\r\n"
            b"PUT /b/k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyzGET /b/k HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        assert _raw_answer(stream)[::2] == (b"HTTP/1.1 200 OK\r\n", b"abc")
        status, headers, _ = _raw_answer(stream)
        assert (status, headers["content-length"]) == (b"HTTP/1.1 503 Slow Down\r\n", "0")
        assert _raw_answer(stream)[0] == b"HTTP/1.1 200 OK\r\n"
        assert _raw_answer(stream)[::2] == (b"HTTP/1.1 200 OK\r\n", b"xyz")
    assert [request.method for request in proxy.requests.snapshot()] == ["GET", "HEAD", "PUT", "GET"]
    assert _connections(proxy) == [1, 1, 1, 1]


def test_latency_is_added_to_every_answer_on_a_kept_alive_connection(keep_alive: KeepAliveServer) -> None:
    keep_alive.objects["/b/k"] = b"abc"
    with FaultProxy(keep_alive.url, latency=0.2) as proxy:
        client = _connect(proxy)
        started = time.monotonic()
        for _ in range(3):
            assert _call(client, "GET", "/b/k") == (200, b"abc")
        proxy.inject(Fault.SLOW_DOWN)
        assert _call(client, "GET", "/b/k")[0] == 503
        # Each answer waits its latency: never sooner (a bound, not a timing).
        assert time.monotonic() - started >= 0.8
        client.close()
    assert _connections(proxy) == [1, 1, 1, 1]


# boto3 against moto through the proxy: one attempt, so that what the proxy does reaches the test.


def _boto3(s3_server: LocalS3Server, endpoint_url: str) -> Any:
    options = s3_server.storage_options()
    session = boto3.session.Session(
        aws_access_key_id=options["key"],
        aws_secret_access_key=options["secret"],
        region_name=options["client_kwargs"]["region_name"],
    )
    config = Config(retries={"total_max_attempts": 1}, connect_timeout=CLIENT_TIMEOUT, read_timeout=CLIENT_TIMEOUT)
    return session.client("s3", endpoint_url=endpoint_url, config=config)


@pytest.mark.s3
def test_boto3_sends_a_big_put_with_expect_100_continue_through_the_proxy(
    s3_server: LocalS3Server, s3_requests: RequestLog, fault_proxy: FaultProxy
) -> None:
    client = _boto3(s3_server, fault_proxy.endpoint_url)
    content = bytes(range(256)) * 8192  # 2 MB
    key = f"{uuid.uuid4().hex}/big.bin"
    client.put_object(Bucket=s3_server.bucket, Key=key, Body=io.BytesIO(content))
    (put,) = [request for request in fault_proxy.requests.snapshot() if request.method == "PUT"]
    assert put.header("expect") == "100-continue"  # botocore waited for the 100, then sent the body
    assert client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read() == content

    s3_requests.clear()
    fault_proxy.inject(Fault.SLOW_DOWN, method="PUT")
    with pytest.raises(ClientError) as caught:
        client.put_object(Bucket=s3_server.bucket, Key=f"{key}.2", Body=io.BytesIO(content))
    assert caught.value.response["Error"]["Code"] == "SlowDown"
    assert s3_requests.count(method="PUT") == 0
    client.put_object(Bucket=s3_server.bucket, Key=f"{key}.2", Body=io.BytesIO(content))
    assert client.get_object(Bucket=s3_server.bucket, Key=f"{key}.2")["Body"].read() == content
    assert fault_proxy.faults.counts() == {Fault.SLOW_DOWN: 1}


@pytest.mark.s3
def test_a_conflict_answers_the_first_conditional_put_of_each_key_once(
    s3_server: LocalS3Server, s3_requests: RequestLog, fault_proxy: FaultProxy
) -> None:
    fault_proxy.plan = FaultPlan(conflict_first_conditional_put=True)
    client = _boto3(s3_server, fault_proxy.endpoint_url)
    prefix = uuid.uuid4().hex

    def create(key: str) -> str:
        try:
            client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/{key}", Body=b"mine", IfNoneMatch="*")
        except ClientError as error:
            return f"{error.response['ResponseMetadata']['HTTPStatusCode']} {error.response['Error']['Code']}"
        return "created"

    assert create("a") == "409 ConditionalRequestConflict"
    assert s3_requests.count(method="PUT") == 0  # answered by the proxy
    assert create("a") == "created"  # the retry AWS asks for
    assert create("a") == "412 PreconditionFailed"  # moto's own answer: the key is taken
    client.put_object(Bucket=s3_server.bucket, Key=f"{prefix}/b", Body=b"plain")  # unconditional: never a conflict
    assert create("b") == "409 ConditionalRequestConflict"
    assert create("b") == "412 PreconditionFailed"
    assert fault_proxy.faults.counts() == {Fault.CONFLICT: 2}


@pytest.mark.s3
def test_ignore_conditional_writes_lets_a_second_create_of_a_key_succeed_on_moto(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    key = f"{uuid.uuid4().hex}/claim.json"
    with FaultProxy(s3_server.endpoint_url, ignore_conditional_writes=True) as proxy:
        client = _boto3(s3_server, proxy.endpoint_url)
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"first", IfNoneMatch="*")
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"second", IfNoneMatch="*")  # the condition is gone
        etag = client.head_object(Bucket=s3_server.bucket, Key=key)["ETag"]
        with pytest.raises(ClientError) as caught:  # conditional reads keep their conditions
            client.get_object(Bucket=s3_server.bucket, Key=key, IfNoneMatch=etag)
        assert caught.value.response["Error"]["Code"] == "304"
    assert [(header.name.lower(), header.value) for header in proxy.stripped.snapshot()] == [("if-none-match", "*")] * 2
    assert [request.header("if-none-match") for request in s3_requests.filter(method="PUT")] == [None, None]
    assert s3_server.client().get_object(Bucket=s3_server.bucket, Key=key)["Body"].read() == b"second"
    with pytest.raises(ClientError, match="PreconditionFailed"):  # moto itself honours the condition it sees
        s3_server.client().put_object(Bucket=s3_server.bucket, Key=key, Body=b"third", IfNoneMatch="*")


@pytest.mark.rgw
def test_on_ceph_rgw_a_rate_fails_its_share_of_one_kept_alive_clients_requests(real_s3_server: Any) -> None:
    # RGW keeps connections alive, as AWS does: a proxy deciding once per connection injected 2 faults in 40 here.
    total, plan = 40, FaultPlan(rate=0.5, kinds=[Fault.INTERNAL_ERROR, Fault.SLOW_DOWN], seed=5)
    with FaultProxy(real_s3_server.endpoint_url, plan=plan) as proxy:
        key, secret = real_s3_server.storage_options()["key"], real_s3_server.storage_options()["secret"]
        session = boto3.session.Session(aws_access_key_id=key, aws_secret_access_key=secret, region_name="us-east-1")
        client = session.client(
            "s3", endpoint_url=proxy.endpoint_url, config=Config(retries={"mode": "standard", "total_max_attempts": 1})
        )
        failed = 0
        for number in range(total):
            try:
                client.put_object(Bucket=real_s3_server.bucket, Key=f"kept-alive/{number}", Body=b"x" * 100)
            except ClientError:
                failed += 1
        client.close()
        connections = set(_connections(proxy))
    assert failed == len(proxy.faults) and 10 <= failed <= 30  # about half, each one a fault the proxy logged
    assert len(proxy.requests) == total > len(connections)  # more requests than connections: they were kept alive
    stored = real_s3_server.client().list_objects_v2(Bucket=real_s3_server.bucket, Prefix="kept-alive/")
    assert stored.get("KeyCount", 0) == total - failed  # the injected errors never reached the server


@pytest.mark.skipif(sys.platform == "win32", reason="sends SIGINT to stop the proxy")
def test_the_proxy_command_stops_on_sigint_even_where_its_parent_ignores_it() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "haystack_integrations.offload.testing.faults", "--upstream", "http://127.0.0.1:9"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=ignore_sigint,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("Fault proxy (10% of requests fail) at http://127.0.0.1:")
    finally:
        code = interrupted(process)
    assert code == 0
