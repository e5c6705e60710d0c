"""
Client CPU per S3 request: the store on its s3fs engine and on its obstore engine, against raw s3fs, in one run.

On a multi-user server the S3 client is the CPU hot spot: every offloaded result is a PUT and every page a ranged GET,
and with s3fs each one goes through botocore's request building, signing and event hooks and aiohttp, all in Python.
This measures what the *client* spends, in CPU seconds of its own process (`time.process_time`: every thread, so
obstore's Rust threads count too), per operation, with 32 operations in flight at once:

- write: a 50 KB result (`write_async`; raw: one PUT);
- page: 10,000 bytes of a written result with its total size (`read_range_and_size_async`; raw s3fs: one ranged GET
  with ``_cat_file``, which does not learn the size; raw obstore: one ranged GET, which does);
- create: a conditional create of a small document (`SessionDocuments.create_async`; raw: one PUT with
  ``If-None-Match: *``).

Contenders, each warmed up first, then measured in interleaved rounds (the order shuffled each round) so that load
from other processes on a shared machine falls on all of them alike:

- raw s3fs: an ``asynchronous=True`` `s3fs.S3FileSystem` on the benchmark's loop, with the pool size and single
  attempt the store configures (the baseline: 1.00);
- the store, ``engine="fsspec"`` (s3fs): the default, with its default `RetryPolicy`;
- the store, ``engine="obstore"``;
- raw obstore: `obstore.store.S3Store` with the settings the store gives it (the floor).

moto's S3 server runs in a process of its own (`local_s3_process`), so its CPU is not counted. Its speed limits the
wall time only.

Run from the repository root (about half a minute)::

    PYTHONPATH=src python benchmarks/client_cpu.py
    PYTHONPATH=src python benchmarks/client_cpu.py --rounds 20 --concurrency 64

Prints the Markdown table kept in benchmarks/README.md.
"""

import argparse
import asyncio
import os
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import obstore
import s3fs
from obstore.store import S3Store

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores.fsspec_store import DEFAULT_RETRY, DEFAULT_S3_MAX_POOL_CONNECTIONS
from haystack_integrations.offload.stores.obstore_io import obstore_settings
from haystack_integrations.offload.stores.retry import s3_client_options
from haystack_integrations.offload.testing.local_s3 import local_s3_process

OPERATIONS = ("write", "page", "create")
RESULT_BYTES = 50_000
PAGE = (20_000, 30_000)


class Contender:
    """One way of doing the three operations; `slot` numbers the concurrent caller (its session, for stores)."""

    name = ""

    async def open(self) -> None:
        """Make clients; nothing measured."""

    async def close(self) -> None:
        """Release clients."""

    async def write(self, slot: int, data: bytes) -> Any:
        raise NotImplementedError

    async def page(self, slot: int, written: Any) -> bytes:
        raise NotImplementedError

    async def create(self, slot: int, name: str, data: bytes) -> None:
        raise NotImplementedError


class RawS3fs(Contender):
    name = "raw s3fs (baseline)"

    def __init__(self, options: dict[str, Any], prefix: str) -> None:
        self.options = s3_client_options(
            {**options, "config_kwargs": {"max_pool_connections": DEFAULT_S3_MAX_POOL_CONNECTIONS}}
        )
        self.prefix = prefix

    async def open(self) -> None:
        self.fs = s3fs.S3FileSystem(asynchronous=True, skip_instance_cache=True, **self.options)
        self.fs.retries = 1
        self.client = await self.fs.set_session()

    async def close(self) -> None:
        await self.client.close()

    async def write(self, slot: int, data: bytes) -> Any:
        path = f"{self.prefix}/{slot}/{uuid.uuid4().hex}"
        await self.fs._pipe_file(path, data)
        return path

    async def page(self, slot: int, written: Any) -> bytes:
        return bytes(await self.fs._cat_file(written, start=PAGE[0], end=PAGE[1]))

    async def create(self, slot: int, name: str, data: bytes) -> None:
        await self.fs._pipe_file(f"{self.prefix}/{slot}/.claims/{name}", data, mode="create")


class RawObstore(Contender):
    name = "raw obstore (floor)"

    def __init__(self, options: dict[str, Any], bucket: str, prefix: str) -> None:
        settings = obstore_settings(options, retrying=True, attempt_timeout=DEFAULT_RETRY.attempt_timeout)
        self.store = S3Store(
            bucket,
            config=settings.config,  # type: ignore[arg-type]
            client_options=settings.client_options,  # type: ignore[arg-type]
            retry_config=settings.retry_config,  # type: ignore[arg-type]
        )
        self.prefix = prefix

    async def write(self, slot: int, data: bytes) -> Any:
        key = f"{self.prefix}/{slot}/{uuid.uuid4().hex}"
        await obstore.put_async(self.store, key, data, use_multipart=False)
        return key

    async def page(self, slot: int, written: Any) -> bytes:
        result = await obstore.get_async(self.store, written, options={"range": PAGE})
        return bytes(await result.bytes_async())

    async def create(self, slot: int, name: str, data: bytes) -> None:
        key = f"{self.prefix}/{slot}/.claims/{name}"
        await obstore.put_async(self.store, key, data, mode="create", use_multipart=False)


