"""
Whether a worker takes new work: not before its store's exclusive creates are known to hold, not once it drains.

A worker drains from the moment it gets SIGTERM (or SIGINT): `/api/health` answers 503 so a load balancer stops
sending it work, and `DrainingMiddleware` refuses new turns and decisions with 503 ``draining`` (a load balancer may
send them to another replica) while requests already running finish, within the drain time. Only then is the signal
passed on to the server (uvicorn), which closes its listening socket: until then a new connection is answered 503,
not refused, so a client can tell "send it elsewhere" from "down". Before its store's exclusive creates are known to
hold (a store not up yet), it refuses work the same way, with 503 ``not_ready``.
"""

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Requests that start work (a turn, a decision and its resume, a session's end): refused while draining.
_STARTS_WORK = frozenset({"POST", "PUT", "DELETE", "PATCH"})

SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None
# How often the drain looks whether the work it waits for has ended (a check of two counters: cheap).
_IDLE_POLL_SECONDS = 0.05

logger = logging.getLogger(__name__)


class Readiness:
    """One worker's readiness: the start-up check's verdict and, once a stop signal came, when draining began."""

    def __init__(self, drain_seconds: float) -> None:
        """
        :param drain_seconds: How long running requests and turns may go on once draining began.
        """
        self.drain_seconds = drain_seconds
        self.exclusive_creates: str = "unchecked"
        self.draining_since: float | None = None
        # The tasks serving requests that start work, admitted and not yet answered (`DrainingMiddleware` keeps them).
        self.working: set[asyncio.Task[Any]] = set()
        self._previous: dict[int, SignalHandler] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._other_work: Callable[[], int] = lambda: 0
        self._handover: asyncio.Task[None] | None = None
        self._signals: set[int] = set()  # the stop signals received
        self._handed_over = False  # whether a signal went on to the server's handler

    @property
    def draining(self) -> bool:
        """Whether a stop signal came."""
        return self.draining_since is not None

    def drain(self) -> None:
        """Start draining (a stop signal does this; a test or an embedding application may too)."""
        if self.draining_since is None:
            self.draining_since = time.monotonic()

    def remaining(self) -> float:
        """Seconds left of the drain time (all of it before draining began)."""
        if self.draining_since is None:
            return self.drain_seconds
        return max(0.0, self.drain_seconds - (time.monotonic() - self.draining_since))

    def not_ready_because(self) -> str | None:
        """Why the worker takes no new work (``"draining"``, ``"exclusive creates unchecked"``), or None."""
        if self.draining:
            return "draining"
        if self.exclusive_creates != "enforced":
            return f"exclusive creates {self.exclusive_creates}"
        return None

    def watch_signals(self, other_work: Callable[[], int] | None = None) -> None:
        """
        Start draining on SIGTERM or SIGINT; once the work running then has ended (or the drain time is up), pass the
        signal on to the handler the server installed (uvicorn's starts its graceful shutdown and closes the listening
        socket). The same signal again (Ctrl-C twice) is passed on at once; another one (the SIGTERM uvicorn's
        supervisor sends its workers after the terminal's SIGINT) joins the drain. Only in the main thread, where
        signals are delivered; elsewhere a no-op. Call it from the server's event loop (the lifespan), where the drain
        then runs.

        :param other_work: How much work the drain waits for besides the requests in flight (running turns whose
            clients left).
        """
        if threading.current_thread() is not threading.main_thread():
            return
        with contextlib.suppress(RuntimeError):  # no loop running: signals are passed on at once
            self._loop = asyncio.get_running_loop()
        if other_work is not None:
            self._other_work = other_work
        for number in DRAIN_SIGNALS:
            self._previous[number] = signal.signal(number, self._on_signal)

    def stop_watching(self) -> None:
        """Put the handlers `watch_signals` replaced back."""
        for number, handler in self._previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()
        self._loop = None
        if self._handover is not None and not self._handover.done():
            self._handover.cancel()  # a shutdown without the signal's (an embedding application's) came first

    def busy(self) -> int:
        """Work running now: requests that start work, in flight, and the other work `watch_signals` was told of."""
        return len(self.working) + self._other_work()

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        first, again = not self._signals, number in self._signals
        self._signals.add(number)
        self.drain()
        loop = self._loop
        if first and loop is not None and not loop.is_closed():
            # The listening socket stays open while the work in flight ends: new requests are answered 503 draining.
            loop.call_soon_threadsafe(self._hand_over_later, number)
        elif again or loop is None or loop.is_closed():
            self._pass_on(number, frame)

    def _hand_over_later(self, number: int) -> None:
        self._handover = asyncio.get_running_loop().create_task(self._hand_over(number))

    async def _hand_over(self, number: int) -> None:
        # Polled: the streamed turns (other_work) signal no event when they end.
        while self.busy() and self.remaining() > 0:  # noqa: ASYNC110
            await asyncio.sleep(_IDLE_POLL_SECONDS)
        if self.busy():
            logger.warning("Drain time is up with %d request(s) or turn(s) still running: stopping.", self.busy())
            # Cut at the drain time, as the server's own timeout would (its lease lapses, as after a crash); the
            # server's wait then covers reads only, and the lifespan stops the turns left.
            for task in list(self.working):
                task.cancel()
        if not self._handed_over:  # passed on twice, uvicorn's handler would skip the lifespan's shutdown
            self._pass_on(number, None)

    def _pass_on(self, number: int, frame: FrameType | None) -> None:
        self._handed_over = True
        previous = self._previous.get(number)
        if callable(previous):
            previous(number, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(number, signal.SIG_DFL)
            signal.raise_signal(number)


class DrainingMiddleware:
    """
    Refuse requests that start work with 503 ``draining`` once the worker drains, and with 503 ``not_ready`` before
    its store's exclusive creates are known to hold (no turn or approval could be made exactly once); reads answer.
    """

    def __init__(self, app: ASGIApp, *, readiness: Readiness) -> None:
        """
        :param app: The application.
        :param readiness: The worker's readiness.
        """
        self.app = app
        self.readiness = readiness

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request, or refuse it while draining or while the store is not known to coordinate."""
        readiness = self.readiness
        # "unchecked" is an app whose lifespan never ran (an embedding test or ASGI call): its work is not refused.
        # A served worker's lifespan checks before the first request, and says "unknown" while its store is down.
        unusable_store = readiness.exclusive_creates not in ("enforced", "unchecked")
        if scope["type"] == "http" and scope["method"] in _STARTS_WORK and (readiness.draining or unusable_store):
            if readiness.draining:
                body = {"error": "draining", "detail": "This worker is shutting down; send the request again."}
            else:
                why = readiness.not_ready_because()
                body = {"error": "not_ready", "detail": f"This worker is not ready ({why}); send the request again."}
            # Retry-After and Connection: close send the client (or the load balancer) to another replica.
            headers = {"Retry-After": "1", "Connection": "close"}
            await JSONResponse(body, status_code=503, headers=headers)(scope, receive, send)
            return
        if scope["type"] != "http" or scope["method"] not in _STARTS_WORK:
            await self.app(scope, receive, send)
            return
        task = asyncio.current_task()  # the server's task for this request: a drain waits for it before stopping
        if task is None:  # pragma: no cover - an ASGI server always runs a request in a task
            await self.app(scope, receive, send)
            return
        readiness.working.add(task)
        try:
            await self.app(scope, receive, send)
        finally:
            readiness.working.discard(task)
