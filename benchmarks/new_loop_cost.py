"""
What the first write on a new event loop costs, against a steady-state write on that loop, in one run.

The s3fs engine gives each event loop its own ``asynchronous=True`` s3fs client (`s3_io_with_loop_clients`), because an
aiohttp connector belongs to one loop. Building that client is botocore's slow path: a session, the S3 service model
loaded and parsed, endpoint rules, credentials resolved. A server that runs each request's agent on a fresh loop
(``asyncio.run`` per request in a worker thread, tests, scripts) pays it on every first write. The loop twins share
one aiobotocore session (its model caches and its resolved credentials); only the client and its connector are per
loop.

For each of `--loops` fresh loops (``asyncio.run``, one after another, on the main thread), this times:

- first write: the first `write_async` on that loop (it makes the loop's client);
- steady write: the median of the next `--steady` writes on the same loop;

and reports medians over loops, wall milliseconds and CPU milliseconds (`time.process_time`), with the ratio
first / steady. The obstore engine (no per-loop client) is measured alike for reference. moto's S3 server runs in a
process of its own (`local_s3_process`), so its CPU is not counted.

Run from the repository root::

    PYTHONPATH=src python benchmarks/new_loop_cost.py
    PYTHONPATH=src python benchmarks/new_loop_cost.py --loops 20 --steady 20
"""

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.testing.local_s3 import local_s3_process

PAYLOAD = b"x" * 10_000


async def one_loop(store: FsspecToolResultStore, steady: int) -> tuple[float, float, float, float]:
    """First write's wall and CPU seconds on this loop, and the steady writes' medians."""
    session = store.for_session("bench", f"loop-{uuid.uuid4().hex[:8]}")
    wall, cpu = time.perf_counter(), time.process_time()
    await session.write_async(key="first.bin", content=PAYLOAD)
    first_wall, first_cpu = time.perf_counter() - wall, time.process_time() - cpu
    walls, cpus = [], []
    for i in range(steady):
        wall, cpu = time.perf_counter(), time.process_time()
        await session.write_async(key=f"{i}.bin", content=PAYLOAD)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return first_wall, first_cpu, statistics.median(walls), statistics.median(cpus)


def measure(url: str, options: dict[str, Any], engine: str, loops: int, steady: int) -> dict[str, float]:
    store = FsspecToolResultStore(url, storage_options=options, engine=engine)
    store.warm_up()  # the sync client: not what is measured
    asyncio.run(one_loop(store, 1))  # the first loop of the process also pays imports and first-time caches
    samples = [asyncio.run(one_loop(store, steady)) for _ in range(loops)]
    columns = zip(*samples, strict=True)
    first_wall, first_cpu, steady_wall, steady_cpu = (statistics.median(column) for column in columns)
    return {
        "first_wall_ms": 1000 * first_wall,
        "first_cpu_ms": 1000 * first_cpu,
        "steady_wall_ms": 1000 * steady_wall,
        "steady_cpu_ms": 1000 * steady_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--loops", type=int, default=10, help="fresh loops measured (default: %(default)s)")
    parser.add_argument("--steady", type=int, default=10, help="steady writes per loop (default: %(default)s)")
    parser.add_argument("--engines", nargs="+", default=["fsspec", "obstore"], help="engines to measure")
    args = parser.parse_args()
    run = uuid.uuid4().hex[:8]
    with local_s3_process() as s3:
        rows = {
            engine: measure(
                f"{s3.bucket_url}/new-loop-{engine}-{run}", s3.storage_options, engine, args.loops, args.steady
            )
            for engine in args.engines
        }
    print(
        f"{args.loops} fresh loops, {len(PAYLOAD):,}-byte writes; medians over loops; steady = median of "
        f"{args.steady} writes on the same loop.\n"
    )
    print("| engine | first write on a new loop | steady write | first / steady (wall) | CPU: first / steady |")
    print("|---|---:|---:|---:|---:|")
    for engine, row in rows.items():
        print(
            f"| {engine} | {row['first_wall_ms']:.1f} ms ({row['first_cpu_ms']:.1f} ms CPU) "
            f"| {row['steady_wall_ms']:.1f} ms ({row['steady_cpu_ms']:.1f} ms CPU) "
            f"| {row['first_wall_ms'] / row['steady_wall_ms']:.1f}x "
            f"| {row['first_cpu_ms'] / row['steady_cpu_ms']:.1f}x |"
        )


if __name__ == "__main__":
    main()
