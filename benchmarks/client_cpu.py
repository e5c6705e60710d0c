"""
Client CPU per S3 request: the store on each engine against raw obstore (the floor) and raw s3fs, in one run.

On a multi-user server the S3 client is the CPU hot spot: every offloaded result is a PUT and every page a ranged GET.
This measures what the *client* spends, in CPU seconds of its own process (`time.process_time`: every thread, so
obstore's Rust threads count too), per operation, with 32 operations in flight at once:

- write: a 50 KB result (`write_async`; raw: one PUT);
- page: 10,000 bytes of a written result with its total size (`read_range_and_size_async`; raw obstore: one ranged
  GET, which learns the size; raw s3fs: one ranged GET with ``_cat_file``, which does not);
- write + page: one write plus one page, summed per round (the target: the store on its default engine at most 1.10x
  raw obstore);
- create: a conditional create of a small document (`SessionDocuments.create_async`; raw: one PUT with
  ``If-None-Match: *``).

Contenders, each warmed up first, then measured in interleaved rounds (the order shuffled each round) so that load
from other processes on a shared machine falls on all of them alike:

- raw obstore: `obstore.store.S3Store` with the settings the store gives it, its default timeouts included (the
  baseline, 1.00: the floor);
- with ``--layers``, the default store's own engine called directly: the store's settings, none of its Python;
- with ``--previous SRC``, the store of another checkout's ``src`` on its default engine (a change's before and after
  under the same load);
- the store, default engine: no ``engine`` argument; labelled with the engine it resolved to (`resolved_engine`);
- the store, ``engine="obstore"`` and ``engine="fsspec"`` (s3fs), with the default `RetryPolicy`;
- raw s3fs: an ``asynchronous=True`` `s3fs.S3FileSystem` on the benchmark's loop, with the pool size and single
  attempt the store configures.

The S3 server (``--server``: moto's, in a process of its own, or a one-node Ceph RGW, whose daemons are processes of
their own) is not counted; its speed limits the wall time only.

Run from the repository root (about half a minute on moto)::

    PYTHONPATH=src python benchmarks/client_cpu.py
    PYTHONPATH=src python benchmarks/client_cpu.py --server rgw
    PYTHONPATH=src python benchmarks/client_cpu.py --rounds 20 --concurrency 64
    PYTHONPATH=src python benchmarks/client_cpu.py --server rgw --layers   # + the store's engine alone
    PYTHONPATH=src python benchmarks/client_cpu.py --previous /tmp/old/src  # + an older tree's store, same run

Prints a Markdown table (the one for benchmarks/README.md), whether the target is met, and each contender's write + page
over raw obstore's paired round by round (the median of each round's ratio: load common to a round cancels).
"""

import argparse
import asyncio
import contextlib
import importlib
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import obstore
import s3fs
from obstore.store import S3Store

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores.fsspec_store import DEFAULT_RETRY, DEFAULT_S3_MAX_POOL_CONNECTIONS
from haystack_integrations.offload.stores.obstore_io import obstore_settings
from haystack_integrations.offload.stores.options import with_default_timeouts
from haystack_integrations.offload.stores.retry import s3_client_options
from haystack_integrations.offload.testing.local_s3 import local_s3_process

OPERATIONS = ("write", "page", "create")
# The columns: the operations, and one write plus one page of the same round.
COLUMNS = ("write", "page", "write + page", "create")
TARGET = 1.10  # the store on its default engine, CPU per write + page, at most this times raw obstore's
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
    name = "raw s3fs"

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
    name = "raw obstore (baseline: the floor)"

    def __init__(self, options: dict[str, Any], bucket: str, prefix: str) -> None:
        # The store's own settings, its default connect and read timeouts included: object_store keeps a timer per
        # read for them, whose cost in its threads is the timeouts', not the store's Python.
        settings = obstore_settings(
            with_default_timeouts(options), retrying=True, attempt_timeout=DEFAULT_RETRY.attempt_timeout
        )
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
        data = bytes(await result.bytes_async())
        if result.meta["size"] != RESULT_BYTES:  # the size, as the store's page returns it
            raise RuntimeError(f"the page came with size {result.meta['size']}, not {RESULT_BYTES}")
        return data

    async def create(self, slot: int, name: str, data: bytes) -> None:
        key = f"{self.prefix}/{slot}/.claims/{name}"
        await obstore.put_async(self.store, key, data, mode="create", use_multipart=False)


