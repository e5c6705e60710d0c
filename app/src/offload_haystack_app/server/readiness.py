"""
Whether a worker takes new work: not before its store's exclusive creates are known to hold, not once it drains.

A worker drains from the moment it gets SIGTERM (or SIGINT): `/api/health` answers 503 so a load balancer stops
sending it work, and `DrainingMiddleware` refuses new turns and decisions with 503 ``draining`` (a load balancer may
send them to another replica) while requests already running finish, within the drain time. Before its store's
exclusive creates are known to hold (a store not up yet), it refuses them the same way, with 503 ``not_ready``.
"""

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


class Readiness:
    """One worker's readiness: the start-up check's verdict and, once a stop signal came, when draining began."""

    def __init__(self, drain_seconds: float) -> None:
        """
        :param drain_seconds: How long running requests and turns may go on once draining began.
        """
        self.drain_seconds = drain_seconds
        self.exclusive_creates: str = "unchecked"
        self.draining_since: float | None = None
        self._previous: dict[int, SignalHandler] = {}

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

    def watch_signals(self) -> None:
        """
        Start draining on SIGTERM or SIGINT, then pass the signal on to the handler the server installed (uvicorn's
        starts its graceful shutdown). Only in the main thread, where signals are delivered; elsewhere a no-op.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for number in DRAIN_SIGNALS:
            self._previous[number] = signal.signal(number, self._on_signal)

    def stop_watching(self) -> None:
        """Put the handlers `watch_signals` replaced back."""
        for number, handler in self._previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        self.drain()
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
        await self.app(scope, receive, send)