class Store(Contender):
    def __init__(self, url: str, options: dict[str, Any], engine: str, slots: int) -> None:
        self.name = f"store, engine={engine!r}"
        self.root = FsspecToolResultStore(url, storage_options=options, engine=engine)
        self.sessions = [self.root.for_session("bench", f"session-{slot}") for slot in range(slots)]

    async def open(self) -> None:
        await self.root.warm_up_async()

    async def write(self, slot: int, data: bytes) -> Any:
        return await self.sessions[slot].write_async(key="1_fetch_call.bin", content=data)

    async def page(self, slot: int, written: Any) -> bytes:
        data, size = await self.sessions[slot].read_range_and_size_async(written, *PAGE)
        if size != RESULT_BYTES:
            raise RuntimeError(f"the page came with size {size}, not {RESULT_BYTES}")
        return data

    async def create(self, slot: int, name: str, data: bytes) -> None:
        await self.sessions[slot].documents("claims").create_async(name, data)


async def measure(call: Callable[[int], Awaitable[Any]], concurrency: int) -> tuple[float, list[Any]]:
    """CPU seconds of this process while `concurrency` calls run at once, and their results."""
    before = time.process_time()
    results = await asyncio.gather(*(call(slot) for slot in range(concurrency)))
    return time.process_time() - before, results


async def one_round(contender: Contender, concurrency: int, data: bytes) -> dict[str, float]:
    """CPU milliseconds per operation of one batch of each operation."""
    spent: dict[str, float] = {}
    seconds, written = await measure(lambda slot: contender.write(slot, data), concurrency)
    spent["write"] = seconds
    seconds, pages = await measure(lambda slot: contender.page(slot, written[slot]), concurrency)
    if any(page != data[PAGE[0] : PAGE[1]] for page in pages):
        raise RuntimeError(f"{contender.name} read back a wrong page")
    spent["page"] = seconds
    token = uuid.uuid4().hex

    async def create(slot: int) -> None:
        await contender.create(slot, f"claim-{token}", f'{{"token": "{token}", "slot": {slot}}}'.encode())

    spent["create"], _ = await measure(create, concurrency)
    return {operation: 1000 * seconds / concurrency for operation, seconds in spent.items()}


async def benchmark(args: argparse.Namespace) -> tuple[list[Contender], dict[str, dict[str, list[float]]]]:
    data = os.urandom(RESULT_BYTES)
    run = uuid.uuid4().hex[:8]
    with local_s3_process() as s3:
        options = s3.storage_options
        contenders: list[Contender] = [
            RawS3fs(options, f"{s3.bucket}/raw-s3fs-{run}"),
            Store(f"{s3.bucket_url}/store-s3fs-{run}", options, "fsspec", args.concurrency),
            Store(f"{s3.bucket_url}/store-obstore-{run}", options, "obstore", args.concurrency),
            RawObstore(options, s3.bucket, f"raw-obstore-{run}"),
        ]
        samples: dict[str, dict[str, list[float]]] = {c.name: {op: [] for op in OPERATIONS} for c in contenders}
        for contender in contenders:
            await contender.open()
            for _ in range(args.warm_up):
                await one_round(contender, args.concurrency, data)
        order = list(contenders)
        for _ in range(args.rounds):
            random.shuffle(order)
            for contender in order:
                for operation, milliseconds in (await one_round(contender, args.concurrency, data)).items():
                    samples[contender.name][operation].append(milliseconds)
        for contender in contenders:
            await contender.close()
    return contenders, samples


def table(args: argparse.Namespace, contenders: list[Contender], samples: dict[str, dict[str, list[float]]]) -> str:
    baseline = {op: statistics.median(samples[contenders[0].name][op]) for op in OPERATIONS}
    baseline_pair = baseline["write"] + baseline["page"]
    lines = [
        f"{args.concurrency} concurrent operations per batch, {args.rounds} rounds; client CPU in ms per operation "
        "(median over rounds), and as a ratio to raw s3fs.",
        "",
        "| client | write (50 KB) | page (10,000 B + size) | conditional create | write + page |",
        "|---|---:|---:|---:|---:|",
    ]
    for contender in contenders:
        medians = {op: statistics.median(samples[contender.name][op]) for op in OPERATIONS}
        cells = [f"{medians[op]:.2f} ms ({medians[op] / baseline[op]:.2f}x)" for op in OPERATIONS]
        pair = medians["write"] + medians["page"]
        cells.append(f"{pair:.2f} ms ({pair / baseline_pair:.2f}x)")
        lines.append(f"| {contender.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds (default: %(default)s)")
    parser.add_argument("--warm-up", type=int, default=2, help="unmeasured rounds first (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=32, help="operations in flight (default: %(default)s)")
    args = parser.parse_args()
    contenders, samples = asyncio.run(benchmark(args))
    print(table(args, contenders, samples))


if __name__ == "__main__":
    main()
