"""
Soak: many concurrent sessions on one Agent offloading to S3 (moto's server), without and with injected faults.

N sessions run at once on one Agent (scripted with `MockChatGenerator`), each for K steps; every step's tool result is
offloaded by `OffloadHook` to the session's own `FsspecToolResultStore`. Every S3 request goes through `FaultProxy`
(`haystack_integrations.offload.testing.faults`), which fails none of them, or a share of them (500, 503 SlowDown,
resets before and after the server handled the request, answers withheld until the client times out).

Scenarios, each in a fresh client process (so its peak memory is its own), against one moto process and one proxy
process:

- ``baseline``: no faults, the store's defaults (the reference for the ratios);
- ``quota+retention``: no faults, with a per-session and per-tenant quota and a retention set (their cost);
- ``faults``: the same as baseline with ``--fault-rate`` of the requests failing;
- ``baseline (again)``: the baseline once more, last, to show how much the machine (and moto's growing bucket) drifted
  during the run. Ratios are against the mean of the two baselines.

Reported per scenario: offloads per second, p50/p95/p99 of one offload (the store's ``write_async``, retries and quota
checks included), the client's peak RSS, errors (runs that raised, results left in the conversation because a write
gave up), results lost (neither in the conversation nor readable byte for byte through their reference: every result's
digest is checked, reading straight from moto), retries, and S3 requests per offload as moto counted them.

Run from the repository root (about eight minutes on two cores)::

    PYTHONPATH=src python benchmarks/soak.py                                  # 200 sessions x 20 steps, 10% faults
    PYTHONPATH=src python benchmarks/soak.py --sessions 20 --steps 5          # a quick look

Prints a Markdown table (the one in benchmarks/README.md) and, with ``--json PATH``, writes the raw numbers.
"""

import argparse
import asyncio
import hashlib
import json
import multiprocessing
import os
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

BUCKET = "offload-soak"
TENANTS = 10
FAILING = ["500", "503", "reset", "reset-after", "timeout"]

# Server processes


def _moto_process(connection: Connection) -> None:
    from haystack_integrations.offload.testing.local_s3 import LocalS3Server

    with LocalS3Server(bucket=BUCKET) as server:
        connection.send(server.storage_options())
        while (command := connection.recv()) != "stop":
            if command == "methods":
                connection.send(dict(server.requests.methods()))
            elif command == "clear":
                server.requests.clear()
                connection.send(None)
        connection.send(None)


def _proxy_process(connection: Connection, upstream: str, hold_seconds: float) -> None:
    from haystack_integrations.offload.testing.faults import FaultPlan, FaultProxy

    with FaultProxy(upstream, hold_seconds=hold_seconds) as proxy:
        connection.send(proxy.endpoint_url)
        while (command := connection.recv())[0] != "stop":
            name, argument = command
            if name == "plan":
                proxy.plan = FaultPlan(rate=argument, kinds=FAILING, seed=7) if argument else FaultPlan()
                proxy.faults.clear()
                proxy.requests.clear()
                connection.send(None)
            elif name == "report":
                requests = proxy.requests.snapshot()
                connection.send(
                    {
                        "requests": len(requests),
                        "puts": sum(request.method == "PUT" for request in requests),
                        "lists": sum("list-type" in request.target for request in requests),
                        "faults": {kind.value: count for kind, count in proxy.faults.counts().items()},
                    }
                )
        connection.send(None)


class Process:
    """A child process obeying commands over a pipe."""

    def __init__(self, target: Any, *args: Any) -> None:
        self._connection, child = multiprocessing.Pipe()
        self._process = multiprocessing.get_context("spawn").Process(target=target, args=(child, *args), daemon=True)
        self._process.start()
        self.hello = self._connection.recv()

    def ask(self, command: Any) -> Any:
        self._connection.send(command)
        return self._connection.recv()

    def stop(self, command: Any) -> None:
        self.ask(command)
        self._process.join(timeout=10)


# The client: one scenario in a process of its own


@dataclass
class Scenario:
    name: str
    fault_rate: float = 0.0
    quota: bool = False


@dataclass
class Result:
    scenario: str
    offloads: int
    wall_s: float
    offloads_per_s: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    peak_rss_mb: float
    failed_runs: int
    left_in_context: int
    lost: int
    retries: int
    gave_up: int
    s3_requests: dict[str, int] = field(default_factory=dict)
    proxy: dict[str, Any] = field(default_factory=dict)


