"""
Fault injection between an S3 client and an S3-like server: a `LatencyProxy` that fails a chosen share of requests.

`FaultProxy` answers 500, 503 ``SlowDown`` or 409 ``ConditionalRequestConflict`` itself, resets connections before or
after the server handled a request, and withholds or delays answers: request by request, on kept-alive connections
too. `FaultPlan` decides which requests fail. From a shell:
``python -m haystack_integrations.offload.testing.faults --upstream http://127.0.0.1:5000 --rate 0.1``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from haystack_integrations.offload.testing.relay import (
    CHUNK,
    CHUNKED,
    UNTIL_CLOSE,
    Connection,
    Head,
    LatencyProxy,
    ProxiedRequest,
    ThreadSafeLog,
    body_length,
    cancel,
    parse_head,
)

__all__ = [
    "AMBIGUOUS_FAULTS",
    "DEFAULT_FAULTS",
    "Fault",
    "FaultLog",
    "FaultPlan",
    "FaultProxy",
    "InjectedFault",
    "StrippedHeader",
    "main",
]


class Fault(StrEnum):
    """A kind of S3 failure the proxy can inject."""

    INTERNAL_ERROR = "500"
    """``500 InternalError``, answered by the proxy; the server never sees the request."""
    SLOW_DOWN = "503"
    """``503 SlowDown`` (S3's throttling answer), answered by the proxy; the server never sees the request."""
    RESET = "reset"
    """The connection is reset (TCP RST) before the request reaches the server."""
    RESET_AFTER = "reset-after"
    """The server handles the request, then the connection is reset before the answer reaches the client."""
    READ_TIMEOUT = "timeout"
    """The server handles the request; its answer is withheld until the client gives up (its read timeout)."""
    SLOW = "slow"
    """The answer arrives `FaultProxy.slow_seconds` late."""
    CONFLICT = "409"
    """
    ``409 ConditionalRequestConflict``, answered by the proxy; the server never sees the request.

    AWS answers it to a conditional PUT (``If-None-Match``) while a competing write to the key is in flight, and says
    to retry. Not among `DEFAULT_FAULTS`: ask for it (``kinds=[Fault.CONFLICT]``, `FaultProxy.inject`, or
    ``FaultPlan(conflict_first_conditional_put=True)``).
    """
    NOT_IMPLEMENTED = "501"
    """
    ``501 NotImplemented``, answered by the proxy: what a store without conditional writes (Backblaze B2) answers to
    ``If-None-Match``. Not among `DEFAULT_FAULTS`: script it for the PUTs that carry the header.
    """


DEFAULT_FAULTS = tuple(kind for kind in Fault if kind not in {Fault.CONFLICT, Fault.NOT_IMPLEMENTED})
"""The kinds a `FaultPlan` draws from unless told otherwise: all but `Fault.CONFLICT` and `Fault.NOT_IMPLEMENTED`, which
only conditional writes meet."""

AMBIGUOUS_FAULTS = frozenset({Fault.RESET_AFTER, Fault.READ_TIMEOUT})
"""Faults after which the request has taken effect on the server although the client saw a failure."""

_ERROR_ANSWERS = {
    Fault.INTERNAL_ERROR: (500, "Internal Server Error", "InternalError", "We encountered an internal error."),
    Fault.SLOW_DOWN: (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    Fault.CONFLICT: (
        409,
        "Conflict",
        "ConditionalRequestConflict",
        "A conflicting conditional operation is currently in progress against this resource. Please try again.",
    ),
    Fault.NOT_IMPLEMENTED: (
        501,
        "Not Implemented",
        "NotImplemented",
        "A header you provided implies functionality that is not implemented.",
    ),
}
# The request headers `FaultProxy(ignore_conditional_writes=True)` strips, and the methods it leaves alone.
_CONDITIONS = frozenset({b"if-none-match", b"if-match"})
_READS = frozenset({"GET", "HEAD"})
# How long the proxy reads what a client still sends after an answer that closes the connection.
_LINGER_SECONDS = 5.0
# How a copy of a request's body may end besides being cancelled, when the answer made it moot.
_BODY_ERRORS = (ConnectionError, OSError, EOFError, ValueError)


@dataclass(frozen=True, slots=True)
class InjectedFault:
    """
    One fault the proxy injected.

    :param kind: What it did.
    :param request: The request it hit.
    """

    kind: Fault
    request: ProxiedRequest


@dataclass(frozen=True, slots=True)
class StrippedHeader:
    """
    One conditional header `FaultProxy(ignore_conditional_writes=True)` removed from a request before forwarding it.

    :param name: The header's name, as the client sent it (e.g. ``"If-None-Match"``).
    :param value: Its value (e.g. ``"*"``).
    :param request: The request it was removed from.
    """

    name: str
    value: str
    request: ProxiedRequest


class FaultLog(ThreadSafeLog[InjectedFault]):
    """A thread-safe log of injected faults, oldest first."""

    def counts(self) -> Counter[Fault]:
        """
        :returns: Faults tallied by kind.
        """
        return Counter(fault.kind for fault in self.snapshot())


class FaultPlan:
    """
    Decides, request by request, whether the proxy injects a fault, and which.

    Give either `rate` (each matching request fails with that probability; the kind is drawn from `kinds`) or `every`
    (exactly every n-th matching request fails, cycling through `kinds` in order), or neither (only scripted faults,
    see `script`). Scripted faults come first, whatever the rate; then, with `conflict_first_conditional_put`, the first
    conditional PUT of each key; then the share.

    :param rate: Probability, from 0 to 1, that a matching request fails.
    :param every: Fail exactly every `every`-th matching request instead (``every=10`` is an exact 10%).
    :param kinds: The kinds of fault to inject; `DEFAULT_FAULTS` by default.
    :param methods: Only requests with these HTTP methods may fail (e.g. ``{"PUT"}``); all methods by default.
    :param seed: Seed for the random choices, so a run can be replayed.
    :param conflict_first_conditional_put: Answer the first PUT carrying ``If-None-Match`` of each key (host and path)
        with `Fault.CONFLICT`, once; later conditional PUTs of the key go on as the rest of the plan decides. This is
        AWS's answer while a competing conditional write is in flight: a writer must retry, and then meet the outcome.
    :raises ValueError: If `rate` is outside 0..1, `every` is below 1, both are given, or `kinds` is empty.
    """

    def __init__(
        self,
        *,
        rate: float = 0.0,
        every: int | None = None,
        kinds: Iterable[Fault | str] = DEFAULT_FAULTS,
        methods: Iterable[str] | None = None,
        seed: int | None = 0,
        conflict_first_conditional_put: bool = False,
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be between 0 and 1, got {rate}.")
        if every is not None and (every < 1 or rate):
            raise ValueError("Give either rate or every (a positive integer), not both.")
        self.kinds = tuple(Fault(kind) for kind in kinds)
        if not self.kinds:
            raise ValueError("kinds must name at least one Fault.")
        self.rate = rate
        self.every = every
        self.methods = frozenset(method.upper() for method in methods) if methods is not None else None
        self.conflict_first_conditional_put = conflict_first_conditional_put
        self._random = random.Random(seed)  # noqa: S311 - fault choice for tests, not cryptography
        self._lock = threading.Lock()
        self._matching = 0
        self._scripted: deque[tuple[Fault, str | None, str | None]] = deque()
        self._conflicted: set[tuple[str | None, str]] = set()

    def script(self, *kinds: Fault | str, method: str | None = None, path_contains: str | None = None) -> None:
        """
        Fail the next requests (of `method`, if given) with these faults, in order, before any random ones.

        :param kinds: One fault per request to fail.
        :param method: Only requests with this HTTP method take the scripted faults.
        :param path_contains: Only requests whose path contains this take them (e.g. one document's kind).
        """
        with self._lock:
            method = method.upper() if method else None
            self._scripted.extend((Fault(kind), method, path_contains) for kind in kinds)

    def decide(self, request: ProxiedRequest) -> Fault | None:
        """
        Decide the fate of one request.

        :param request: The request whose head just arrived.
        :returns: The fault to inject, or `None` to pass it through.
        """
        with self._lock:
            path = request.target.partition("?")[0]
            for position, (kind, method, part) in enumerate(self._scripted):
                if (method is None or method == request.method) and (part is None or part in path):
                    del self._scripted[position]
                    return kind
            if self._first_conditional_put(request):
                return Fault.CONFLICT
            if self.methods is not None and request.method not in self.methods:
                return None
            self._matching += 1
            if self.every is not None:
                if self._matching % self.every:
                    return None
                return self.kinds[(self._matching // self.every - 1) % len(self.kinds)]
            if self.rate and self._random.random() < self.rate:
                return self._random.choice(self.kinds)
            return None

    def _first_conditional_put(self, request: ProxiedRequest) -> bool:
        conditional_put = request.method == "PUT" and request.header("if-none-match") is not None
        key = (request.header("host"), request.target.partition("?")[0])
        if not (self.conflict_first_conditional_put and conditional_put) or key in self._conflicted:
            return False
        self._conflicted.add(key)
        return True


class FaultProxy(LatencyProxy):
    """
    A `LatencyProxy` that also injects S3 faults: 500, 503, 409, connection resets, read timeouts, slow answers.

    Real S3 fails now and then: it answers ``500 InternalError`` or ``503 SlowDown``, connections are reset, answers
    never arrive. This proxy does the same at the wire, between s3fs/aiobotocore (or any HTTP/1.1 client) and moto's
    server, so the code under test sees exactly what it would see from S3 (nothing in the client is patched)::

        client ──► FaultProxy ──(maybe)──► moto
                      │
                      ├── 500 / 503 / 409    answered by the proxy; moto never sees the request
                      ├── reset              connection reset (TCP RST) before moto sees the request
                      ├── reset-after        moto handles the request, then the connection is reset: did it happen?
                      ├── timeout            moto handles the request, the answer is held until the client gives up
                      └── slow               the answer arrives `slow_seconds` late (but arrives)

    ``reset-after`` and ``timeout`` are the *ambiguous* faults (`AMBIGUOUS_FAULTS`): the request took effect on the
    server but the client cannot know, which is what a retried write must survive. A ``timeout`` needs the client's
    read timeout to be shorter than `hold_seconds` (for s3fs: ``config_kwargs={"read_timeout": 1}``).

    The proxy frames HTTP/1.1 (heads, ``Content-Length`` and chunked bodies, ``Expect: 100-continue``, answers without
    a body to HEAD or with 1xx/204/304, answers that end at close), so each request gets its own decision, also the
    later ones on a kept-alive connection. Each client connection has one upstream connection, opened at its first
    forwarded request; requests on it are handled one at a time, in order. A connection stays open where the client
    and the server keep it: after an injected 500/503/409 too, except when the client waits on
    ``Expect: 100-continue``: it gets the error instead of the ``100`` and the connection closes, as its body may
    follow or not. Interim answers always pass at once. `latency` delays the start of each final answer, injected
    ones included.

    Which requests fail is decided by `plan`, a `FaultPlan`: a random share (``rate``, seeded, so a run can be
    replayed), an exact share (``every=10``), or a script (`inject`: "fail the next PUT with 503, twice"). Every
    injected fault is logged in `faults` next to the request log `requests` (every request, with the number of its
    client connection), so a test can prove the faults really happened.

    ```python
    with FaultProxy(server.endpoint_url, plan=FaultPlan(every=10)) as proxy:   # exactly 10% of requests fail
        store = FsspecToolResultStore(url, storage_options={**options, "endpoint_url": proxy.endpoint_url})
        ...
        proxy.inject(Fault.SLOW_DOWN, method="PUT")   # and the next PUT certainly does
        print(proxy.faults.counts(), len(proxy.requests.snapshot()))
    ```

    Multi-user tests: put one proxy in front of the server and let every session's store talk through it; the plan
    and the logs are shared, and thread-safe. `plan` may be replaced while the proxy runs.

    Limits: HTTP/1.1 over plain TCP only. A request head the proxy cannot parse (or a ``101`` upgrade) turns the rest of
    its connection into a plain tunnel, with no more decisions. `ignore_conditional_writes` changes signed headers, so
    it suits only servers that check no signatures (moto; RGW or AWS answer 403).

    :param upstream: The server to forward to, as ``http://host:port``.
    :param plan: Which requests fail and how; by default none (use `inject` to script faults).
    :param latency: Seconds added to every answer, as in `LatencyProxy`.
    :param slow_seconds: How late a `Fault.SLOW` answer arrives.
    :param hold_seconds: How long a `Fault.READ_TIMEOUT` answer is withheld at most (the client should give up first).
    :param ignore_conditional_writes: Strip ``If-None-Match`` and ``If-Match`` from every request but GET and HEAD
        before forwarding it, so the server acts as a store that ignores conditional writes (as GCS's S3 API, Garage
        and old SeaweedFS do). moto only: it breaks the request's signature. Each removed header is logged in
        `stripped`.
    :param host: Interface to listen on; keep loopback.
    :param port: Port to listen on; 0 picks a free one.
    """

    def __init__(
        self,
        upstream: str,
        *,
        plan: FaultPlan | None = None,
        latency: float = 0.0,
        slow_seconds: float = 0.5,
        hold_seconds: float = 30.0,
        ignore_conditional_writes: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(upstream, latency=latency, host=host, port=port)
        if slow_seconds < 0 or hold_seconds < 0:
            raise ValueError("slow_seconds and hold_seconds must not be negative.")
        self.plan = plan or FaultPlan()
        self.slow_seconds = slow_seconds
        self.hold_seconds = hold_seconds
        self.ignore_conditional_writes = ignore_conditional_writes
        self.faults = FaultLog()
        self.stripped: ThreadSafeLog[StrippedHeader] = ThreadSafeLog()

    def inject(self, *kinds: Fault | str, method: str | None = None, path_contains: str | None = None) -> None:
        """
        Fail the next requests with these faults, one each, before any the plan draws.

        :param kinds: The faults, in order.
        :param method: Only requests with this HTTP method take them (e.g. ``"PUT"``).
        :param path_contains: Only requests whose path contains this take them (e.g. ``".approvals/claim"``).
        """
        self.plan.script(*kinds, method=method, path_contains=path_contains)

    # A peer that broke HTTP framing ends only its own connection too.
    _PEER_ERRORS = (*_BODY_ERRORS, asyncio.LimitOverrunError)

    async def _relay(self, link: Connection) -> None:
        """Serve the requests of one client connection one at a time; the upstream connection opens at the first."""
        while await self._exchange(link):
            pass

    async def _exchange(self, link: Connection) -> bool:
        """Serve the next request on `link`. Returns whether the connection stays open for another."""
        try:
            raw = await _read_head(link.client_reader)
        except asyncio.LimitOverrunError:
            await self._tunnel(link, b"")  # a head longer than the proxy parses: the server may make sense of it
            return False
        if raw is None:
            return False
        head = parse_head(raw)
        if head is None:
            await self._tunnel(link, raw)
            return False
        request = head.request(link.number)
        fault = self.plan.decide(request)
        await self._on_request(request)
        if fault is not None:
            self.faults.append(InjectedFault(fault, request))
        if fault is Fault.RESET:
            _reset(link.client_writer)
            return False
        if fault in _ERROR_ANSWERS:
            return await self._answer_error(link, head, fault)
        return await self._forward(link, raw, head, request, fault)

    async def _answer_error(self, link: Connection, head: Head, fault: Fault) -> bool:
        length = body_length(head)
        # A client waiting on `Expect: 100-continue` gets the error instead of the 100, as a real server may answer;
        # whether it sends its body anyway is unknown (aiohttp does), so the connection closes after the answer.
        waiting = length != 0 and "100-continue" in head.tokens("expect")
        if not waiting:
            await _copy_body(link.client_reader, None, length)
        keep = head.keeps_alive and not waiting
        status, reason, code, message = _ERROR_ANSWERS[fault]
        error = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<RequestId>fault-{time.monotonic_ns()}</RequestId></Error>"
        )
        body = b"" if head.method == "HEAD" else error.encode()
        answer = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            + ("" if keep else "Connection: close\r\n")
            + "\r\n"
        ).encode()
        await self._answer_late(0.0)
        link.client_writer.write(answer + body)
        await link.client_writer.drain()
        if not keep:
            # Read what the client still sends until it hangs up: closing a socket with unread bytes would reset the
            # connection, and the client should see the answer, not a reset.
            await _until_hang_up(link.client_reader, _LINGER_SECONDS)
        return keep

    async def _forward(
        self, link: Connection, raw: bytes, head: Head, request: ProxiedRequest, fault: Fault | None
    ) -> bool:
        if link.upstream_reader is None or link.upstream_writer is None:
            link.upstream_reader, link.upstream_writer = await asyncio.open_connection(*self._upstream)
        reader, writer = link.upstream_reader, link.upstream_writer
        writer.write(self._outgoing(raw, head, request))
        length = body_length(head)
        # The body goes on beside the wait for the answer: a client that sent `Expect: 100-continue` sends it only
        # after the server's 100, and a server may answer before it read the whole body.
        body = asyncio.create_task(_copy_body(link.client_reader, writer, length)) if length else None
        try:
            answer = await _final_head(reader, link.client_writer)
            if answer is None:
                return False  # the server closed without answering: so does the proxy
            raw_answer, answer_head = answer
            if answer_head.status == 101:
                await _settle(body)
                link.client_writer.write(raw_answer)
                await self._tunnel(link, b"")
                return False
            answer_length = body_length(answer_head, head.method)
            keep = head.keeps_alive and answer_head.keeps_alive and answer_length != UNTIL_CLOSE
            if fault in AMBIGUOUS_FAULTS:
                await _copy_body(reader, None, answer_length)  # the server is done: the request has taken effect
                await _settle(body)
                if fault is Fault.RESET_AFTER:
                    _reset(link.client_writer)
                    return False
                # Withhold the answer until the client hangs up (its read timeout) or the hold ends.
                await _until_hang_up(link.client_reader, self.hold_seconds)
                return False
            await self._answer_late(self.slow_seconds if fault is Fault.SLOW else 0.0)
            link.client_writer.write(raw_answer)
            await _copy_body(reader, link.client_writer, answer_length)
            await link.client_writer.drain()
            # An answer that came before the whole body leaves the connection's framing unknown: it closes.
            return await _settle(body) and keep
        finally:
            await cancel(body, _BODY_ERRORS)

    def _outgoing(self, raw: bytes, head: Head, request: ProxiedRequest) -> bytes:
        """The request head to forward: as sent, or without its conditions under `ignore_conditional_writes`."""
        if not self.ignore_conditional_writes or head.method in _READS:
            return raw
        kept = []
        for line in raw.split(b"\r\n"):
            name, colon, value = line.partition(b":")
            if colon and name.strip().lower() in _CONDITIONS:
                field, text = name.strip().decode("latin-1"), value.strip().decode("latin-1")
                self.stripped.append(StrippedHeader(field, text, request))
            else:
                kept.append(line)
        return b"\r\n".join(kept)

    async def _answer_late(self, extra: float) -> None:
        delay = self._latency + extra
        if delay > 0:
            await asyncio.sleep(delay)

    async def _tunnel(self, link: Connection, sent: bytes) -> None:
        """Pass the rest of the connection through both ways, unparsed, until the server is done."""
        if link.upstream_reader is None or link.upstream_writer is None:
            link.upstream_reader, link.upstream_writer = await asyncio.open_connection(*self._upstream)
        link.upstream_writer.write(sent)
        to_upstream = asyncio.create_task(_pipe(link.client_reader, link.upstream_writer))
        try:
            await _pipe(link.upstream_reader, link.client_writer)
        finally:
            to_upstream.cancel()  # no-op once it is done; awaited either way, so that its end is seen
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                await to_upstream


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The next message head on `reader`, through its blank line; `None` if the stream ends first."""
    while True:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        raw = raw.lstrip(b"\r\n")  # empty lines before a message are to be ignored (RFC 9112, section 2.2)
        if raw:
            return raw


async def _final_head(reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> tuple[bytes, Head] | None:
    """Relay the server's interim (1xx) answers to the client at once; return its final answer's head, if any."""
    while True:
        raw = await _read_head(reader)
        if raw is None:
            return None
        head = parse_head(raw, response=True)
        if head is None:
            raise ValueError("The server's answer is not HTTP/1.x.")
        if not 100 <= head.status < 200 or head.status == 101:
            return raw, head
        client.write(raw)
        await client.drain()


async def _settle(body: asyncio.Task[None] | None) -> bool:
    """
    :returns: Whether the request's body went through whole; if not, stop sending it.
    :raises Exception: What stopped the body from going through (e.g. the client hung up).
    """
    if body is None:
        return True
    if body.done():
        body.result()
        return True
    await cancel(body, _BODY_ERRORS)
    return False


# The copies below wait for the writer before each write, not after: they end right after their last write, so a copy
# task that is not done when the server's answer has arrived had not yet read the whole body (see `_settle`).


async def _copy_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None, length: int) -> None:
    """Copy one message body, framed by `length` (see `relay.body_length`); a `None` writer discards it."""
    if length == CHUNKED:
        await _copy_chunked(reader, writer)
    elif length == UNTIL_CLOSE:
        await _copy_until_close(reader, writer)
    else:
        await _copy_exactly(reader, writer, length)


async def _copy_exactly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None, size: int) -> None:
    while size > 0:
        if writer is not None:
            await writer.drain()
        chunk = await reader.read(min(size, CHUNK))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", size)
        size -= len(chunk)
        if writer is not None:
            writer.write(chunk)


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None) -> None:
    """Copy a chunked body as it is framed: chunks (extensions and all), the last chunk, trailer fields."""
    while True:
        line = await reader.readuntil(b"\r\n")
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size < 0:
            raise ValueError("A chunk's size must not be negative.")
        if writer is not None:
            await writer.drain()
            writer.write(line)
        if size == 0:
            break
        await _copy_exactly(reader, writer, size + 2)  # the chunk and its CRLF
    while True:
        line = await reader.readuntil(b"\r\n")
        if writer is not None:
            writer.write(line)
        if line == b"\r\n":
            return


async def _copy_until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None) -> None:
    while True:
        if writer is not None:
            await writer.drain()
        chunk = await reader.read(CHUNK)
        if not chunk:
            return
        if writer is not None:
            writer.write(chunk)


async def _until_hang_up(reader: asyncio.StreamReader, seconds: float) -> None:
    """Read, and drop, what the client still sends until it hangs up; for `seconds` at most."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(_copy_until_close(reader, None), seconds)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await _copy_until_close(reader, writer)
    await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0), as a crashed peer or a middlebox would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _serve_until_interrupted(proxy: LatencyProxy, banner: Callable[[str], str]) -> int:
    """Run `proxy` on an event loop of its own until Ctrl-C, printing `banner(endpoint_url)` once it listens."""

    async def serve() -> None:
        await proxy.start()
        print(banner(proxy.endpoint_url), flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await proxy.stop()

    signal.signal(signal.SIGINT, signal.default_int_handler)  # stopped by SIGINT, even if the parent ignores it
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run a fault proxy until Ctrl-C: ``python -m haystack_integrations.offload.testing.faults``.

    :param argv: Command-line arguments; ``None`` reads ``sys.argv``.
    :returns: The process exit code.
    """
    parser = argparse.ArgumentParser(
        prog="python -m haystack_integrations.offload.testing.faults",
        description="Fail a share of the requests to a local HTTP server (e.g. moto's S3), as S3 sometimes does.",
    )
    parser.add_argument("--upstream", required=True, help="server to forward to, e.g. http://127.0.0.1:5000")
    parser.add_argument("--rate", type=float, default=0.1, help="share of requests that fail (default: %(default)s)")
    parser.add_argument(
        "--kinds",
        default=",".join(kind.value for kind in DEFAULT_FAULTS),
        help="comma-separated faults to draw from (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added per answer (default: %(default)s)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on, 0 for any (default: %(default)s)")
    parser.add_argument(
        "--ignore-conditional-writes",
        action="store_true",
        help="strip If-None-Match and If-Match from writes (moto only: it breaks their signatures)",
    )
    args = parser.parse_args(argv)
    plan = FaultPlan(rate=args.rate, kinds=[kind.strip() for kind in args.kinds.split(",")], seed=args.seed)
    proxy = FaultProxy(
        args.upstream,
        plan=plan,
        latency=args.latency,
        ignore_conditional_writes=args.ignore_conditional_writes,
        port=args.port,
    )
    return _serve_until_interrupted(
        proxy, lambda endpoint: f"Fault proxy ({args.rate:.0%} of requests fail) at {endpoint} -> {args.upstream}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
