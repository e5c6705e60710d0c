"""
What an approval costs on S3: one conversation turn with an approval, against the same turn without one.

A real Agent (scripted `MockChatGenerator`, so the model costs nothing) calls one tool, over fresh sessions of an
`FsspecToolResultStore` on moto's S3 server (real HTTP on loopback), all async as in a server. The unit is one S3 PUT
(`store.write_async`), measured in the same run; every phase is reported as a multiple of it:

- a turn with no approval needed (`NeverAskPolicy`): the model call, the tool, the final answer (no S3 I/O);
- in-process: `CallbackApprovals` with a callback that approves at once; the session's store gets the audit;
- durable: `DurableApprovals`: the run stops (step and request stored), `pending_approvals`, `decide`, then
  `resume_async` runs the call once and finishes the turn. The human's thinking time is not counted.

Times are medians over the sessions; requests are counted from the server's log per phase (exact, not estimated).

With ``--history A,B,...`` it then measures the whole durable round trip in a session that already holds A decided and
resumed approvals (seeded as the real code writes them: `approval_history.seed`), for each A: its S3 requests, LISTs,
bytes sent by the server, and time. The round trip lists nothing, so every figure but the time is the same at every A.
A phase's multiple of one PUT is roughly its number of sequential requests plus the library's own overhead; on real
S3 the per-request latency differs, so carry the request counts over, not the milliseconds.

Run from the repository root::

    PYTHONPATH=src:tests/approvals python benchmarks/approvals_round_trip.py --sessions 30

Prints the Markdown table kept in benchmarks/README.md.
"""

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from approval_history import round_trip, seed
from approval_scenario import LEDGER_ENV, make_agent, plan
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy, NeverAskPolicy

from haystack_integrations.offload import (
    APPROVAL_REQUIRED,
    CallbackApprovals,
    Decision,
    DurableApprovals,
    FsspecToolResultStore,
    decide_async,
    offload_context,
    pending_approvals_async,
    resume_async,
)
from haystack_integrations.offload.testing.local_s3 import LocalS3Server

CALL = ("send_invoice", {"customer": "acme", "amount": 10}, "call_1")


def check(condition: bool, message: str) -> None:
    """Stop the benchmark if a result is not what was measured for (asserts vanish under ``python -O``)."""
    if not condition:
        raise RuntimeError(message)