def page(query: str) -> str:
    seal = hashlib.sha256(query.encode()).hexdigest()[:16]
    return "\n".join(f"{query} line {i} {seal} " + "lorem ipsum dolor " * 3 for i in range(60))  # about 5 KB


def digest(content: str | bytes) -> str:
    return hashlib.sha256(content.encode() if isinstance(content, str) else content).hexdigest()


def _client_process(connection: Connection, scenario: Scenario, options: dict[str, Any], args: dict[str, Any]) -> None:
    result = asyncio.run(_client(scenario, options, args))
    connection.send(result)


async def _client(scenario: Scenario, s3_options: dict[str, Any], args: dict[str, Any]) -> Result:
    from haystack.components.agents import Agent
    from haystack.components.generators.chat import MockChatGenerator
    from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
    from haystack.hooks.tool_result_offloading import AlwaysOffload
    from haystack.tools import Tool

    from haystack_integrations.offload import (
        FsspecToolResultStore,
        OffloadHook,
        Quota,
        Retention,
        RetryPolicy,
        offload_context,
    )

    latencies: list[float] = []

    class TimedStore(FsspecToolResultStore):
        """The store, timing each offload as the hook sees it (retries and quota checks included)."""

        async def write_async(self, *, key: str, content: str | bytes, tool_name: str | None = None) -> str:
            started = time.perf_counter()
            try:
                return await super().write_async(key=key, content=content, tool_name=tool_name)
            finally:
                latencies.append(time.perf_counter() - started)

    steps, sessions = args["steps"], args["sessions"]
    prefix = f"s3://{BUCKET}/{scenario.name}-{os.getpid()}"
    proxied = {
        **s3_options,
        "endpoint_url": args["proxy_url"],
        # 200 sessions at once queue at moto; 5 s leaves room for that queue, so timeouts are the injected ones.
        "config_kwargs": {"read_timeout": 5, "connect_timeout": 5},
    }
    extra: dict[str, Any] = {"retry": RetryPolicy(attempt_timeout=8.0)}
    if scenario.quota:
        # Limits a deployment might set; a worker lists a scope again after admitting 10% of a limit (or after 60 s).
        extra["quota"] = Quota(session_results=1000, session_bytes=64 * 2**20, tenant_bytes=2 * 2**30)
        extra["retention"] = Retention(ttl=timedelta(days=7))
    root = TimedStore(prefix, storage_options=proxied, **extra)
    direct = FsspecToolResultStore(prefix, storage_options=s3_options)
    await root.for_session("warm", "up").list_async()

    tool = Tool(
        name="fetch",
        description="Fetch a page.",
        parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        function=page,
    )

    def script(messages: list[ChatMessage]) -> ChatMessage:
        user = max(i for i, message in enumerate(messages) if message.is_from(ChatRole.USER))
        label = messages[user].text or ""
        done = sum(1 for message in messages[user:] if message.tool_call_result is not None)
        if done >= steps:
            return ChatMessage.from_assistant("done")
        query = f"{label} step {done}"
        return ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="fetch", arguments={"query": query})])

    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=[tool],
        hooks={"after_tool": [OffloadHook({"fetch": AlwaysOffload()})]},
        max_agent_steps=steps + 2,
    )
    agent.warm_up()
    labels = [(f"tenant-{s % TENANTS}", f"chat-{s}") for s in range(sessions)]

    async def run(tenant: str, session: str) -> Any:
        store = root.for_session(tenant, session)
        return await agent.run_async(
            [ChatMessage.from_user(f"{tenant}/{session}")], hook_context=offload_context(store)
        )

    started = time.perf_counter()
    outcomes = await asyncio.gather(*(run(tenant, session) for tenant, session in labels), return_exceptions=True)
    wall = time.perf_counter() - started

    failed_runs = sum(isinstance(outcome, BaseException) for outcome in outcomes)
    left, lost = 0, 0
    reads = asyncio.Semaphore(64)

    async def check(tenant: str, session: str, outcome: Any) -> tuple[int, int]:
        if isinstance(outcome, BaseException):
            return 0, steps
        store = direct.for_session(tenant, session)
        expected = {digest(page(f"{tenant}/{session} step {step}")) for step in range(steps)}
        seen, kept = set(), 0
        for message in outcome["messages"]:
            if message.tool_call_result is None:
                continue
            references = message.meta.get("tool_result_offloaded")
            if references:
                async with reads:
                    try:
                        seen.add(digest(await store.read_async(references[0])))
                    except Exception:  # noqa: S112 - a reference that cannot be read is a lost result, counted below
                        continue
            else:
                kept += 1
                seen.add(digest(message.tool_call_result.result))
        return kept, len(expected - seen)

    checked = await asyncio.gather(
        *(check(tenant, session, outcome) for (tenant, session), outcome in zip(labels, outcomes, strict=True))
    )
    left, lost = sum(kept for kept, _ in checked), sum(missing for _, missing in checked)
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    stats = root.retry_stats.as_dict()
    return Result(
        scenario=scenario.name,
        offloads=len(latencies),
        wall_s=round(wall, 2),
        offloads_per_s=round(len(latencies) / wall, 1),
        p50_ms=round(quantiles[49] * 1000, 1),
        p95_ms=round(quantiles[94] * 1000, 1),
        p99_ms=round(quantiles[98] * 1000, 1),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        failed_runs=failed_runs,
        left_in_context=left,
        lost=lost,
        retries=stats["retries"],
        gave_up=stats["gave_up"],
    )


