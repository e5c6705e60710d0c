"""
A turn answered as server-sent events: the reply of the message POST, and of a decision that resumes a held step
(``POST .../approvals/{request_id}``), when its client sends ``Accept: text/event-stream`` (`routes.answer_turn`).

The turn runs in its own task, so a client that goes away ends only its stream.
"""

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

from haystack_integrations.offload.sessions import TurnProgress
from offload_haystack_app.server.errors import error_status

logger = logging.getLogger(__name__)

EVENT_STREAM = "text/event-stream"
EVENT_STREAM_HEADERS = {
    "Cache-Control": "no-store",
    "X-Accel-Buffering": "no",  # nginx and its kin: pass each event on at once, do not buffer the response
    "X-Content-Type-Options": "nosniff",
}
DEFAULT_SHUTDOWN_GRACE = 30.0

T = TypeVar("T")


def wants_event_stream(accept: str | None) -> bool:
    """
    Whether a request's ``Accept`` header asks for server-sent events.

    :param accept: The header, if any.
    :returns: True when ``text/event-stream`` is one of the types it lists (with a non-zero quality).
    """
    for item in (accept or "").split(","):
        media_type, *parameters = (part.strip().lower() for part in item.split(";"))
        if media_type == EVENT_STREAM and "q=0" not in parameters:
            return True
    return False


def sse(kind: str, data: Any) -> str:
    """
    One server-sent event: its name and its data as one line of JSON.

    :param kind: The ``event:`` name.
    :param data: JSON-ready data.
    :returns: The event's text, blank line included.
    """
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def turn_events(
    turn: "asyncio.Task[T]", progress: TurnProgress, answer: Callable[[T], dict[str, Any]]
) -> AsyncIterator[str]:
    """
    The stream of one turn: its progress as it happens, then its answer (``done``) or its failure (``error``).

    :param turn: The task running the turn (already started).
    :param progress: The turn's publisher.
    :param answer: Builds the JSON answer from the turn's outcome (the same as without a stream).
    :yields: Server-sent events and keep-alive comments.
    """
    async for event in progress.follow(turn):
        yield ": keep-alive\n\n" if event is None else sse(event.kind, event.data)
    if progress.dropped:
        yield sse("dropped", {"count": progress.dropped})
    if turn.cancelled():
        yield sse("error", {"status": 503, "error": "shutting_down", "detail": "The server stopped during the turn."})
        return
    error = turn.exception()
    if error is None:
        yield sse("done", answer(turn.result()))
        return
    status, code, detail = error_status(error)
    if status >= 500 and code == "internal_error":
        logger.error("A streamed turn failed.", exc_info=error)
    yield sse("error", {"status": status, "error": code, "detail": detail})


class RunningTurns:
    """
    The turns this worker runs for streaming clients, each in a task of its own, so a client that leaves does not end
    its turn; the worker waits for them (a while) when it stops.

    Only tasks live here, never a session's state: a turn's outcome is in the store like any other.
    """

    def __init__(self) -> None:
        """Start with no turn running."""
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self, work: Coroutine[Any, Any, T]) -> "asyncio.Task[T]":
        """
        Run `work` in a task of its own, kept until it ends.

        :param work: The turn.
        :returns: Its task.
        """
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: "asyncio.Task[Any]") -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # the service logged the failure; a client that left cannot be told, so do not warn again

    async def drain(self, grace: float = DEFAULT_SHUTDOWN_GRACE) -> None:
        """
        Wait up to `grace` seconds for running turns, then cancel the rest (their leases expire, and a later request
        declares them abandoned, as after a crash).

        :param grace: Seconds to wait.
        """
        if not self._tasks:
            return
        _, late = await asyncio.wait(set(self._tasks), timeout=grace)
        for task in late:
            task.cancel()
        if late:
            logger.warning(
                "%d streamed turn(s) did not end within %.0f s of shutdown and were stopped.", len(late), grace
            )
            await asyncio.wait(late)


async def until_started(turn: "asyncio.Task[Any]", progress: TurnProgress) -> None:
    """
    Wait until the turn is claimed (then its failures go into the stream) or has ended before that.

    :param turn: The task running the turn.
    :param progress: Its publisher.
    :raises Exception: What the turn raised before it was claimed (a busy session, a pending approval, an invalid
        message), so the request answers it with its usual status.
    """
    started = asyncio.ensure_future(progress.started.wait())
    try:
        await asyncio.wait({started, turn}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        started.cancel()
    if not progress.started.is_set() and turn.done():
        turn.result()  # raises what the turn raised
