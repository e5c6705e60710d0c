"""
Writes a store has started but not finished (`FsspecToolResultStore.begin_write_async`).

A write-behind caller learns a result's reference before its bytes are stored, so it can hand the reference on (to the
model, in a pointer) while the PUT is still in flight. The store keeps every such write in an `InFlightWrites` table
shared by all the stores built from one root, so reading, describing, listing or deleting a result that is still being
written waits for that write first: a reference is never "not found" just because it was used early.
"""

import asyncio
import logging
from collections.abc import Iterable

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
    """The writes in flight on one filesystem handle, by full object path."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def track(self, path: str, task: "asyncio.Task[None]") -> None:
        """
        Remember `task` as the write of `path` until it finishes.

        :param path: The object's full path.
        :param task: The task writing it.
        """
        self._tasks[path] = task
        task.add_done_callback(lambda finished: self._finish(path, finished))

    def _finish(self, path: str, task: "asyncio.Task[None]") -> None:
        if self._tasks.get(path) is task:
            del self._tasks[path]
        if not task.cancelled() and task.exception() is not None:
            # Retrieved here so asyncio does not report it as unhandled; whoever started the write decides what a
            # failure means (OffloadHook puts the result back into the conversation).
            logger.debug("A write-behind store write failed: %s", task.exception())

    async def wait_for(self, path: str) -> None:
        """
        Wait for the in-flight write of `path`, if there is one on the running loop; never raises its error.

        :param path: The object's full path.
        """
        task = self._tasks.get(path)
        if task is not None and task.get_loop() is asyncio.get_running_loop():
            await asyncio.wait({task})

    async def wait_under(self, prefix: str) -> None:
        """
        Wait for every in-flight write below `prefix` on the running loop; never raises their errors.

        :param prefix: A scope's path, ending with a separator.
        """
        loop = asyncio.get_running_loop()
        tasks = {
            task for path, task in list(self._tasks.items()) if path.startswith(prefix) and task.get_loop() is loop
        }
        if tasks:
            await asyncio.wait(tasks)

    def __len__(self) -> int:
        return len(self._tasks)
