"""
The HTTP/1.1 relay `faults.FaultProxy` is built on: a loopback TCP proxy that adds latency in front of a server (moto's
S3, a Ceph RGW) and logs the requests it passes, with the framing and head parsing the fault proxy decides on::

    client ──► LatencyProxy ──► moto ──► LatencyProxy ──(+latency)──► client

From a shell, the fault proxy with no faults is this proxy: ``python -m haystack_integrations.offload.testing.faults
--upstream http://127.0.0.1:5000 --rate 0 --latency 0.2``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Self, TypeVar
from urllib.parse import urlsplit

__all__ = ["LatencyProxy", "ProxiedRequest", "ProxyLog"]

CHUNK = 64 * 1024
# A request head longer than this is not HTTP we understand; counting stops on that connection.
_MAX_HEAD = 64 * 1024
_INTERIM_STATUS = re.compile(rb"HTTP/1\.[01] 1\d\d ")


Entry = TypeVar("Entry")


@dataclass(frozen=True, slots=True)
class ProxiedRequest:
    """
    One request that passed through the proxy.

    :param method: HTTP method, e.g. ``"PUT"``.
    :param target: The request target as sent (path and query).
    :param connection: A number identifying the client connection it came on.
    :param at: When its head arrived (`time.monotonic`).
    :param headers: Its header fields as the client sent them (names in the client's case, in its order).
    """

    method: str
    target: str
    connection: int
    at: float
    headers: tuple[tuple[str, str], ...] = ()

    def header(self, name: str) -> str | None:
        """
        :param name: A header name, in any case.
        :returns: Its value (the values of repeated fields joined by ``", "``), or `None` if the request had none.
        """
        return _header(self.headers, name)


class ThreadSafeLog(Generic[Entry]):
    """A log that proxy threads append to and tests read, oldest first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[Entry] = []

    def append(self, entry: Entry) -> None:
        """
        Record an entry.

        :param entry: The entry.
        """
        with self._lock:
            self._entries.append(entry)

    def clear(self) -> None:
        """Forget every entry logged so far."""
        with self._lock:
            self._entries = []

    def snapshot(self) -> list[Entry]:
        """
        :returns: A copy of the log.
        """
        with self._lock:
            return list(self._entries)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class ProxyLog(ThreadSafeLog[ProxiedRequest]):
    """A thread-safe log of proxied requests, oldest first."""

    def count(self, method: str | None = None) -> int:
        """
        :param method: Count only requests with this method (any case).
        :returns: How many requests were logged.
        """
        wanted = method.upper() if method is not None else None
        return sum(1 for request in self.snapshot() if wanted is None or request.method == wanted)

    def methods(self) -> Counter[str]:
        """
        :returns: Requests tallied by method.
        """
        return Counter(request.method for request in self.snapshot())


# How a body is framed, besides its length in bytes (see `body_length`).
CHUNKED = -1
UNTIL_CLOSE = -2
_HTTP_VERSION = re.compile(r"HTTP/1\.[01]")


def _header(headers: tuple[tuple[str, str], ...], name: str) -> str | None:
    wanted = name.lower()
    values = [value for field, value in headers if field.lower() == wanted]
    return ", ".join(values) if values else None


@dataclass(frozen=True, slots=True)
class Head:
    """
    The head of an HTTP/1.x message: a request's (method, target, version) or a response's (version, status), and its
    header fields as sent.
    """

    version: str
    headers: tuple[tuple[str, str], ...]
    method: str = ""
    target: str = ""
    status: int = 0

    def header(self, name: str) -> str | None:
        return _header(self.headers, name)

    def request(self, connection: int) -> ProxiedRequest:
        """This request head as the log keeps it: arrived now, on client connection number `connection`."""
        return ProxiedRequest(self.method, self.target, connection, time.monotonic(), self.headers)

    def tokens(self, name: str) -> set[str]:
        """The comma-separated values of a header such as ``Connection`` or ``Expect``, in lower case."""
        return {token.strip().lower() for token in (self.header(name) or "").split(",") if token.strip()}

    @property
    def keeps_alive(self) -> bool:
        """Whether the connection may carry another message after this one, as far as this head says."""
        if self.version == "HTTP/1.0":
            return "keep-alive" in self.tokens("connection")
        return "close" not in self.tokens("connection")


def parse_head(raw: bytes, *, response: bool = False) -> Head | None:
    """
    :param raw: A message head, through its blank line or without it.
    :param response: Parse a response head (status line) instead of a request head (request line).
    :returns: The head, or `None` if it is not HTTP/1.x.
    """
    start, *lines = raw.decode("latin-1").rstrip("\r\n").split("\r\n")
    parts = start.split(" ", 2)
    headers = []
    for line in lines:
        name, colon, value = line.partition(":")
        if colon:
            headers.append((name.strip(), value.strip()))
    if response:
        if len(parts) < 2 or not _HTTP_VERSION.fullmatch(parts[0]) or not (len(parts[1]) == 3 and parts[1].isdigit()):
            return None
        return Head(parts[0], tuple(headers), status=int(parts[1]))
    if len(parts) != 3 or not _HTTP_VERSION.fullmatch(parts[2]):
        return None
    return Head(parts[2], tuple(headers), method=parts[0].upper(), target=parts[1])


def body_length(head: Head, request_method: str | None = None) -> int:
    """
    How the body that follows `head` is framed (RFC 9112, section 6).

    :param head: A request head, or a response head.
    :param request_method: For a response, the method of the request it answers; `None` for a request.
    :returns: The body's length in bytes, `CHUNKED`, or `UNTIL_CLOSE` (a response that ends when the server closes).
    :raises ValueError: If the Content-Length is not a length.
    """
    if request_method is not None and (request_method == "HEAD" or head.status < 200 or head.status in (204, 304)):
        return 0
    if "chunked" in head.tokens("transfer-encoding"):
        return CHUNKED
    length = head.header("content-length")
    if length is None:
        return 0 if request_method is None else UNTIL_CLOSE
    if not length.isdigit():
        raise ValueError(f"Content-Length {length!r} is not a length.")
    return int(length)


class _RequestHeads:
    """Finds request heads in a client's byte stream, skipping bodies by Content-Length."""

    def __init__(self, on_request: Callable[[Head], None]) -> None:
        self._on_request = on_request
        self._buffer = bytearray()
        self._body_left = 0
        self._lost = False

    def feed(self, data: bytes) -> None:
        if self._lost:
            return
        view = memoryview(data)
        if self._body_left:
            skipped = min(self._body_left, len(view))
            self._body_left -= skipped
            view = view[skipped:]
        self._buffer += view
        while not self._body_left and not self._lost:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                self._lost = len(self._buffer) > _MAX_HEAD
                return
            head = bytes(self._buffer[:end])
            del self._buffer[: end + 4]
            self._parse(head)
            skipped = min(self._body_left, len(self._buffer))
            del self._buffer[:skipped]
            self._body_left -= skipped

    def _parse(self, raw: bytes) -> None:
        head = parse_head(raw)
        if head is None:
            self._lost = True
            return
        self._on_request(head)
        try:
            length = body_length(head)
        except ValueError:
            self._lost = True
            return
        if length == CHUNKED:
            self._lost = True  # chunked bodies are forwarded but not parsed
            return
        self._body_left = length


@dataclass(slots=True)
class Connection:
    """One client connection, and the upstream connection the proxy opened for it (once it did)."""

    number: int
    client_reader: asyncio.StreamReader
    client_writer: asyncio.StreamWriter
    upstream_reader: asyncio.StreamReader | None = None
    upstream_writer: asyncio.StreamWriter | None = None


# A client or server that went away: that ends only its own connection.
_PEER_GONE: tuple[type[Exception], ...] = (ConnectionError, OSError)


class LatencyProxy:
    """
    A TCP proxy on loopback that delays every final response by `latency` and logs the requests it passes.

    Real S3 answers a small PUT in tens of milliseconds and serves thousands in parallel; moto's server on loopback
    answers in about a millisecond but serves only a few hundred requests a second. Put this proxy in front of moto and
    clients see S3-like response times, so a benchmark measures how well they overlap requests rather than how fast
    moto is.

    The latency stands for the service's time to answer, so it is added once per request: every byte of a final
    response reaches the client `latency` after it left the server (a delay line, not a queue: responses in flight
    overlap, however many there are). Interim ``100 Continue`` answers pass at once: botocore sends PUTs with
    ``Expect: 100-continue``, and the round trip that costs against real S3 is a network round trip, not a service time.
    Requests are forwarded at once, and connections to the proxy are accepted at once.

    The proxy reads the head of each request passing through (method, target and headers; bodies are skipped by their
    ``Content-Length``) and logs it in `requests`, so a benchmark can count "requests per offloaded result" at the wire.
    A request with a chunked body ends the counting on its connection (the bytes are still forwarded).

    ```python
    with LocalS3Server() as s3, LatencyProxy(s3.endpoint_url, latency=0.2) as proxy:
        options = {**s3.storage_options(), "endpoint_url": proxy.endpoint_url}
        ...                                      # every S3 request now takes 200 ms longer
        assert proxy.requests.count(method="PUT") == 1
    ```

    Extending: every parsed request goes through `_on_request` before its bytes are forwarded, on the proxy's event
    loop. `faults.FaultProxy` is a subclass that frames each request and its answer to decide every request's fate.

    Run it on the caller's event loop (`start` / `stop`) or in a background thread with its own loop (use it as a
    context manager, or `start_in_thread` / `stop_in_thread`). `latency` may be changed while it runs.

    :param upstream: The server to forward to, as ``http://host:port``.
    :param latency: Seconds added to each request's response (the service time it stands for).
    :param host: Interface to listen on; keep loopback.
    :param port: Port to listen on; 0 picks a free one (see `port`).
    """

    def __init__(self, upstream: str, *, latency: float = 0.0, host: str = "127.0.0.1", port: int = 0) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must look like http://host:port, got {upstream!r}.")
        self._upstream = (parts.hostname, parts.port)
        self.latency = latency
        self.host = host
        self.requests = ProxyLog()
        self._requested_port = port
        self._server: asyncio.Server | None = None
        self._connections = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def latency(self) -> float:
        """Seconds added to each request's response."""
        return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"latency must not be negative, got {seconds}.")
        self._latency = float(seconds)

    @property
    def port(self) -> int:
        """
        :returns: The port the proxy listens on.
        :raises RuntimeError: If it is not running.
        """
        if self._server is None:
            raise RuntimeError("LatencyProxy is not running.")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def endpoint_url(self) -> str:
        """
        :returns: ``http://host:port`` of the proxy, to give clients as their endpoint.
        """
        return f"http://{self.host}:{self.port}"

    # On the caller's loop

    async def start(self) -> Self:
        """
        Start listening on the running event loop.

        :returns: The proxy.
        """
        self._server = await asyncio.start_server(self._serve, self.host, self._requested_port)
        return self

    async def stop(self) -> None:
        """Stop listening and drop every open connection."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    # In a thread of its own

    def start_in_thread(self) -> Self:
        """
        Run the proxy on its own event loop in a daemon thread; returns once it listens.

        :returns: The proxy.
        """
        started = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self.start())
            except BaseException as error:  # reported to the starting thread
                failure.append(error)
            started.set()
            if not failure:
                loop.run_forever()
                loop.run_until_complete(self.stop())
            loop.close()

        self._thread = threading.Thread(target=serve, name="latency-proxy", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]
        return self

    def stop_in_thread(self) -> None:
        """Stop a proxy started with `start_in_thread`. Safe to call twice."""
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join()

    def __enter__(self) -> Self:
        return self.start_in_thread()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc_value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop_in_thread()

    # Forwarding

    async def _on_request(self, request: ProxiedRequest) -> None:
        """
        Called for each request whose head arrived, before its bytes are forwarded. Logs it.

        The extension point for fault injection: a subclass may delay here, or act on the connection instead.

        :param request: The request.
        """
        self.requests.append(request)

    # What ends a connection quietly; subclasses that frame HTTP add the errors of peers that break it.
    _PEER_ERRORS = _PEER_GONE

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:  # asyncio.start_server runs every handler in a task of its own
            self._tasks.add(task)
        self._connections += 1
        link = Connection(self._connections, client_reader, client_writer)
        try:
            await self._relay(link)
        except self._PEER_ERRORS:
            pass  # a peer that went away ends only its own connection
        except asyncio.CancelledError:
            pass  # the proxy is stopping; this handler is the top of its own task
        finally:
            for writer in (client_writer, link.upstream_writer):
                if writer is not None:
                    writer.close()
            if task is not None:
                self._tasks.discard(task)

    async def _relay(self, link: Connection) -> None:
        """Pass the bytes of one client connection both ways, until the server is done with it."""
        link.upstream_reader, link.upstream_writer = await asyncio.open_connection(*self._upstream)
        to_upstream = asyncio.create_task(self._forward_requests(link.client_reader, link.upstream_writer, link.number))
        try:
            # The exchange is over when the server is done answering (moto closes after every response).
            await self._forward_responses(link.upstream_reader, link.client_writer)
        finally:
            await cancel(to_upstream)

    async def _forward_requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: int
    ) -> None:
        """Copy the client's bytes to the server at once, handing each request head on the way to `_on_request`."""
        parsed: list[ProxiedRequest] = []
        heads = _RequestHeads(lambda head: parsed.append(head.request(connection)))
        while chunk := await reader.read(CHUNK):
            heads.feed(chunk)
            for request in parsed:
                await self._on_request(request)
            parsed.clear()
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    async def _forward_responses(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy the server's bytes to the client: interim answers at once, the rest `latency` after they arrived."""
        loop = asyncio.get_running_loop()
        line: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue()
        interim = _InterimResponses()

        async def deliver() -> None:
            while True:
                due, chunk = await line.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if chunk is None:
                    return
                writer.write(chunk)
                await writer.drain()

        delivery = asyncio.create_task(deliver())
        try:
            while chunk := await reader.read(CHUNK):
                now, later = interim.split(chunk)
                if now:
                    line.put_nowait((loop.time(), now))
                if later:
                    line.put_nowait((loop.time() + self._latency, later))
            leftover = interim.flush()
            if leftover:
                line.put_nowait((loop.time() + self._latency, leftover))
            line.put_nowait((loop.time() + self._latency, None))
            await delivery
        finally:
            await cancel(delivery)


async def cancel(task: asyncio.Task[Any] | None, quiet: tuple[type[Exception], ...] = _PEER_GONE) -> None:
    """Stop `task` if it still runs and wait for it to end, cancelled or failed with one of `quiet`."""
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, *quiet):
            await task


class _InterimResponses:
    """Separates the interim (1xx) response heads at the start of a server's stream from what follows them."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._final = False

    def split(self, data: bytes) -> tuple[bytes, bytes]:
        """
        :returns: The interim response heads completed by `data` (to send now), and final-response bytes (to delay).
        """
        if self._final:
            return b"", data
        self._buffer += data
        now = bytearray()
        while len(self._buffer) >= len(b"HTTP/1.1 100 "):
            if not _INTERIM_STATUS.match(self._buffer):
                self._final = True
                return bytes(now), self.flush()
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            now += self._buffer[: end + 4]
            del self._buffer[: end + 4]
        return bytes(now), b""

    def flush(self) -> bytes:
        """
        :returns: Bytes held back waiting for a complete status line when the stream ended.
        """
        leftover = bytes(self._buffer)
        self._buffer.clear()
        return leftover
