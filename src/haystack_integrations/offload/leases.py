"""
Keeping a lease alive while work runs: the one loop both the resume claim and the server's turn use.

A lease lets other workers take over from a worker that died, once it lapses. A worker that is alive but busy (a long
tool call, a slow model) must not look dead, so it renews its lease every third of its length for as long as it works.
A renewal that fails is logged and tried again at the next tick: it shortens the lease, it does not end the work.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

logger = logging.getLogger(__name__)


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

    async def loop() -> None:
        while True:
            await asyncio.sleep(lease / 3)
            try:
                await renew()
            except Exception as error:  # a missed renewal shortens the lease; the next one may land
                logger.warning("Could not renew %s: %s", what, error)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