class Store(Contender):
    """The store; `engine` None constructs it without an engine argument (its default)."""

    def __init__(
        self, url: str, options: dict[str, Any], engine: str | None, slots: int, *, previous: Any = None
    ) -> None:
        if previous is not None:  # the store class of another checkout (`previous_store`), on its default engine
            self.root = previous(url, storage_options=options)
            self.name = f"previous store, default engine ({self.root.resolved_engine}; --previous)"
        elif engine is None:
            self.root = FsspecToolResultStore(url, storage_options=options)
            self.name = f"store, default engine ({self.root.resolved_engine})"
        else:
            self.root = FsspecToolResultStore(url, storage_options=options, engine=engine)
            self.name = f"store, engine={engine!r}"
        self.default = engine is None and previous is None
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


def previous_store(source: Path, into: Path) -> Any:
    """
    `FsspecToolResultStore` of another checkout's ``src`` (say, the commit before a change), importable beside this
    one's: its package copied under `into` as ``offload_previous``, its imports renamed to match.
    """
    package = into / "offload_previous"
    shutil.copytree(source / "haystack_integrations" / "offload", package, ignore=shutil.ignore_patterns("__pycache__"))
    for module in package.rglob("*.py"):
        text = module.read_text(encoding="utf-8")
        module.write_text(text.replace("haystack_integrations.offload", "offload_previous"), encoding="utf-8")
    sys.path.insert(0, str(into))
    return importlib.import_module("offload_previous").FsspecToolResultStore


class StoresEngine(Contender):
    """The engine the default store resolved to, called directly: where the store's share of the gap begins."""

    name = "the default store's engine alone (--layers)"

    def __init__(self, url: str, options: dict[str, Any], bucket: str, prefix: str) -> None:
        self.root = FsspecToolResultStore(url, storage_options=options)
        self.prefix = f"{bucket}/{prefix}"

    async def open(self) -> None:
        await self.root.warm_up_async()
        self.io = self.root._handle.io()  # the client the store's own requests use, with its settings

    async def write(self, slot: int, data: bytes) -> Any:
        path = f"{self.prefix}/{slot}/{uuid.uuid4().hex}"
        await self.io.put_async(path, data)
        return path

    async def page(self, slot: int, written: Any) -> bytes:
        return (await self.io.get_range_and_size_async(written, *PAGE))[0]

    async def create(self, slot: int, name: str, data: bytes) -> None:
        await self.io.put_exclusive_async(f"{self.prefix}/{slot}/.claims/{name}", data)


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
    spent["write + page"] = spent["write"] + spent["page"]
    return {column: 1000 * seconds / concurrency for column, seconds in spent.items()}


