"""
Keeping a lease alive while work runs: the one loop both the resume claim and the server's turn use.

The loop renews the lease every third of its length while the work runs, and stops on a flag as well as on cancelling.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

logger = logging.getLogger(__name__)

# How long leaving the block waits for a renewal in flight; past that the loop ends on its own after that renewal.
_STOP_WAIT = 1.0


@contextlib.asynccontextmanager
async def renewing(lease: float, renew: Callable[[], Awaitable[None]], *, what: str) -> AsyncIterator[None]:
    """
    Call `renew` every third of `lease` seconds while the block runs.

    ```python
    async with renewing(120.0, lambda: ledger.renew_step_async(claim), what="the claim on step 3"):
        await run_the_calls()
    ```

    :param lease: The lease's length in seconds.
    :param renew: Extends the lease (a write of the holder's own record).
    :param what: What is renewed, for the log.
    """
    stopped = asyncio.Event()

    async def loop() -> None:
        while not stopped.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopped.wait(), lease / 3)
            if stopped.is_set():
                return
            try:
                await renew()
            except Exception as error:  # a missed renewal shortens the lease; the next one may land
                logger.warning("Could not renew %s: %s", what, error)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        stopped.set()
        task.cancel()
        # Bounded: a renewal stuck in flight must not hold up the work's end; the flag ends the loop after it.
        await asyncio.wait({task}, timeout=_STOP_WAIT)
