"""
What tenant isolation in the object store costs: credentials per tenant (`AssumeRoleCredentials`), SSE-C keys per
tenant (`TenantKeys`) and both, against the worker's own credentials: STS calls, and the CPU and latency of a write and
a page read, on Ceph RGW with STS (ratios in one run). CPU is this process's (the client's): RGW's encryption work is
in the latency, not the CPU column.

Each round: for every tenant, a session store writes a 20 KB result and reads a 4 KB page of it, from a pool of
threads; the setups take turns round by round so the machine's noise falls on all of them.

    python benchmarks/tenant_credentials.py --tenants 20 --rounds 10

``--memory``: the client's resident memory (RSS) as a root store with credentials and keys per tenant serves 200,
then 2,000 tenants (one write of 1 KB and one page read each), on each engine, each in a process of its own, with
moto's S3 and STS in another process (so only the client is measured). A root keeps `DEFAULT_TENANT_CLIENTS` tenant
clients; past that, RSS should stay flat.

    python benchmarks/tenant_credentials.py --memory --memory-tenants 200 2000
"""

import argparse
import asyncio
import gc
import json
import multiprocessing
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tenant_setup import ROLE, rss_mib, tenant_keys

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores import AssumeRoleCredentials
from support.ceph_rgw import CephRGWServer

CONTENT = "x" * 20_000


def one_round(root: FsspecToolResultStore, tenants: int) -> tuple[list[float], float]:
    def work(tenant: int) -> float:
        started = time.perf_counter()
        session = root.for_session(f"tenant-{tenant}", "chat-1")
        reference = session.write(key=f"call-{uuid.uuid4().hex[:6]}", content=CONTENT)
        session.read_range(reference, 0, 4096)
        return time.perf_counter() - started

    cpu = time.process_time()
    with ThreadPoolExecutor(max_workers=8) as pool:
        latencies = list(pool.map(work, range(tenants)))
    return latencies, time.process_time() - cpu


def _serve_moto(ready: Any, stop: Any) -> None:
    from haystack_integrations.offload.testing.local_s3 import LocalS3Server

    with LocalS3Server() as server:
        ready.put((server.bucket_url, server.storage_options()))
        stop.wait()


def _measure_memory(engine: str, bucket_url: str, options: dict[str, Any], checkpoints: list[int]) -> None:
    """In a process of its own: serve tenants one after another, printing RSS (JSON) at each checkpoint."""
    source = AssumeRoleCredentials(ROLE)
    root = FsspecToolResultStore(
        f"{bucket_url}/memory-{uuid.uuid4().hex[:6]}",
        storage_options=options,
        engine=engine,
        credentials=source,
        encryption=tenant_keys(),
    )

    async def serve(first: int, last: int) -> None:
        limit = asyncio.Semaphore(8)

        async def tenant(number: int) -> None:
            async with limit:
                session = root.for_session(f"tenant-{number}", "chat-1")
                reference = await session.write_async(key="call-1", content="x" * 1024)
                await session.read_range_async(reference, 0, 256)

        await asyncio.gather(*(tenant(number) for number in range(first, last)))

    async def run() -> list[dict[str, float]]:
        points, done = [], 0
        await serve(0, 10)  # warm: imports, the first clients
        gc.collect()
        points.append({"tenants": 10, "rss_mib": rss_mib()})
        done = 10
        for checkpoint in checkpoints:
            await serve(done, checkpoint)
            done = checkpoint
            gc.collect()
            points.append({"tenants": checkpoint, "rss_mib": rss_mib(), "live": len(root._handle._tenant_handles)})
        return points

    async def renewals() -> dict[str, float]:
        # 20 tenants, every round's credentials forced due (as if expired): 200 renewals, each replacing a client.
        rss = {}
        for round_number in range(11):
            source._cache.clear()
            await serve(0, 20)
            gc.collect()
            if round_number in (1, 10):
                rss[f"rss_mib_after_{(round_number - 1) * 20 + 20}"] = rss_mib()
        rss["sts_calls"] = source.calls
        return rss

    curve = asyncio.run(run())
    print(json.dumps({"curve": curve, "renewals": asyncio.run(renewals())}))


