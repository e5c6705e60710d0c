"""
Checks the server makes before it serves: does its object store refuse a second exclusive create?

Approvals, resume claims and turns are made exactly once with conditional creates (S3 ``If-None-Match: *``); on a
store that ignores or refuses them the server would serve requests it cannot keep its promises for, so it does not
start (`ServerStartupError`, one line). A transient failure of the check ("unknown") is retried a few times first by
`offload-haystack serve`; a worker whose store is not up yet (a container started before S3) instead serves 503
``not_ready`` and checks again with backoff, one log line per check, until the store answers
(`check_until_known`).
"""

import asyncio
import contextvars
import logging
import time

from haystack_integrations.offload import OffloadError
from haystack_integrations.offload.stores import ExclusiveCreateCheck, FsspecToolResultStore, redacted_url
from offload_haystack_app.server.readiness import Readiness

CHECK_ATTEMPTS = 3
CHECK_RETRY_DELAY = 1.0
# A worker waiting for its store checks again after 1, 2, 4, ... seconds, at most this far apart.
CHECK_MAX_DELAY = 30.0

logger = logging.getLogger("offload_haystack_app.server")

# While a worker waits for its store, each check's own give-up warnings (the probe's create and its clean-up) would
# add two lines per check to the one `check_until_known` writes, which already says what failed: they are dropped, in
# the context of a waiting check only (`check_once`), so a request's storage failures are still logged.
_WAITING: contextvars.ContextVar[bool] = contextvars.ContextVar("offload_waiting_for_store", default=False)


def _not_while_waiting(record: logging.LogRecord) -> bool:
    return not _WAITING.get()


logging.getLogger("haystack_integrations.offload.stores.retry").addFilter(_not_while_waiting)


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


def refuse_a_store_that_cannot_coordinate(root: FsspecToolResultStore) -> ExclusiveCreateCheck:
    """
    One check before a worker is built: a definite refusal stops it, a store that does not answer yet does not.

    :param root: The server's root store.
    :returns: The check, ``"enforced"`` or ``"unknown"`` (the worker then starts not ready and checks again,
        `check_until_known`).
    :raises ServerStartupError: If the store ignores or refuses exclusive creates.
    :raises StoragePermissionError: If the probe may not be written.
    """
    check = root.check_exclusive_creates()
    return check if check.verdict == "unknown" else _required(check)


async def check_once(root: FsspecToolResultStore) -> ExclusiveCreateCheck:
    """
    One check of the store's exclusive creates, for a worker that waits for its store: a check that raised counts as
    ``"unknown"``, as a store coming up fails in any way (no bucket yet, a 403 before its users exist).

    :param root: The server's root store.
    :returns: The check.
    """
    waiting = _WAITING.set(True)
    try:
        return await root.check_exclusive_creates_async()
    except Exception as error:
        failure = _one_line(f"{type(error).__name__}: {error}")
        return ExclusiveCreateCheck(
            "unknown", f"The object store {redacted_url(root.url)!r}", f"the check failed: {failure}"
        )
    finally:
        _WAITING.reset(waiting)


async def check_until_known(
    root: FsspecToolResultStore,
    readiness: Readiness,
    *,
    first: ExclusiveCreateCheck | None = None,
    first_delay: float = CHECK_RETRY_DELAY,
    max_delay: float = CHECK_MAX_DELAY,
) -> ExclusiveCreateCheck:
    """
    Check the store's exclusive creates until the answer is definite, backing off between checks; keep the verdict in
    `readiness`, so the worker serves once it is ``"enforced"`` (503 ``not_ready`` until then).

    One log line per check that could not tell (WARNING: uvicorn run directly shows no INFO of ours), one when the
    store answered after such a check, and an ERROR if it answered that it cannot coordinate: the worker then stays
    not ready, and its health says why.

    :param root: The server's root store.
    :param readiness: The worker's readiness, whose ``exclusive_creates`` this sets.
    :param first: The first check, when the caller made it (it counts as check 1).
    :param first_delay: Seconds before the second check; each wait doubles it.
    :param max_delay: The longest wait between two checks.
    :returns: The definite check. A check that raised (a bucket not created yet, a probe refused) counts as
        "unknown": it is logged and asked again.
    """
    delay = first_delay
    attempt = 0
    while True:
        attempt += 1
        check = first if first is not None and attempt == 1 else await check_once(root)
        readiness.exclusive_creates = check.verdict
        if check.verdict != "unknown":
            break
        logger.warning(
            "Store check %d: %s",
            attempt,
            _one_line(
                f"exclusive creates on {check.store}: unknown ({check.detail}); not ready, next check in {delay:g} s."
            ),
        )
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay)
    if check.verdict != "enforced":
        try:
            _required(check)
        except ServerStartupError as refused:
            logger.error("Store check %d: %s The worker stays not ready.", attempt, refused)
    elif attempt > 1:
        logger.warning("Store check %d: exclusive creates enforced; the worker is ready.", attempt)
    return check


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
