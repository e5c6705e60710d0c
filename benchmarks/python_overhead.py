"""
The store's own Python per write + page: the part of its client CPU beyond raw obstore's that is the library's.

`FsspecToolResultStore` writes a 50 KB result and reads a 10,000-byte page of it with its size, over and over, with
its engine swapped for one that answers at once: no network, no obstore threads, only the library's code (naming,
reference checks, error translation, metrics, retries, leases). CPU time of this process, median over rounds.

Run from the repository root (a few seconds)::

    PYTHONPATH=src python benchmarks/python_overhead.py
    PYTHONPATH=/path/to/old/src python benchmarks/python_overhead.py   # the same against an older tree
"""

import argparse
import asyncio
import os
import statistics
import time

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores.io import Engine

RESULT = os.urandom(50_000)
PAGE = (20_000, 30_000)


class AnswersAtOnce(Engine):
    """An engine that sends nothing: a write is stored nowhere, a page is made up."""

    remote = True

    async def put_async(self, path: str, data: bytes) -> None:
        return None

    async def get_range_and_size_async(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        return RESULT[start:end], len(RESULT)


async def store_python(pairs: int) -> float:
    """CPU microseconds of the library's own code per write + page."""
    root = FsspecToolResultStore(
        "s3://bucket/overhead", storage_options={"endpoint_url": "http://127.0.0.1:9", "key": "k", "secret": "s"}
    )
    root._handle._io = AnswersAtOnce(None)  # the store's handle uses this engine for every request
    store = root.for_session("bench", "session")
    started = time.process_time()
    for _ in range(pairs):
        reference = await store.write_async(key="1_fetch_call.bin", content=RESULT)
        await store.read_range_and_size_async(reference, *PAGE)
    return (time.process_time() - started) / pairs * 1e6


async def benchmark(args: argparse.Namespace) -> str:
    await store_python(args.pairs)  # warm-up
    samples = [await store_python(args.pairs) for _ in range(args.rounds)]
    return (
        f"The store's own Python per write + page (an engine that answers at once), median of {args.rounds} rounds of "
        f"{args.pairs}: {statistics.median(samples):.1f} µs of CPU."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--pairs", type=int, default=3000, help="write + page pairs per round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (default: %(default)s)")
    print(asyncio.run(benchmark(parser.parse_args())))


if __name__ == "__main__":
    main()