async def timed(function: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await function()
    return time.perf_counter() - started, result


async def main(sessions: int) -> None:
    os.environ[LEDGER_ENV] = tempfile.mktemp(prefix="approval-bench-")  # noqa: S306 - a scratch file name for a benchmark
    with LocalS3Server() as server:
        root = FsspecToolResultStore(
            f"{server.bucket_url}/{uuid.uuid4().hex}", storage_options=server.storage_options()
        )
        await root.warm_up_async()
        plain = make_agent({"send_invoice": NeverAskPolicy()})
        asking = make_agent({"send_invoice": AlwaysAskPolicy()})
        times: dict[str, list[float]] = {}
        requests: dict[str, Counter[str]] = {}

        def record(phase: str, seconds: float) -> None:
            times.setdefault(phase, []).append(seconds)
            log = server.requests.snapshot()
            server.requests.clear()
            requests[phase] = Counter(f"{r.method}{' (conditional)' if r.header('if-none-match') else ''}" for r in log)
            requests[phase]["LIST"] = sum(1 for r in log if "list-type=2" in r.query)
            requests[phase]["GET"] -= requests[phase]["LIST"]

        async def approve(request: Any) -> Decision:
            return Decision.approve(by="bench")

        for index in range(sessions):
            session = root.for_session("bench", f"s-{index}")
            durable = root.for_session("bench", f"d-{index}")
            server.requests.clear()

            seconds, _ = await timed(partial(session.write_async, key="unit.txt", content="x" * 100))
            record("unit: one S3 PUT (store.write_async)", seconds)

            context = offload_context(session)
            seconds, reply = await timed(partial(plain.run_async, [plan(CALL)], hook_context=context))
            check(reply["last_message"].text.startswith("final: invoice sent"), "baseline did not finish")
            record("turn without approval (no S3 I/O)", seconds)

            context = offload_context(session, approval_channel=CallbackApprovals(approve))
            seconds, reply = await timed(partial(asking.run_async, [plan(CALL)], hook_context=context))
            check(reply["last_message"].text.startswith("final: invoice sent"), "in-process did not finish")
            record("in-process: turn with callback approval", seconds)

            context = offload_context(durable, approval_channel=DurableApprovals())
            seconds, reply = await timed(partial(asking.run_async, [plan(CALL)], hook_context=context))
            check(reply["exit_reason"] == APPROVAL_REQUIRED, "durable run did not stop")
            record("durable 1/4: run stops, request stored", seconds)
            seconds, pending = await timed(partial(pending_approvals_async, durable))
            record("durable 2/4: pending_approvals", seconds)
            seconds, _ = await timed(partial(decide_async, durable, pending[0].request_id, Decision.approve()))
            record("durable 3/4: decide", seconds)
            seconds, final = await timed(partial(resume_async, asking, reply["messages"], durable))
            check(final["last_message"].text.startswith("final: invoice sent"), "resume did not finish")
            record("durable 4/4: resume (runs the call, finishes the turn)", seconds)

    unit = statistics.median(times["unit: one S3 PUT (store.write_async)"])
    durable_total = sum(statistics.median(values) for phase, values in times.items() if phase.startswith("durable"))
    print(f"{sessions} sessions, medians; S3 = moto server on loopback\n")
    print("| phase | median ms | x one S3 PUT | S3 requests |")
    print("|---|---:|---:|---|")
    for phase, values in times.items():
        median = statistics.median(values)
        counted = ", ".join(f"{count} {kind}" for kind, count in sorted(requests[phase].items()) if count) or "none"
        print(f"| {phase} | {median * 1000:.1f} | {median / unit:.2f} | {counted} |")
    print(f"| durable, all four phases | {durable_total * 1000:.1f} | {durable_total / unit:.2f} | |")


async def history_curve(sizes: list[int], repeat: int) -> None:
    """One durable round trip (run stops, pending, decide, resume) after A approvals in the session, for each A."""
    os.environ[LEDGER_ENV] = tempfile.mktemp(prefix="approval-bench-")  # noqa: S306 - a scratch file name for a benchmark
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    print(f"\nDurable round trip against the session's approval history; median of {repeat} round trips per size\n")
    print("| approvals in the session | requests | LIST | GET | PUT | LIST bytes | bytes sent | median ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    with LocalS3Server() as server:
        for size in sizes:
            root = FsspecToolResultStore(
                f"{server.bucket_url}/{uuid.uuid4().hex}", storage_options=server.storage_options()
            )
            await root.warm_up_async()
            session = root.for_session("bench", "history")
            await seed(root, session, agent, size)
            await round_trip(agent, session, "warm")  # the first look at a seeded session writes its head
            seconds, counts = [], []
            for index in range(repeat):
                server.requests.clear()
                started = time.perf_counter()
                await round_trip(agent, session, f"measured-{index}")
                seconds.append(time.perf_counter() - started)
                log = server.requests.snapshot()
                lists = [r for r in log if "list-type=2" in r.query]
                methods = Counter(r.method for r in log if "list-type=2" not in r.query)
                counts.append(
                    (
                        len(log),
                        len(lists),
                        methods["GET"],
                        methods["PUT"],
                        sum(r.bytes_sent for r in lists),
                        sum(r.bytes_sent for r in log),
                    )
                )
            requests, lists_, gets, puts, list_bytes, sent = counts[-1]
            check(len({count[:4] for count in counts}) == 1, f"request counts varied between round trips: {counts}")
            print(
                f"| {size} | {requests} | {lists_} | {gets} | {puts} | {list_bytes:,} | {sent:,} | "
                f"{statistics.median(seconds) * 1000:.1f} |"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--history", default="", help="comma-separated approval counts, e.g. 10,100,500")
    parser.add_argument("--repeat", type=int, default=5, help="round trips measured per history size")
    arguments = parser.parse_args()
    if arguments.sessions:
        asyncio.run(main(arguments.sessions))
    if arguments.history:
        asyncio.run(history_curve([int(size) for size in arguments.history.split(",")], arguments.repeat))
