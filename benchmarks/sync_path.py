"""
What the sync API costs now that it is the async one, waited for (`stores.sync_api`): a sync call against the same
call awaited on a running loop, in one run.

Per backend, N rounds of one 10,000-character write and one 1,000-byte ranged read of it, through ``write`` and
``read_range`` (sync, from a plain thread: what Haystack's sync hooks and tools do), then through ``write_async`` and
``read_range_async`` awaited one after another on one event loop. Reported: wall and CPU time per round, and the sync
path as a multiple of the async one. On local disk and memory the sync path runs the coroutine on the calling thread's
own loop; on S3 (moto in its own process) on fsspec's I/O loop with the shared client.

Run from the repository root::

    PYTHONPATH=src python benchmarks/sync_path.py
    PYTHONPATH=src python benchmarks/sync_path.py --rounds 500 --backends memory local
"""

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable

from haystack_integrations.offload import FsspecToolResultStore

BACKENDS = ("memory", "local", "s3")
CONTENT = "x" * 10_000


def _timed(rounds: int, run: Callable[[], None]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return (time.perf_counter() - wall) / rounds * 1e6, (time.process_time() - cpu) / rounds * 1e6


def measure(store: FsspecToolResultStore, rounds: int) -> dict[str, tuple[float, float]]:
    """Per-round wall and CPU microseconds, sync and async, on one session store."""
    session = store.for_session("bench", "sync-path")

    def sync_rounds() -> None:
        for _ in range(rounds):
            session.read_range(session.write(key="k.txt", content=CONTENT), 0, 1000)

    async def async_rounds() -> None:
        for _ in range(rounds):
            await session.read_range_async(await session.write_async(key="k.txt", content=CONTENT), 0, 1000)

    loop = asyncio.new_event_loop()
    try:
        # Warm both paths (clients, loops, page cache) before measuring.
        session.read_range(session.write(key="warm.txt", content=CONTENT), 0, 10)
        loop.run_until_complete(session.write_async(key="warm.txt", content=CONTENT))
        return {
            "sync": _timed(rounds, sync_rounds),
            "async": _timed(rounds, lambda: loop.run_until_complete(async_rounds())),
        }
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())  # closes the loop's S3 client (stores/loop_local.py)
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=300, help="write+read rounds per path (default: %(default)s)")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    args = parser.parse_args()

    print(f"Load average before: {os.getloadavg()[0]:.2f}")
    print("| backend | sync wall / CPU per round | async wall / CPU per round | sync / async (CPU) |")
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as directory:
        for backend in args.backends:
            if backend == "s3":
                from haystack_integrations.offload.testing.local_s3 import local_s3_process

                with local_s3_process() as s3:
                    store = FsspecToolResultStore(f"{s3.bucket_url}/sync-path", storage_options=s3.storage_options)
                    found = measure(store, max(args.rounds // 10, 10))
            else:
                url = "memory://sync-path" if backend == "memory" else os.path.join(directory, "results")
                found = measure(FsspecToolResultStore(url), args.rounds)
            (sync_wall, sync_cpu), (async_wall, async_cpu) = found["sync"], found["async"]
            print(
                f"| {backend} | {sync_wall:,.0f} / {sync_cpu:,.0f} µs | {async_wall:,.0f} / {async_cpu:,.0f} µs "
                f"| {sync_cpu / async_cpu:.2f}x |"
            )
    print(f"Load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
