"""
Replicas behind HAProxy: turns per second and turn latency at 1, 2 and 3 replicas (ratios to one replica, in one run),
and what a rolling restart of every replica and a SIGKILL of one, mid-load, cost on 3.

Each replica is the container's command (``app/deploy/Dockerfile``) on a loopback address of its own, HAProxy runs
``app/deploy/haproxy.cfg`` (Debian's ``haproxy`` must be installed), and the store is moto's server in a process of
its own (``--s3 moto``) or a one-node Ceph RGW (``--s3 rgw``). The load: 3 sessions per tenant for 2 tenants, each a
client sending research messages and invoice requests (which wait for approval) and deciding them.

On RGW the replicas isolate tenants as the tests' isolated lane does (``tests/support/isolation.py``): each tenant's
requests sign with STS credentials of a role limited to its prefix (``OFFLOAD_SERVER_S3_TENANT_ROLE_ARN``) and each
tenant's results are encrypted with its own SSE-C key (``OFFLOAD_SERVER_S3_SSE_C_MASTER_KEY``); ``--no-isolation``
turns that off. The rolling restart waits, per replica, for HAProxy to take it out and put it back, as an
orchestrator does (``tests/app/server/test_replicas_behind_haproxy.py``).

    python benchmarks/replicas.py --s3 rgw --seconds 30
"""

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.isolation import TEST_MASTER_SECRET
from support.replicas import Load, check_sessions, deployment

TOKENS = {"acme-bench-token-0123456789": "acme", "globex-bench-token-0123456789": "globex"}


@contextlib.contextmanager
def s3_store(kind: str, isolation: bool) -> Iterator[tuple[str, dict[str, Any], dict[str, str]]]:
    """The bucket's URL, its options, and the replicas' isolation settings (none unless `isolation`, RGW only)."""
    if kind == "rgw":
        from support.ceph_rgw import CephRGWServer

        with CephRGWServer(sts=isolation) as server:
            settings = {}
            if isolation:
                # STS is asked at the S3 endpoint (the setting's default); every replica derives the same keys.
                settings = {
                    "OFFLOAD_SERVER_S3_TENANT_ROLE_ARN": server.create_tenant_role(),
                    "OFFLOAD_SERVER_S3_SSE_C_MASTER_KEY": TEST_MASTER_SECRET,
                }
            yield server.bucket_url, server.storage_options(), settings
        return
    from haystack_integrations.offload.testing.local_s3 import local_s3_process

    with local_s3_process() as server:
        yield server.bucket_url, server.storage_options, {}


def _fresh(bucket_url: str) -> str:
    return f"{bucket_url}/bench-{uuid.uuid4().hex[:8]}"


def _latencies(load: Load) -> list[float]:
    return sorted(sent.seconds for sent in load.sent if sent.status == 200)


def _percentile(values: list[float], share: float) -> float:
    return values[min(len(values) - 1, int(share * len(values)))] if values else float("nan")


def steady(
    count: int, seconds: float, bucket_url: str, options: dict[str, Any], settings: dict[str, str]
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory() as workdir,
        deployment(count, _fresh(bucket_url), options, TOKENS, Path(workdir), settings) as (_, lb),
    ):
        load = Load(lb.url, TOKENS, sessions_per_tenant=3)
        load.run(seconds)
    latencies = _latencies(load)
    return {"replicas": count, "turns": len(latencies), "per_second": len(latencies) / seconds, "latencies": latencies}


