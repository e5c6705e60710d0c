"""
Writes a store has started but not finished (`FsspecToolResultStore.begin_write_async`).

A write-behind caller learns a result's reference before its bytes are stored, so it can hand the reference on (to the
model, in a pointer) while the PUT is still in flight. The store keeps every such write in an `InFlightWrites` table
shared by all the stores built from one root, so reading, describing, listing, deleting or purging a result that is
still being written waits for that write first, from any thread or event loop: a reference is never "not found" just
because it was used early, and a purge never misses a result that lands after it.
"""

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Iterable
from typing import NamedTuple

from haystack_integrations.offload.stores.sync_api import WAITING_THREAD

logger = logging.getLogger(__name__)


class PendingWrite:
    """
    A write started by `begin_write_async`: its reference now, its outcome later.

    The write runs as a task on the loop that started it; cancelling something that waits on it (`wait`) does not
    cancel the write.
    """

    def __init__(self, reference: str, task: "asyncio.Task[None]") -> None:
        """
        :param reference: The reference the result will be readable under once the write succeeds.
        :param task: The task doing the write.
        """
        self.reference = reference
        self._task = task

    def done(self) -> bool:
        """
        Whether the write has finished.

        :returns: True once the write has succeeded or failed.
        """
        return self._task.done()

    def error(self) -> BaseException | None:
        """
        The write's failure, once it has finished.

        :returns: The exception the write raised (a `StorageError`, say), or `None` if it succeeded.
        :raises asyncio.InvalidStateError: If the write has not finished yet.
        """
        if self._task.cancelled():
            return asyncio.CancelledError("the write was cancelled")
        return self._task.exception()

    async def wait(self) -> str:
        """
        Wait for the write to finish.

        :returns: The reference, once the result is stored.
        :raises Exception: Whatever the write raised (`StorageError`, `StoragePermissionError`, ...).
        """
        await asyncio.shield(self._task)
        return self.reference

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self.error() is not None else "stored")
        return f"PendingWrite({self.reference!r}, {state})"


async def settle(writes: Iterable[PendingWrite]) -> None:
    """
    Wait until every one of `writes` has finished, failed or not, without raising their errors.

    :param writes: The writes to wait for.
    """
    tasks = {write._task for write in writes if not write.done()}
    if tasks:
        await asyncio.wait(tasks)


class InFlightWrites:
    """
    The writes in flight on one filesystem handle, by full object path; usable from any thread and any event loop.

    An upload runs as a task on the loop that started it, but whoever waits for it may be elsewhere: a sync web endpoint
    in a thread pool ending the session, or a worker thread with a loop of its own reading the result. So each write is
    tracked twice: by its task, awaited on its own loop, and by a `concurrent.futures.Future` that the task's done
    callback finishes, which any other loop can await (`asyncio.wrap_future`) and any other thread can block on.
    Waiting never raises the writes' errors: the caller then acts on what is stored.
    """

    def __init__(self) -> None:
        # Written on the uploads' loops, read by any thread that waits.
        self._lock = threading.Lock()
        self._writes: dict[str, _Write] = {}

    def track(self, path: str, task: "asyncio.Task[None]") -> None:
        """
        Remember `task` as the write of `path` until it finishes. Call it on the loop that runs `task`.

        :param path: The object's full path.
        :param task: The task writing it.
        """
        finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        # A running future cannot be cancelled, so a cancelled waiter (wrap_future cancels its source) cannot mark
        # the write finished for every other waiter.
        finished.set_running_or_notify_cancel()
        write = _Write(task, finished, threading.get_ident())
        with self._lock:
            self._writes[path] = write
        task.add_done_callback(lambda _: self._finish(path, write))

    def _finish(self, path: str, write: "_Write") -> None:
        with self._lock:
            if self._writes.get(path) is write:
                del self._writes[path]
        write.finished.set_result(None)
        task = write.task
        if not task.cancelled() and task.exception() is not None:
            # Retrieved here so asyncio does not report it as unhandled; whoever started the write decides what a
            # failure means (OffloadHook puts the result back into the conversation).
            logger.debug("A write-behind store write failed: %s", task.exception())

    def _matching(self, path: str, *, under: bool) -> list["_Write"]:
        with self._lock:
            if under:
                writes = [write for key, write in self._writes.items() if key.startswith(path)]
            else:
                writes = [self._writes[path]] if path in self._writes else []
        # A finished task's done callback may not have run yet (it needs its loop), and a loop closed with the upload
        # pending will never finish it: waiting on either could hang for good.
        return [write for write in writes if not write.task.done() and not write.task.get_loop().is_closed()]

    async def wait_for(self, path: str) -> None:
        """
        Wait for the in-flight write of `path`, if there is one, whichever thread or loop runs it.

        :param path: The object's full path.
        :raises RuntimeError: If a sync caller blocks the thread whose event loop runs the write (see `wait_under`).
        """
        if self._writes:  # most stores never write behind: no lock, no scan
            await _wait_async(self._matching(path, under=False))

    async def wait_under(self, prefix: str) -> None:
        """
        Wait for every in-flight write below `prefix`, whichever threads or loops run them.

        :param prefix: A scope's path, ending with a separator.
        :raises RuntimeError: If the operation runs for a sync caller (`stores.sync_api`) whose thread's event loop is
            still running one of the writes: waiting would stop the loop that has to finish it (a deadlock). Not
            waiting is no better: a purge would report results deleted that land afterwards, a read would find nothing.
            Call the async twin instead, or wait for the write first.
        """
        await _wait_async(self._matching(prefix, under=True))

    def __len__(self) -> int:
        with self._lock:
            return len(self._writes)


class _Write(NamedTuple):
    task: "asyncio.Task[None]"
    finished: "concurrent.futures.Future[None]"
    thread: int  # the thread of the loop running `task`


async def _wait_async(writes: list[_Write]) -> None:
    waiting = WAITING_THREAD.get()
    if any(write.thread == waiting for write in writes):
        raise RuntimeError(
            "A sync store method was called on the thread whose event loop is still uploading a result it "
            "needs (a write-behind write). Blocking would stop that upload for good; call the method's async "
            "twin (e.g. read_async, purge_async) or await the PendingWrite first."
        )
    loop = asyncio.get_running_loop()
    # On its own loop a task is awaited as it is; from another loop, its future is (without blocking this loop).
    waits = [write.task if write.task.get_loop() is loop else asyncio.wrap_future(write.finished) for write in writes]
    if waits:
        await asyncio.wait(waits)
