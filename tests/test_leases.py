"""The lease renewal loop ends when its block ends, even when a cancellation is swallowed mid-renewal."""

import asyncio

from haystack_integrations.offload.leases import renewing


async def test_renewals_run_while_the_block_runs_and_stop_after() -> None:
    renewed: list[int] = []

    async def renew() -> None:
        renewed.append(1)

    async with renewing(0.06, renew, what="test"):
        await asyncio.sleep(0.2)
    count = len(renewed)
    assert count >= 3
    await asyncio.sleep(0.1)
    assert len(renewed) == count  # nothing renews after the block


async def test_a_cancellation_swallowed_by_wait_for_does_not_keep_renewing() -> None:
    # On Python 3.11, wait_for swallows a cancellation that lands just as its inner call finishes (the retry layer
    # wraps every storage call in wait_for): the loop must still end, and the block must not hang.
    answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    in_flight = asyncio.Event()
    calls = [0]

    async def renew() -> None:
        calls[0] += 1
        in_flight.set()
        await asyncio.wait_for(answer if calls[0] == 1 else asyncio.sleep(0), 60)

    async def turn() -> None:
        async with renewing(0.03, renew, what="turn"):
            await in_flight.wait()
            answer.set_result(None)

    running = asyncio.create_task(turn())
    done, _ = await asyncio.wait({running}, timeout=2)
    settled = calls[0]
    await asyncio.sleep(0.2)
    running.cancel()  # only matters when the test fails: do not leave it behind
    assert done, f"the block never ended ({settled} renewals)"
    assert calls[0] == settled  # the loop ended: no renewal after the block