def memory(checkpoints: list[int]) -> None:
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Queue(), context.Event()
    server = context.Process(target=_serve_moto, args=(ready, stop), daemon=True)
    server.start()
    try:
        bucket_url, options = ready.get(timeout=60)
        rows, renewed = {}, {}
        for engine in ("obstore", "fsspec"):
            command = [
                sys.executable,
                __file__,
                "--memory-engine",
                engine,
                "--memory-server",
                json.dumps([bucket_url, options]),
            ]
            command += ["--memory-tenants", *map(str, checkpoints)]
            run = subprocess.run(command, check=True, capture_output=True, text=True)  # noqa: S603 - this script, our arguments
            measured = json.loads(run.stdout)
            rows[engine], renewed[engine] = measured["curve"], measured["renewals"]
    finally:
        stop.set()
        server.join(timeout=10)
    print("moto (S3 and STS in another process), credentials and keys per tenant, one root store, 1 KB write + page\n")
    print(
        "| engine | "
        + " | ".join(f"RSS MiB at {point['tenants']:,} tenants" for point in rows["obstore"])
        + " | growth |"
    )
    print("|---|" + "---:|" * (len(rows["obstore"]) + 1))
    for engine, points in rows.items():
        growth = points[-1]["rss_mib"] - points[1]["rss_mib"]
        cells = " | ".join(f"{point['rss_mib']:.0f}" for point in points)
        print(f"| {engine} | {cells} | {growth:+.0f} MiB ({points[1]['tenants']:,} to {points[-1]['tenants']:,}) |")
    live = ", ".join(f"{engine} {points[-1].get('live')}" for engine, points in rows.items())
    print(f"\nlive tenant clients at the end: {live}")
    print("\n| engine | RSS MiB after 20 renewals | after 200 renewals | growth |")
    print("|---|---:|---:|---:|")
    for engine, rss in renewed.items():
        before, after = rss["rss_mib_after_20"], rss["rss_mib_after_200"]
        print(f"| {engine} | {before:.0f} | {after:.0f} | {after - before:+.0f} MiB |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--engine", choices=["obstore", "fsspec"], default="obstore")
    parser.add_argument("--memory", action="store_true", help="RSS against the number of tenants, on moto")
    parser.add_argument("--memory-tenants", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--memory-engine", help=argparse.SUPPRESS)
    parser.add_argument("--memory-server", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_engine:
        bucket_url, options = json.loads(args.memory_server)
        _measure_memory(args.memory_engine, bucket_url, options, args.memory_tenants)
        return
    if args.memory:
        memory(args.memory_tenants)
        return
    with CephRGWServer(sts=True) as server:
        role = server.create_tenant_role()
        source, both = AssumeRoleCredentials(role), AssumeRoleCredentials(role)
        keys = tenant_keys()
        url = f"s3://{server.bucket}/bench-{uuid.uuid4().hex[:6]}"
        options = server.storage_options()

        def store(**isolation: Any) -> FsspecToolResultStore:
            # A root of its own per setup: SSE-C objects and plain ones must not share a prefix.
            return FsspecToolResultStore(
                f"{url}-{len(isolation)}-{uuid.uuid4().hex[:4]}",
                storage_options=options,
                engine=args.engine,
                **isolation,
            )

        stores = {
            "worker's credentials": store(),
            "per-tenant credentials": store(credentials=source),
            "per-tenant keys (SSE-C)": store(encryption=keys),
            "credentials and keys": store(credentials=both, encryption=keys),
        }
        for root in stores.values():
            one_round(root, args.tenants)  # warm: clients made, and each tenant's credentials asked for once
        calls_after_warm_up = source.calls
        results: dict[str, dict[str, Any]] = {name: {"latencies": [], "cpu": 0.0} for name in stores}
        started = time.monotonic()
        for _ in range(args.rounds):
            for name, root in stores.items():
                latencies, cpu = one_round(root, args.tenants)
                results[name]["latencies"] += latencies
                results[name]["cpu"] += cpu
        elapsed = time.monotonic() - started
    operations = args.tenants * args.rounds
    base = results["worker's credentials"]
    print(
        f"Ceph RGW, engine {args.engine}, {args.tenants} tenants x {args.rounds} rounds (write 20 KB + read a page)\n"
    )
    print("| isolation | CPU ms per write+page | vs worker's | p50 ms | p99 ms | p50 vs worker's |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, result in results.items():
        cpu_each = result["cpu"] / operations * 1000
        latencies = sorted(result["latencies"])
        p50, p99 = statistics.median(latencies) * 1000, latencies[int(0.99 * (len(latencies) - 1))] * 1000
        ratio = result["cpu"] / base["cpu"]
        latency_ratio = p50 / (statistics.median(base["latencies"]) * 1000)
        print(f"| {name} | {cpu_each:.2f} | {ratio:.2f}x | {p50:.1f} | {p99:.1f} | {latency_ratio:.2f}x |")
    print(
        f"\nSTS calls: {calls_after_warm_up} while warming up ({args.tenants} tenants), "
        f"{source.calls - calls_after_warm_up} in the {elapsed:.0f} s measured; by the default duration and renewal, "
        "one call per active tenant every 55 minutes"
    )


if __name__ == "__main__":
    main()