@contextlib.contextmanager
def s3_server(kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The bucket and storage options of a fresh S3 server: moto's in a process of its own, or a Ceph RGW."""
    if kind == "rgw":
        # The Ceph launcher is a test rig of ours (tests/support/), not part of the library.
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from support.ceph_rgw import CephRGWServer

        # radosgw, the OSD and the mon are processes of their own: their CPU is not this process's.
        with CephRGWServer(bucket="client-cpu") as rgw:
            yield rgw.bucket, rgw.storage_options()
    else:
        with local_s3_process() as moto:
            yield moto.bucket, moto.storage_options


async def benchmark(args: argparse.Namespace) -> tuple[list[Contender], dict[str, dict[str, list[float]]]]:
    data = os.urandom(RESULT_BYTES)
    run = uuid.uuid4().hex[:8]
    with s3_server(args.server) as (bucket, options):
        contenders: list[Contender] = [
            RawObstore(options, bucket, f"raw-obstore-{run}"),
            Store(f"s3://{bucket}/store-default-{run}", options, None, args.concurrency),
            Store(f"s3://{bucket}/store-obstore-{run}", options, "obstore", args.concurrency),
            Store(f"s3://{bucket}/store-s3fs-{run}", options, "fsspec", args.concurrency),
            RawS3fs(options, f"{bucket}/raw-s3fs-{run}"),
        ]
        if args.previous is not None:
            previous = previous_store(args.previous, Path(tempfile.mkdtemp(prefix="client-cpu-")))
            at = f"s3://{bucket}/previous-{run}"
            contenders.insert(2, Store(at, options, None, args.concurrency, previous=previous))
        if args.layers:
            contenders.insert(1, StoresEngine(f"s3://{bucket}/engine-{run}", options, bucket, f"engine-{run}"))
        samples: dict[str, dict[str, list[float]]] = {c.name: {col: [] for col in COLUMNS} for c in contenders}
        for contender in contenders:
            await contender.open()
            for _ in range(args.warm_up):
                await one_round(contender, args.concurrency, data)
        order = list(contenders)
        for _ in range(args.rounds):
            random.shuffle(order)
            for contender in order:
                for column, milliseconds in (await one_round(contender, args.concurrency, data)).items():
                    samples[contender.name][column].append(milliseconds)
        for contender in contenders:
            await contender.close()
    return contenders, samples


def table(args: argparse.Namespace, contenders: list[Contender], samples: dict[str, dict[str, list[float]]]) -> str:
    medians = {c.name: {col: statistics.median(samples[c.name][col]) for col in COLUMNS} for c in contenders}
    floor = medians[contenders[0].name]
    server = "moto (its own process)" if args.server == "moto" else "Ceph RGW (one node, daemons of its own)"
    lines = [
        f"{args.concurrency} concurrent operations per batch, {args.rounds} rounds, on {server}; client CPU in ms per "
        "operation (median over rounds; write + page summed per round), and as a ratio to raw obstore's.",
        "",
        "| client | write (50 KB) | page (10,000 B + size) | write + page | conditional create |",
        "|---|---:|---:|---:|---:|",
    ]
    for contender in contenders:
        cells = [
            f"{medians[contender.name][col]:.2f} ms ({medians[contender.name][col] / floor[col]:.2f}x)"
            for col in COLUMNS
        ]
        lines.append(f"| {contender.name} | " + " | ".join(cells) + " |")
    default = next(c for c in contenders if isinstance(c, Store) and c.default)
    ratio = medians[default.name]["write + page"] / floor["write + page"]
    verdict = "met" if ratio <= TARGET else "NOT met"
    lines += [
        "",
        f"Target: {default.name}, write + page at most {TARGET:.2f}x raw obstore: {ratio:.2f}x, {verdict}.",
        "",
        "Paired, each round's write + page over raw obstore's in the same round (load common to a round cancels), "
        "median over rounds:",
    ]
    raw = samples[contenders[0].name]["write + page"]
    for contender in contenders[1:]:
        rounds = zip(samples[contender.name]["write + page"], raw, strict=True)
        paired = statistics.median(mine / floor_round for mine, floor_round in rounds)
        lines.append(f"- {contender.name}: {paired:.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds (default: %(default)s)")
    parser.add_argument("--warm-up", type=int, default=2, help="unmeasured rounds first (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=32, help="operations in flight (default: %(default)s)")
    parser.add_argument(
        "--server", choices=["moto", "rgw"], default="moto", help="the S3 server (rgw: a Ceph RGW; default: moto)"
    )
    parser.add_argument(
        "--layers",
        action="store_true",
        help="add the default store's engine called directly, without the store above it",
    )
    parser.add_argument(
        "--previous",
        type=Path,
        metavar="SRC",
        help="add the store of another checkout's src directory (e.g. the commit before a change), in the same run",
    )
    args = parser.parse_args()
    contenders, samples = asyncio.run(benchmark(args))
    print(table(args, contenders, samples))


if __name__ == "__main__":
    main()
