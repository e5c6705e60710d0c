"""
What the reference server's stateless design costs per turn, and what adding worker processes gives back.

1. **Per turn, on S3** (moto's server on loopback, in process): the same message answered by a bare
   ``agent.run_async`` with the session's store (the baseline: what a server that keeps history in memory does) and by
   `ChatService.send_message`, which reads the conversation from the store, claims the turn with a conditional create,
   runs the same Agent and records the turn. Medians, the ratio, and the S3 requests of each from the server's log.
2. **Throughput with 1 and 2 worker processes**: ``offload-haystack serve --workers N`` on one local store, driven by
   concurrent clients (each its own session, several messages each) over HTTP; turns per second and the ratio.

Run from the repository root with the ``test`` extra installed::

    PYTHONPATH=src python benchmarks/server_turns.py
"""

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
from haystack.dataclasses import ChatMessage

from haystack_integrations.offload import DurableApprovals, FsspecToolResultStore, offload_context
from haystack_integrations.offload.sessions.service import ChatService
from haystack_integrations.offload.testing.local_s3 import LocalS3Server
from offload_haystack_app.demo.scripted_model import scripted_generator
from offload_haystack_app.server.agent import build_agent

MESSAGE = "Research heat pumps, dump the invoices table and chart revenue"


def _requests(server: LocalS3Server) -> str:
    counts: Counter[str] = Counter()
    for request in server.requests.snapshot():
        conditional = " (conditional)" if request.header("if-none-match") else ""
        kind = "LIST" if request.method == "GET" and "list-type" in request.query else request.method
        counts[kind + conditional] += 1
    return ", ".join(f"{count} {kind}" for kind, count in sorted(counts.items()))


async def _per_turn(sessions: int) -> list[tuple[str, float, str]]:
    with LocalS3Server() as server:
        root = FsspecToolResultStore(f"{server.bucket_url}/bench", storage_options=server.storage_options())
        await root.warm_up_async()
        agent = build_agent(scripted_generator())
        service = ChatService(agent, worker="bench")
        bare: list[float] = []
        served: list[float] = []
        bare_requests = served_requests = ""
        for number in range(sessions):
            # The second turn of a conversation is measured: the steady state, with history to carry.
            store = root.for_session("acme", f"bare-{number}")
            context = offload_context(store, approval_channel=DurableApprovals())
            first = await agent.run_async([ChatMessage.from_user(MESSAGE)], hook_context=context)
            server.requests.clear()
            started = time.perf_counter()
            context = offload_context(store, approval_channel=DurableApprovals())
            await agent.run_async([*first["messages"], ChatMessage.from_user(MESSAGE)], hook_context=context)
            bare.append(time.perf_counter() - started)
            bare_requests = _requests(server)

            store = root.for_session("acme", f"served-{number}")
            await service.send_message(store, MESSAGE)
            server.requests.clear()
            started = time.perf_counter()
            await service.send_message(store, MESSAGE)
            served.append(time.perf_counter() - started)
            served_requests = _requests(server)
    baseline = statistics.median(bare)
    return [
        ("agent.run_async, history kept in memory (baseline)", baseline, bare_requests),
        ("ChatService.send_message (history in the store)", statistics.median(served), served_requests),
    ]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _throughput(workers: int, clients: int, messages: int, store: str) -> float:
    port = _free_port()
    token = uuid.uuid4().hex
    environment = {**os.environ, "OFFLOAD_SERVER_TOKENS": json.dumps({token: "acme"})}
    command = [sys.executable, "-m", "haystack_integrations.offload.cli", "serve", "--port", str(port)]
    command += ["--workers", str(workers), "--store", store, "--log-level", "warning"]
    # Our own interpreter on fixed arguments.
    process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"{base}/api/health", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the server did not start") from None
                time.sleep(0.2)
        time.sleep(1.0 * workers)  # let every worker finish starting, so the first requests do not wait for it
        failures: list[int] = []

        def client(number: int) -> None:
            session = f"bench-{workers}-{number}-{uuid.uuid4().hex[:6]}"
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
                for _ in range(messages):
                    response = http.post(f"/api/sessions/{session}/messages", json={"text": MESSAGE})
                    if response.status_code != 200:
                        failures.append(response.status_code)

        threads = [threading.Thread(target=client, args=(number,)) for number in range(clients)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        if failures:
            raise RuntimeError(f"{len(failures)} requests failed: {Counter(failures)}")
        return clients * messages / elapsed
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def main(argv: list[str] | None = None) -> int:
    """Run both parts and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20, help="turns measured per variant in part 1")
    parser.add_argument("--clients", type=int, default=8, help="concurrent client sessions in part 2")
    parser.add_argument("--messages", type=int, default=6, help="messages per client in part 2")
    arguments = parser.parse_args(argv)

    rows = asyncio.run(_per_turn(arguments.sessions))
    baseline = rows[0][1]
    print(f"Part 1: the second turn of a conversation on S3 (moto on loopback), median of {arguments.sessions}\n")
    print("| variant | median ms | x baseline | S3 requests |")
    print("|---|---:|---:|---|")
    for name, seconds, requests in rows:
        print(f"| {name} | {seconds * 1000:.1f} | {seconds / baseline:.2f} | {requests} |")

    with tempfile.TemporaryDirectory() as directory:
        store = str(Path(directory) / "results")
        one = _throughput(1, arguments.clients, arguments.messages, store)
        two = _throughput(2, arguments.clients, arguments.messages, store)
    total = arguments.clients * arguments.messages
    print(f"\nPart 2: {arguments.clients} concurrent sessions x {arguments.messages} messages over HTTP, local store\n")
    print("| worker processes | turns per second | x one worker |")
    print("|---:|---:|---:|")
    print(f"| 1 | {one:.1f} | 1.00 |")
    print(f"| 2 | {two:.1f} | {two / one:.2f} |")
    print(f"\n({total} turns per run; {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
