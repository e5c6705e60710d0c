"""
Checks the server makes before it serves: does its object store refuse a second exclusive create?

Approvals, resume claims and turns are made exactly once with conditional creates (S3 ``If-None-Match: *``); on a
store that ignores or refuses them the server would serve requests it cannot keep its promises for, so it does not
start (`ServerStartupError`, one line). A transient failure of the check ("unknown") is retried a few times first.
"""

import asyncio
import time

from haystack_integrations.offload.errors import OffloadError
from haystack_integrations.offload.stores import FsspecToolResultStore
from haystack_integrations.offload.stores.exclusive_creates import ExclusiveCreateCheck

CHECK_ATTEMPTS = 3
CHECK_RETRY_DELAY = 1.0


class ServerStartupError(OffloadError, ValueError):
    """The server cannot start on this configuration; the message is one line that says why and what to change."""


def require_exclusive_creates(
    root: FsspecToolResultStore, *, attempts: int = CHECK_ATTEMPTS, delay: float = CHECK_RETRY_DELAY
) -> ExclusiveCreateCheck:
    """
    Check, before serving, that the store refuses a second exclusive create; retry an "unknown" verdict.

    A definite verdict is kept per process and backend (`FsspecToolResultStore.check_exclusive_creates`), so a second
    call, or the first coordinated create later, sends nothing.

    :param root: The server's root store.
    :param attempts: How many times an "unknown" verdict (a transient failure) is checked in all.
    :param delay: Seconds between those checks.
    :returns: The check, when it is ``"enforced"``.
    :raises ServerStartupError: If the store ignores or refuses exclusive creates, or the check stayed "unknown".
    :raises StoragePermissionError: If the probe may not be written.
    """
    for attempt in range(1, max(attempts, 1) + 1):
        check = root.check_exclusive_creates()
        if check.verdict != "unknown" or attempt >= attempts:
            break
        time.sleep(delay)
    return _required(check)


async def require_exclusive_creates_async(
    root: FsspecToolResultStore, *, attempts: int = CHECK_ATTEMPTS, delay: float = CHECK_RETRY_DELAY
) -> ExclusiveCreateCheck:
    """Async `require_exclusive_creates`."""
    for attempt in range(1, max(attempts, 1) + 1):
        check = await root.check_exclusive_creates_async()
        if check.verdict != "unknown" or attempt >= attempts:
            break
        await asyncio.sleep(delay)
    return _required(check)


def _required(check: ExclusiveCreateCheck) -> ExclusiveCreateCheck:
    if check.verdict == "unknown":
        raise ServerStartupError(
            _one_line(
                f"Exclusive creates on {check.store}: unknown, retry ({check.detail}); the server does not start "
                "until the store answers."
            )
        )
    if check.verdict != "enforced":
        raise ServerStartupError(
            _one_line(
                f"{check.store} {check.detail}: the server needs an object store that refuses a second exclusive "
                "create (S3 conditional writes, If-None-Match: *) for its turns and approvals, so it does not start."
            )
        )
    return check


def _one_line(message: str) -> str:
    # `serve` prints the message as it is: a backend's error text inside it must not break it over lines.
    return " ".join(message.split())