def faults(seconds: float, bucket_url: str, options: dict[str, Any], settings: dict[str, str]) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory() as workdir,
        deployment(3, _fresh(bucket_url), options, TOKENS, Path(workdir), settings) as (replicas, lb),
    ):
        load = Load(lb.url, TOKENS, sessions_per_tenant=3)
        sessions = load.run()
        started = time.monotonic()
        time.sleep(seconds / 4)
        in_flight = []
        # One at a time, each seen down by HAProxy and back before the next goes, as an orchestrator restarts.
        for replica in replicas:
            in_flight.append(lb.wait_busy(replica.name))
            taken_out = lb.times_down(replica.name)
            replica.stop()
            lb.wait_down(replica.name, since=taken_out)
            replica.start()
            replica.wait_ready()
            lb.wait_up(replica.name)
        in_flight.append(lb.wait_busy(replicas[1].name))
        taken_out = lb.times_down(replicas[1].name)
        replicas[1].kill()
        lb.wait_down(replicas[1].name, since=taken_out)
        replicas[1].start()
        replicas[1].wait_ready()
        time.sleep(max(0.0, seconds - (time.monotonic() - started)))
        load.finish()
        elapsed = time.monotonic() - started
        stats = lb.stats()
        counts = check_sessions(lb.url, TOKENS, load, sessions)
    latencies = _latencies(load)
    balancer = {
        "down": sum(int(stats[r.name]["chkdown"]) for r in replicas),
        "redispatched": int(stats["BACKEND"].get("wredis") or 0),
        "retried": int(stats["BACKEND"].get("wretr") or 0),
        "5xx": int(stats["BACKEND"].get("hrsp_5xx") or 0),
    }
    no_answer = sum(1 for sent in load.sent if sent.status is None or sent.status >= 500)
    return {
        "replicas": 3,
        "turns": len(latencies),
        "per_second": len(latencies) / elapsed,
        "latencies": latencies,
        "counts": counts,
        "balancer": balancer,
        "in_flight": in_flight,
        "no_answer": no_answer,
        "details": load.details,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--s3", choices=["moto", "rgw"], default="moto")
    parser.add_argument("--seconds", type=float, default=30.0, help="load per measurement (default: %(default)s)")
    parser.add_argument(
        "--isolation",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="STS credentials and an SSE-C key per tenant (default: on for rgw; moto has no role to assume here)",
    )
    args = parser.parse_args()
    if args.isolation is None:
        args.isolation = args.s3 == "rgw"
    if args.isolation and args.s3 != "rgw":
        parser.error("--isolation needs --s3 rgw")
    with s3_store(args.s3, args.isolation) as (bucket_url, options, settings):
        rows = [steady(count, args.seconds, bucket_url, options, settings) for count in (1, 2, 3)]
        faulted = faults(args.seconds, bucket_url, options, settings)
    base = rows[0]
    isolated = ", STS credentials and an SSE-C key per tenant" if args.isolation else ""
    print(f"store: {args.s3}{isolated}; {args.seconds:.0f} s of load per row; 6 concurrent sessions (2 tenants)\n")
    print("| replicas | turns | turns/s | vs 1 replica | p50 s | p99 s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        p50, p99 = statistics.median(row["latencies"]), _percentile(row["latencies"], 0.99)
        ratio = row["per_second"] / base["per_second"]
        print(
            f"| {row['replicas']} | {row['turns']} | {row['per_second']:.1f} | {ratio:.2f}x | {p50:.2f} | {p99:.2f} |"
        )
    counts, balancer = faulted["counts"], faulted["balancer"]
    p50, p99 = statistics.median(faulted["latencies"]), _percentile(faulted["latencies"], 0.99)
    print("\nRolling restart of all 3 and a SIGKILL of one, mid-load:\n")
    print(
        "| turns | turns/s | p50 s | p99 s | no answer / 5xx | lost | twice | approved never | approved twice "
        "| denied ran | stuck | asked again | decisions checked |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {faulted['turns']} | {faulted['per_second']:.1f} | {p50:.2f} | {p99:.2f} | {faulted['no_answer']} "
        f"| {counts['lost']} | {counts['twice']} | {counts['approved_never']} | {counts['approved_twice']} "
        f"| {counts['denied_ran']} | {counts['stuck']} | {counts['asked_again']} | {counts['calls']} |"
    )
    print(
        f"\nHAProxy: requests open on the replica at each signal {faulted['in_flight']} (3 SIGTERMs, then the "
        "SIGKILL); "
        f"servers marked down {balancer['down']}; redispatched {balancer['redispatched']}, retried "
        f"{balancer['retried']}, 5xx answered {balancer['5xx']}"
    )
    for line in faulted["details"]:
        print(f"  {line}")


if __name__ == "__main__":
    main()
