"""
Tenants at size, for `scale.py`: a worker's resident memory (RSS) and each tenant's first use as one root store with
credentials and SSE-C keys per tenant (`AssumeRoleCredentials`, `TenantKeys`) serves 10 to 5,000 tenants.

Each engine runs in a process of its own (this module, run with ``--child``), so its RSS is the client's alone; moto's
S3 and STS serve it from the calling process, whose log gives each tenant's requests (S3 by the tenant's prefix, STS by
count). A tenant's first use is a 1 KB write and a ranged read of it in a session of its own, eight tenants at a time.
The root keeps `DEFAULT_TENANT_CLIENTS` (64) tenant handles; past that, RSS should stay flat.
"""

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from typing import Any

from tenant_setup import ROLE, rss_mib, tenant_keys

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores import AssumeRoleCredentials
from haystack_integrations.offload.testing.local_s3 import LocalS3Server


async def _child(engine: str, url: str, options: dict[str, Any], checkpoints: list[int]) -> list[dict[str, Any]]:
    root = FsspecToolResultStore(
        url,
        storage_options=options,
        engine=engine,
        credentials=AssumeRoleCredentials(ROLE),
        encryption=tenant_keys(),
    )
    limit = asyncio.Semaphore(8)

    async def first_use(number: int) -> float:
        async with limit:
            started = time.perf_counter()
            session = root.for_session(f"tenant-{number}", "chat-1")
            reference = await session.write_async(key="call-1", content="x" * 1024)
            await session.read_range_async(reference, 0, 256)
            return time.perf_counter() - started

    points, done = [], 0
    for checkpoint in checkpoints:
        started, cpu = time.perf_counter(), time.process_time()
        latencies = await asyncio.gather(*(first_use(number) for number in range(done, checkpoint)))
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        gc.collect()
        points.append(
            {
                "tenants": checkpoint,
                "rss_mib": rss_mib(),
                "live": _live_handles(root),
                "median_ms": statistics.median(latencies) * 1000,
                "cpu_ms": cpu / len(latencies) * 1000,
                "wall_s": wall,
                "first": done,
            }
        )
        done = checkpoint
    return points


def _live_handles(root: FsspecToolResultStore) -> int | None:
    """The tenant handles the root's bounded cache holds (a private count: None if it moves)."""
    count = getattr(getattr(root, "_handle", None), "live_tenant_handles", None)
    return count() if callable(count) else None


def _tenant_of(path: str) -> str | None:
    for segment in path.split("/"):
        if segment.startswith("tenant-"):
            return segment
    return None


def measure(server: LocalS3Server, engine: str, checkpoints: list[int]) -> list[dict[str, Any]]:
    """
    Serve `checkpoints[-1]` tenants on `engine` in a process of its own against `server`.

    :returns: One point per checkpoint: RSS MiB, live tenant handles, a first use's median ms and CPU ms, and the S3
        and STS requests of a first use (median over the tenants first used since the checkpoint before).
    """
    url = f"{server.bucket_url}/tenants-{engine}-{uuid.uuid4().hex[:6]}"
    server.requests.clear()
    command = [sys.executable, __file__, "--child", engine, url, json.dumps(server.storage_options())]
    command += [str(checkpoint) for checkpoint in checkpoints]
    run = subprocess.run(command, check=False, capture_output=True, text=True)  # noqa: S603 - this script, our arguments
    if run.returncode:
        raise RuntimeError(f"The {engine} process failed:\n{run.stderr[-4000:]}")
    points: list[dict[str, Any]] = json.loads(run.stdout)
    per_tenant: Counter[str] = Counter()
    sts = 0
    for request in server.requests.snapshot():
        tenant = _tenant_of(request.path)
        if tenant is not None:
            per_tenant[tenant] += 1
        elif request.bucket is None:
            sts += 1
    for point in points:
        window = [per_tenant[f"tenant-{number}"] for number in range(point["first"], point["tenants"])]
        point["s3_requests"] = statistics.median(window)
    points[-1]["sts_per_tenant"] = sts / checkpoints[-1]
    return points


def main() -> None:
    """The child: serve the tenants, print the points as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=3, metavar=("ENGINE", "URL", "OPTIONS"), required=True)
    parser.add_argument("checkpoints", type=int, nargs="+")
    arguments = parser.parse_args()
    engine, url, options = arguments.child
    print(json.dumps(asyncio.run(_child(engine, url, json.loads(options), arguments.checkpoints))))


if __name__ == "__main__":
    main()
