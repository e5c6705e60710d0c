"""The benchmark's latency proxy: bytes pass intact, every request is logged once, responses are held back."""

import asyncio
import time

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from haystack_integrations.offload.testing.relay import (
    CHUNKED,
    UNTIL_CLOSE,
    LatencyProxy,
    _InterimResponses,
    _RequestHeads,
    body_length,
    parse_head,
)


def _heads(*chunks: bytes) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    parser = _RequestHeads(lambda head: seen.append((head.method, head.target)))
    for chunk in chunks:
        parser.feed(chunk)
    return seen


def test_request_heads_are_found_across_chunk_boundaries_and_bodies_are_skipped() -> None:
    stream = (
        b"PUT /b/k1 HTTP/1.1\r\nHost: x\r\nContent-Length: 18\r\n\r\n"
        b"GET / HTTP/1.1\r\n\r\n"  # a body that looks like a request head must not count
        b"GET /b/k1?x=1 HTTP/1.1\r\nHost: x\r\n\r\n"
        b"HEAD /b/k2 HTTP/1.1\r\ncontent-length: 0\r\n\r\n"
    )
    whole = [("PUT", "/b/k1"), ("GET", "/b/k1?x=1"), ("HEAD", "/b/k2")]
    assert _heads(stream) == whole
    for size in (1, 3, 7, 50):
        assert _heads(*(stream[i : i + size] for i in range(0, len(stream), size))) == whole


def test_counting_stops_at_a_chunked_body_or_garbage() -> None:
    chunked = b"POST /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /b HTTP/1.1\r\n\r\n"
    assert _heads(chunked) == [("POST", "/a")]
    assert _heads(b"not http at all\r\n\r\nGET /b HTTP/1.1\r\n\r\n") == []
    assert _heads(b"x" * 70_000) == []


def test_heads_are_parsed_and_say_how_their_bodies_are_framed() -> None:
    request = parse_head(
        b"put /b/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, Chunked\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
    )
    assert request is not None
    assert (request.method, request.target, request.version, request.header("X-A")) == (
        "PUT",
        "/b/k",
        "HTTP/1.1",
        "1, 2",
    )
    assert body_length(request) == CHUNKED
    assert request.keeps_alive
    plain = parse_head(b"GET / HTTP/1.0\r\nContent-Length: 0")
    assert plain is not None and body_length(plain) == 0 and not plain.keeps_alive
    assert parse_head(b"GET /\r\n\r\n") is None
    assert parse_head(b"HTTP/1.1 200 OK\r\n\r\n") is None  # a response is not a request

    def answer(status_line: bytes, *headers: bytes, method: str = "GET") -> int:
        head = parse_head(b"\r\n".join((status_line, *headers)), response=True)
        assert head is not None
        return body_length(head, method)

    assert answer(b"HTTP/1.1 200 OK", b"Content-Length: 12") == 12
    assert answer(b"HTTP/1.1 200 OK", b"Content-Length: 12", method="HEAD") == 0
    assert answer(b"HTTP/1.1 200 OK", b"Transfer-Encoding: chunked") == CHUNKED
    assert answer(b"HTTP/1.1 200 OK") == UNTIL_CLOSE
    assert answer(b"HTTP/1.1 204 No Content") == answer(b"HTTP/1.1 304 Not Modified") == answer(b"HTTP/1.1 100") == 0
    closing = parse_head(b"HTTP/1.1 200 OK\r\nConnection: Close", response=True)
    assert closing is not None and not closing.keeps_alive
    with pytest.raises(ValueError, match="not a length"):
        answer(b"HTTP/1.1 200 OK", b"Content-Length: -1")
    assert parse_head(b"HTTP/1.1 2000 OK", response=True) is None


def test_interim_responses_pass_and_the_final_response_is_held() -> None:
    interim = _InterimResponses()
    assert interim.split(b"HTTP/1.1 100 Cont") == (b"", b"")
    assert interim.split(b"inue\r\n\r\nHTTP/1.1 200 OK\r\n") == (
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n",
    )
    assert interim.split(b"body") == (b"", b"body")
    short = _InterimResponses()
    assert short.split(b"HTTP/1") == (b"", b"")
    assert short.flush() == b"HTTP/1"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="http://host:port"):
        LatencyProxy("s3://bucket")
    with pytest.raises(ValueError, match="negative"):
        LatencyProxy("http://127.0.0.1:9", latency=-0.1)


@pytest.mark.s3
def test_s3_through_the_proxy_is_intact_logged_and_delayed(s3_server: LocalS3Server, s3_requests: RequestLog) -> None:
    with LatencyProxy(s3_server.endpoint_url, latency=0.3) as proxy:
        options = {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        store = FsspecToolResultStore(f"{s3_server.bucket_url}/proxy-test", storage_options=options)
        session = store.for_session("t", "s")
        session.warm_up()
        s3_requests.clear()
        content = bytes(range(256)) * 20_000  # 5 MB: many chunks each way
        started = time.monotonic()
        reference = session.write(key="big.bin", content=content)
        assert session.read(reference) == content
        # Each exchange waits for its held-back response: never sooner than the latency (a bound, not a timing).
        assert time.monotonic() - started >= 0.6
        assert dict(proxy.requests.methods()) == {"PUT": 1, "GET": 1} == dict(s3_requests.methods())
        assert [request.target.split("?")[0] for request in proxy.requests.snapshot()] == [
            request.path for request in s3_requests.snapshot()
        ]
        assert all(request.header("authorization") for request in proxy.requests.snapshot())  # headers are logged
        proxy.latency = 0.0
        assert proxy.latency == 0.0


@pytest.mark.s3
async def test_it_runs_on_the_callers_loop_and_stops_with_connections_open(s3_server: LocalS3Server) -> None:
    proxy = await LatencyProxy(s3_server.endpoint_url, latency=0.05).start()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"GET /offload-results?list-type=2 HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    status = await reader.readline()
    assert status.startswith(b"HTTP/1.1 ")
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    await proxy.stop()
    assert await idle_reader.read() == b""  # the open connection was closed by stop
    writer.close()
    idle_writer.close()
    assert proxy.requests.count() == 1
    with pytest.raises(RuntimeError, match="not running"):
        _ = proxy.port
