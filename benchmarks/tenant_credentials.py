"""
What tenant isolation in the object store costs: credentials per tenant (`AssumeRoleCredentials`), SSE-C keys per
tenant (`TenantKeys`) and both, against the worker's own credentials: STS calls, and the CPU and latency of a write and
a page read, on Ceph RGW with STS (ratios in one run). CPU is this process's (the client's): RGW's encryption work is
in the latency, not the CPU column.

Each round: for every tenant, a session store writes a 20 KB result and reads a 4 KB page of it, from a pool of
threads; the setups take turns round by round so the machine's noise falls on all of them.

    python benchmarks/tenant_credentials.py --tenants 20 --rounds 10
"""

import argparse
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from haystack.utils import Secret

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores import AssumeRoleCredentials, TenantKeys
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--engine", choices=["obstore", "fsspec"], default="obstore")
    args = parser.parse_args()
    with CephRGWServer(sts=True) as server:
        role = server.create_tenant_role()
        source, both = AssumeRoleCredentials(role), AssumeRoleCredentials(role)
        keys = TenantKeys(Secret.from_token("the benchmark's master secret, not a real one"))
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
