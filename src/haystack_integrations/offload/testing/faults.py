"""
Fault injection between an S3 client and moto's server: a `LatencyProxy` that fails a chosen share of requests.

Real S3 fails now and then: it answers ``500 InternalError`` or ``503 SlowDown``, connections are reset, answers never
arrive. `FaultProxy` does the same at the wire, between s3fs/aiobotocore and moto's server, so the code under test sees
exactly what it would see from S3 (nothing in the client is patched)::

    client ──► FaultProxy ──(maybe)──► moto
                  │
                  ├── 500 / 503          answered by the proxy; moto never sees the request
                  ├── reset              connection reset (TCP RST) before moto sees the request
                  ├── reset-after        moto handles the request, then the connection is reset: did it happen?
                  ├── timeout            moto handles the request, the answer is held until the client gives up
                  └── slow               the answer arrives `slow_seconds` late (but arrives)

``reset-after`` and ``timeout`` are the *ambiguous* faults (`AMBIGUOUS_FAULTS`): the request took effect on the server
but the client cannot know, which is what a retried write must survive. A ``timeout`` needs the client's read timeout
to be shorter than `FaultProxy.hold_seconds` (for s3fs: ``config_kwargs={"read_timeout": 1}``).

Which requests fail is decided by a `FaultPlan`: a random share (``rate``, seeded, so a run can be replayed), an exact
share (``every=10``: every tenth matching request, cycling through the kinds), or a script (`FaultProxy.inject`:
"fail the next PUT with 503, twice"). Every injected fault is logged (`FaultProxy.faults`) next to the proxy's request
log, so a test can prove the faults really happened.

Example::

    from haystack_integrations.offload.testing.local_s3 import LocalS3Server
    from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy

    with LocalS3Server() as s3, FaultProxy(s3.endpoint_url, plan=FaultPlan(rate=0.1, seed=7)) as proxy:
        options = {**s3.storage_options(), "endpoint_url": proxy.endpoint_url,
                   "config_kwargs": {"read_timeout": 1}}
        ...                                           # about one S3 request in ten now fails
        proxy.inject(Fault.SLOW_DOWN, method="PUT")   # and the next PUT certainly does
        print(proxy.faults.counts())

From a shell: ``python -m haystack_integrations.offload.testing.faults --upstream http://127.0.0.1:5000 --rate 0.1``.

Limits: a fault is decided for the first request of each client connection. moto's server closes the connection after
every response, so behind it every request is the first of its connection; behind a keep-alive server, later requests
on a connection pass untouched.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import socket
import struct
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from haystack_integrations.offload.testing.latency_proxy import (
    _CHUNK,
    LatencyProxy,
    ProxiedRequest,
    ThreadSafeLog,
    _InterimResponses,
    _RequestHeads,
)

__all__ = ["AMBIGUOUS_FAULTS", "Fault", "FaultLog", "FaultPlan", "FaultProxy", "InjectedFault", "main"]


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


AMBIGUOUS_FAULTS = frozenset({Fault.RESET_AFTER, Fault.READ_TIMEOUT})
"""Faults after which the request has taken effect on the server although the client saw a failure."""

_ERROR_ANSWERS = {
    Fault.INTERNAL_ERROR: (500, "Internal Server Error", "InternalError", "We encountered an internal error."),
    Fault.SLOW_DOWN: (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}


@dataclass(frozen=True, slots=True)
class InjectedFault:
    """
    One fault the proxy injected.

    :param kind: What it did.
    :param request: The request it hit.
    """

    kind: Fault
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
    see `script`). Scripted faults come first, whatever the rate.

    :param rate: Probability, from 0 to 1, that a matching request fails.
    :param every: Fail exactly every `every`-th matching request instead (``every=10`` is an exact 10%).
    :param kinds: The kinds of fault to inject; all of them by default.
    :param methods: Only requests with these HTTP methods may fail (e.g. ``{"PUT"}``); all methods by default.
    :param seed: Seed for the random choices, so a run can be replayed.
    :raises ValueError: If `rate` is outside 0..1, `every` is below 1, both are given, or `kinds` is empty.
    """

    def __init__(
        self,
        *,
        rate: float = 0.0,
        every: int | None = None,
        kinds: Iterable[Fault | str] = tuple(Fault),
        methods: Iterable[str] | None = None,
        seed: int | None = 0,
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
        self._random = random.Random(seed)  # noqa: S311 - fault choice for tests, not cryptography
        self._lock = threading.Lock()
        self._matching = 0
        self._scripted: deque[tuple[Fault, str | None]] = deque()

    def script(self, *kinds: Fault | str, method: str | None = None) -> None:
        """
        Fail the next requests (of `method`, if given) with these faults, in order, before any random ones.

        :param kinds: One fault per request to fail.
        :param method: Only requests with this HTTP method take the scripted faults.
        """
        with self._lock:
            self._scripted.extend((Fault(kind), method.upper() if method else None) for kind in kinds)

    def decide(self, request: ProxiedRequest) -> Fault | None:
        """
        Decide the fate of one request.

        :param request: The request whose head just arrived.
        :returns: The fault to inject, or `None` to pass it through.
        """
        with self._lock:
            for position, (kind, method) in enumerate(self._scripted):
                if method is None or method == request.method:
                    del self._scripted[position]
                    return kind
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


class FaultProxy(LatencyProxy):
    """
    A `LatencyProxy` that also injects S3 faults: 500, 503 SlowDown, connection resets, read timeouts, slow answers.

    Run it like `LatencyProxy` (a context manager runs it in a thread of its own). `plan` may be replaced while it runs.

    ```python
    with FaultProxy(server.endpoint_url, plan=FaultPlan(every=10)) as proxy:   # exactly 10% of requests fail
        store = FsspecToolResultStore(url, storage_options={**options, "endpoint_url": proxy.endpoint_url})
        ...
        print(proxy.faults.counts(), len(proxy.requests.snapshot()))
    ```

    Multi-user tests: put one proxy in front of the server and let every session's store talk through it; the plan
    and the logs are shared, and thread-safe.

    :param upstream: The server to forward to, as ``http://host:port``.
    :param plan: Which requests fail and how; by default none (use `inject` to script faults).
    :param latency: Seconds added to every answer, as in `LatencyProxy`.
    :param slow_seconds: How late a `Fault.SLOW` answer arrives.
    :param hold_seconds: How long a `Fault.READ_TIMEOUT` answer is withheld at most (the client should give up first).
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
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(upstream, latency=latency, host=host, port=port)
        if slow_seconds < 0 or hold_seconds < 0:
            raise ValueError("slow_seconds and hold_seconds must not be negative.")
        self.plan = plan or FaultPlan()
        self.slow_seconds = slow_seconds
        self.hold_seconds = hold_seconds
        self.faults = FaultLog()

    def inject(self, *kinds: Fault | str, method: str | None = None) -> None:
        """
        Fail the next requests with these faults, one each, before any the plan draws.

        :param kinds: The faults, in order.
        :param method: Only requests with this HTTP method take them (e.g. ``"PUT"``).
        """
        self.plan.script(*kinds, method=method)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._connections += 1
        connection = self._connections
        upstream_writer: asyncio.StreamWriter | None = None
        to_upstream: asyncio.Task[None] | None = None
        try:
            parsed: list[ProxiedRequest] = []
            heads = _RequestHeads(
                lambda method, target: parsed.append(ProxiedRequest(method, target, connection, time.monotonic()))
            )
            # Hold the client's bytes until the first request head is complete: its fate decides whether they go on.
            buffered = bytearray()
            while not parsed and not heads._lost:
                chunk = await client_reader.read(_CHUNK)
                if not chunk:
                    return
                buffered += chunk
                heads.feed(chunk)
            fault = self.plan.decide(parsed[0]) if parsed else None
            for request in parsed:
                await self._on_request(request)
            if fault is not None:
                self.faults.append(InjectedFault(fault, parsed[0]))
            parsed.clear()

            if fault in _ERROR_ANSWERS:
                await self._answer_error(client_reader, client_writer, fault, head_only=buffered.startswith(b"HEAD "))
                return
            if fault is Fault.RESET:
                _reset(client_writer)
                return

            upstream_reader, upstream_writer = await asyncio.open_connection(*self._upstream)
            upstream_writer.write(bytes(buffered))
            await upstream_writer.drain()
            to_upstream = asyncio.create_task(self._copy_requests(client_reader, upstream_writer, heads, parsed))
            if fault is Fault.SLOW:
                await asyncio.sleep(self.slow_seconds)
            elif fault in AMBIGUOUS_FAULTS:
                # Let the server finish (read its whole answer), so the request has surely taken effect. Interim
                # answers still pass: a client that sent `Expect: 100-continue` sends its body only after one.
                interim = _InterimResponses()
                while chunk := await upstream_reader.read(_CHUNK):
                    now, _ = interim.split(chunk)
                    if now:
                        client_writer.write(now)
                        await client_writer.drain()
                if fault is Fault.RESET_AFTER:
                    _reset(client_writer)
                    return
                # Hold the answer back until the client hangs up (its read timeout) or the hold ends.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(to_upstream), self.hold_seconds)
                return
            await self._forward_responses(upstream_reader, client_writer)
        except (ConnectionError, OSError):
            pass  # a client or server that went away ends only its own connection
        except asyncio.CancelledError:
            pass  # the proxy is stopping; this handler is the top of its own task
        finally:
            await self._end_exchange(task, to_upstream, (client_writer, upstream_writer))

    async def _answer_error(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, fault: Fault, *, head_only: bool
    ) -> None:
        status, reason, code, message = _ERROR_ANSWERS[fault]
        body = (
            b""
            if head_only
            else (
                '<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{code}</Code><Message>{message}</Message>"
                f"<RequestId>fault-{time.monotonic_ns()}</RequestId></Error>"
            ).encode()
        )
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        await asyncio.sleep(self.latency)
        writer.write(head + body)
        await writer.drain()
        # Read what the client still sends (a body it began before the answer) until it hangs up: closing a socket
        # with unread bytes would reset the connection, and the client should see the answer, not a reset.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_drain(reader), timeout=5.0)


async def _drain(reader: asyncio.StreamReader) -> None:
    while await reader.read(_CHUNK):
        pass


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort the connection with a TCP RST (SO_LINGER 0), as a crashed peer or a middlebox would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


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
        default=",".join(kind.value for kind in Fault),
        help="comma-separated faults to draw from (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added per answer (default: %(default)s)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on, 0 for any (default: %(default)s)")
    args = parser.parse_args(argv)
    plan = FaultPlan(rate=args.rate, kinds=[kind.strip() for kind in args.kinds.split(",")], seed=args.seed)

    async def serve() -> None:
        proxy = await FaultProxy(args.upstream, plan=plan, latency=args.latency, port=args.port).start()
        print(f"Fault proxy ({args.rate:.0%} of requests fail) at {proxy.endpoint_url} -> {args.upstream}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await proxy.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