def run_scenario(scenario: Scenario, moto: Process, proxy: Process, args: argparse.Namespace) -> Result:
    proxy.ask(("plan", scenario.fault_rate))
    moto.ask("clear")
    connection, child = multiprocessing.Pipe()
    client_args = {"sessions": args.sessions, "steps": args.steps, "proxy_url": proxy.hello}
    process = multiprocessing.get_context("spawn").Process(
        target=_client_process, args=(child, scenario, moto.hello, client_args), daemon=True
    )
    process.start()
    result: Result = connection.recv()
    process.join(timeout=30)
    # What the soak's clients sent, and what moto handled (the verification reads went straight to moto).
    result.proxy = proxy.ask(("report", None))
    result.s3_requests = moto.ask("methods")
    return result


def table(setup: dict[str, Any], results: list[Result]) -> str:
    baselines = [result.offloads_per_s for result in results if result.scenario.startswith("baseline")]
    base = statistics.mean(baselines)
    lines = [
        f"{setup['sessions']} sessions x {setup['steps']} steps on one Agent ({setup['offloads']} offloads of ~5 KB "
        f"per scenario), {TENANTS} tenants; moto server and fault proxy in their own processes; {setup['cpus']} CPUs.",
        "",
        "| scenario | offloads/s | vs baseline | p50 | p95 | p99 | peak RSS | failed runs | left in context "
        "| lost | retries (gave up) | injected faults | S3 PUT / LIST per offload |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        faults = sum(result.proxy.get("faults", {}).values())
        share = f"{faults} of {result.proxy.get('requests', 0)}" if faults else "0"
        # PUTs moto stored (a retried write stores again), LISTs the clients sent (quota checks; one warm-up).
        puts = result.s3_requests.get("PUT", 0) / max(result.offloads, 1)
        lists = result.proxy.get("lists", 0) / max(result.offloads, 1)
        lines.append(
            f"| {result.scenario} | {result.offloads_per_s:,.0f} | {result.offloads_per_s / base:.2f}x "
            f"| {result.p50_ms:.0f} ms | {result.p95_ms:.0f} ms | {result.p99_ms:.0f} ms | {result.peak_rss_mb:.0f} MB "
            f"| {result.failed_runs} | {result.left_in_context} | {result.lost} | {result.retries} ({result.gave_up}) "
            f"| {share} | {puts:.2f} / {lists:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=200, help="concurrent sessions (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=20, help="steps (offloads) per session (default: %(default)s)")
    parser.add_argument("--fault-rate", type=float, default=0.1, help="share of failing requests (default: 0.1)")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    scenarios = [
        Scenario("baseline"),
        Scenario("quota+retention", quota=True),
        Scenario(f"{args.fault_rate:.0%} faults", fault_rate=args.fault_rate),
        Scenario("baseline (again)"),
    ]
    moto = Process(_moto_process)
    proxy = Process(_proxy_process, moto.hello["endpoint_url"], 30.0)
    try:
        results = []
        for scenario in scenarios:
            result = run_scenario(scenario, moto, proxy, args)
            print(f"# {json.dumps(asdict(result))}", file=sys.stderr, flush=True)
            results.append(result)
    finally:
        proxy.stop(("stop", None))
        moto.stop("stop")
    setup = {
        "sessions": args.sessions,
        "steps": args.steps,
        "offloads": args.sessions * args.steps,
        "fault_rate": args.fault_rate,
        "cpus": os.cpu_count(),
    }
    print(table(setup, results))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"setup": setup, "results": [asdict(result) for result in results]}, file, indent=2)


if __name__ == "__main__":
    main()
