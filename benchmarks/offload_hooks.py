"""
Offload hooks under load: Haystack's stock `ToolResultOffloadHook` against `OffloadHook`, writing to S3.

N concurrent `Agent.run_async` sessions on one Agent (scripted with `MockChatGenerator`), each producing K large tool
results one step after another; every result is offloaded to the session's own `FsspecToolResultStore` on S3.

- Stock: `ToolResultOffloadHook` has no `run_async`, so Haystack runs it with `asyncio.to_thread`, in asyncio's
  default thread pool (min(32, cores + 4) threads: 6 here); each write holds a thread for a whole S3 round trip.
- Ours: `OffloadHook.run_async` awaits the store's `write_async` on the event loop; writes overlap freely.
- Ours, write-behind: `OffloadHook(write_behind=True)` under after_tool and after_run; a step's writes overlap the
  session's next steps, and after_run waits for all of them before the run returns.

Ours run on each store engine given with ``--engines`` (``fsspec``: s3fs, the default; ``obstore``: the fast engine);
the stock hook runs on the default engine (it is bound by its thread pool, whatever the client).

S3 is moto's server in its own process, behind `LatencyProxy` (in a process of its own too) adding the service time
real S3 has. moto alone serves only a couple of hundred requests a second here, so its capacity is measured in the
same run, and the ideal wall time is the larger of K x (latency + service time) (each session's K writes are
sequential) and N x K / capacity (moto's throughput). Sessions that start together also write together: if every
step's N writes queued at moto at once, the wall time would be K x (latency + service time + N / capacity), reported as
the "lockstep" estimate. Requests are counted by moto itself and cross-checked against what the proxy forwarded.

Run from the repository root (takes about a minute)::

    PYTHONPATH=src python benchmarks/offload_hooks.py                 # N=32, K=4, 200 ms and 20 ms
    PYTHONPATH=src python benchmarks/offload_hooks.py --runs 8 --results 2 --latency-ms 50 --repeat 1
    PYTHONPATH=src python benchmarks/offload_hooks.py --latency-ms 200 --engines fsspec obstore

Prints a Markdown table (the one in benchmarks/README.md) and, with ``--json PATH``, writes the raw numbers.
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.hooks.tool_result_offloading import AlwaysOffload, ToolResultOffloadHook
from haystack.tools import Tool

from haystack_integrations.offload import FsspecToolResultStore, OffloadHook, offload_context
from haystack_integrations.offload.testing.latency_proxy import LatencyProxy

BUCKET = "offload-bench"
T = TypeVar("T")

# Helper processes: the proxy and moto each run in a process of their own, driven over a pipe


class ChildProcess:
    """A helper process obeying ``(command, argument)`` messages; it sends one value when ready, one per command."""

    def __init__(self, target: Any, name: str, *args: Any) -> None:
        self._connection, child = multiprocessing.Pipe()
        self._process = multiprocessing.get_context("spawn").Process(
            target=target, args=(child, *args), name=name, daemon=True
        )
        self._process.start()
        self.ready: Any = self._connection.recv()

    def _ask(self, command: str, argument: Any = None) -> Any:
        self._connection.send((command, argument))
        return self._connection.recv()

    def clear(self) -> None:
        """Empty the process's request log."""
        self._ask("clear")

    def methods(self) -> dict[str, int]:
        """Requests in the process's log, by HTTP method."""
        methods: dict[str, int] = self._ask("methods")
        return methods

    def stop(self) -> None:
        self._ask("stop")
        self._process.join(timeout=10)


def _serve_commands(connection: Connection, requests: Any, latency: Callable[[float], None] | None = None) -> None:
    # The loop both helper processes run: answer the log commands (and "latency", for the proxy) until "stop".
    while True:
        command, argument = connection.recv()
        if command == "methods":
            connection.send(dict(requests.methods()))
            continue
        if command == "clear":
            requests.clear()
        elif command == "latency" and latency is not None:
            latency(argument)
        elif command == "stop":
            connection.send(None)
            return
        connection.send(None)


def _proxy_process(connection: Connection, upstream: str) -> None:
    """Run a LatencyProxy in this process and obey commands from the benchmark over `connection`."""
    with LatencyProxy(upstream) as proxy:
        connection.send(proxy.endpoint_url)

        def set_latency(seconds: float) -> None:
            proxy.latency = seconds

        _serve_commands(connection, proxy.requests, set_latency)


class ProxyControl(ChildProcess):
    """The benchmark's handle on the proxy process."""

    def __init__(self, upstream: str) -> None:
        super().__init__(_proxy_process, "latency-proxy", upstream)
        self.endpoint_url: str = self.ready

    def set_latency(self, seconds: float) -> None:
        self._ask("latency", seconds)


def _moto_process(connection: Connection) -> None:
    """Run moto's S3 server (this library's LocalS3Server) in this process, until told to stop."""
    from haystack_integrations.offload.testing.local_s3 import LocalS3Server

    with LocalS3Server(bucket=BUCKET) as server:
        connection.send(server.storage_options())
        _serve_commands(connection, server.requests)


class MotoControl(ChildProcess):
    """The benchmark's handle on the moto process."""

    def __init__(self) -> None:
        super().__init__(_moto_process, "moto")
        self.storage_options: dict[str, Any] = self.ready
        self.endpoint_url: str = self.storage_options["endpoint_url"]

    def s3_options(self, endpoint: str) -> dict[str, Any]:
        """The server's storage options, pointed at `endpoint` (the proxy, or moto itself)."""
        return {**self.storage_options, "endpoint_url": endpoint}


# The agent


def make_agent(payload: str, results: int, hooks: dict[str, list[Any]]) -> Agent:
    def fetch(page: int) -> str:
        return f"page {page}\n{payload}"

    tool = Tool(
        name="fetch",
        description="Fetch a large page.",
        parameters={"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]},
        function=fetch,
    )

    def script(messages: list[ChatMessage]) -> ChatMessage:
        # Decided from the conversation alone, so concurrent runs do not share a script position.
        user = max(i for i, message in enumerate(messages) if message.is_from(ChatRole.USER))
        done = sum(1 for message in messages[user:] if message.tool_call_result is not None)
        if done >= results:
            return ChatMessage.from_assistant("done")
        return ChatMessage.from_assistant(
            tool_calls=[ToolCall(tool_name="fetch", arguments={"page": done}, id=f"call_{done}")]
        )

    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=[tool],
        hooks=hooks,  # type: ignore[arg-type]
        max_agent_steps=results + 2,
    )
    agent.warm_up()
    return agent


def offloaded_results(result: dict[str, Any]) -> int:
    return sum(1 for message in result["messages"] if message.meta.get("tool_result_offloaded"))


# Measurements


@dataclass
class Row:
    latency_ms: int
    hook: str
    wall_s: float
    speedup: float
    over_ideal: float
    requests_per_result: float
    puts_per_result: float


async def timed(awaitable: Awaitable[T]) -> tuple[float, T]:
    # Gathered tasks are created before the clock starts, but none runs before the first await below.
    start = time.perf_counter()
    value = await awaitable
    return time.perf_counter() - start, value


async def moto_capacity(store: FsspecToolResultStore, payload: str, writes: int, repeat: int) -> tuple[float, float]:
    """
    moto's parallel capacity (requests/s) for `writes` concurrent PUTs, and one PUT's service time (s), both direct.

    Other load on the machine only ever slows moto down, so the capacity is the best of `repeat` bursts; the service
    time is the median of 20 PUTs one after another.
    """
    session = store.for_session("capacity", "direct")
    await session.write_async(key="warm.txt", content=payload)
    throughputs = []
    for _ in range(repeat):
        wall, _ = await timed(
            asyncio.gather(*(session.write_async(key=f"{i}.txt", content=payload) for i in range(writes)))
        )
        throughputs.append(writes / wall)
    singles = []
    for i in range(20):
        wall, _ = await timed(session.write_async(key=f"single{i}.txt", content=payload))
        singles.append(wall)
    return max(throughputs), statistics.median(singles)


async def run_sessions(agent: Agent, root: FsspecToolResultStore, runs: int, label: str) -> list[dict[str, Any]]:
    return list(
        await asyncio.gather(
            *(
                agent.run_async(
                    [ChatMessage.from_user("fetch the pages")],
                    hook_context=offload_context(root.for_session("bench", f"{label}-{i}")),
                )
                for i in range(runs)
            )
        )
    )


async def measure_hook(
    agent: Agent,
    root: FsspecToolResultStore,
    servers: tuple[MotoControl, ProxyControl],
    runs: int,
    results: int,
    repeat: int,
    label: str,
) -> tuple[float, float, float]:
    """Median wall time of `runs` concurrent sessions, and S3 requests and PUTs per offloaded result."""
    moto, proxy = servers
    await run_sessions(agent, root, 2, f"{label}-warm")
    walls, per_result, puts_per_result = [], [], []
    for attempt in range(repeat):
        moto.clear()
        proxy.clear()
        wall, outcomes = await timed(run_sessions(agent, root, runs, f"{label}-{attempt}"))
        offloaded = sum(offloaded_results(outcome) for outcome in outcomes)
        if offloaded != runs * results:
            raise RuntimeError(f"{label}: {offloaded} results offloaded, expected {runs * results}")
        # Counted by moto itself; the proxy's count of what it forwarded must agree.
        methods = moto.methods()
        if methods != proxy.methods():
            raise RuntimeError(f"{label}: moto saw {methods}, the proxy forwarded {proxy.methods()}")
        walls.append(wall)
        per_result.append(sum(methods.values()) / offloaded)
        puts_per_result.append(methods.get("PUT", 0) / offloaded)
    return statistics.median(walls), statistics.median(per_result), statistics.median(puts_per_result)


async def benchmark(args: argparse.Namespace) -> tuple[dict[str, Any], list[Row]]:
    load_before = os.getloadavg()
    payload = ("lorem ipsum dolor sit amet " * (args.size // 27 + 1))[: args.size]
    moto = MotoControl()
    endpoint = moto.endpoint_url
    proxy = ProxyControl(endpoint)
    try:
        direct = FsspecToolResultStore(f"s3://{BUCKET}/direct", storage_options=moto.s3_options(endpoint))
        proxied = FsspecToolResultStore(f"s3://{BUCKET}/proxied", storage_options=moto.s3_options(proxy.endpoint_url))
        await direct.warm_up_async()
        await proxied.warm_up_async()
        burst = max(args.runs * args.results, 128)
        # moto's capacity is measured before and after the hooks run, so the ideal uses its best in this run.
        capacities, services = zip(*[await moto_capacity(direct, payload, burst, args.repeat)], strict=True)

        stores = {
            engine: FsspecToolResultStore(
                f"s3://{BUCKET}/proxied-{engine}", storage_options=moto.s3_options(proxy.endpoint_url), engine=engine
            )
            for engine in args.engines
        }
        for store in stores.values():
            await store.warm_up_async()
        policy = {"fetch": AlwaysOffload()}
        stock_hook = ToolResultOffloadHook(store=proxied, offload_strategies=policy)
        # Write-behind: the same hook under after_run waits for the run's writes before the run returns.
        behind_hook = OffloadHook(policy, write_behind=True)
        contenders: list[tuple[str, Agent, FsspecToolResultStore]] = [
            ("stock `ToolResultOffloadHook`", make_agent(payload, args.results, {"after_tool": [stock_hook]}), proxied)
        ]
        for engine, store in stores.items():
            contenders += [
                (
                    f"`OffloadHook`, engine={engine}",
                    make_agent(payload, args.results, {"after_tool": [OffloadHook(policy)]}),
                    store,
                ),
                (
                    f"`OffloadHook(write_behind=True)`, engine={engine}",
                    make_agent(payload, args.results, {"after_tool": [behind_hook], "after_run": [behind_hook]}),
                    store,
                ),
            ]
        measured: list[tuple[int, str, tuple[float, float, float]]] = []
        for latency_ms in args.latency_ms:
            proxy.set_latency(latency_ms / 1000)
            point = (args.runs, args.results, args.repeat)
            for number, (label, agent, store) in enumerate(contenders):
                outcome = await measure_hook(agent, store, (moto, proxy), *point, f"c{number}-{latency_ms}")
                measured.append((latency_ms, label, outcome))
                print(f"# {latency_ms} ms: {label}: {outcome}", file=sys.stderr, flush=True)

        after = await moto_capacity(direct, payload, burst, args.repeat)
        capacity, service = max(*capacities, after[0]), statistics.median([*services, after[1]])
        setup = {
            "runs": args.runs,
            "results_per_run": args.results,
            "result_chars": args.size,
            "repeat": args.repeat,
            "cpu_count": os.cpu_count(),
            "default_thread_pool": min(32, (os.cpu_count() or 1) + 4),
            "moto_capacity_rps": round(capacity, 1),
            "moto_capacity_before_after_rps": [round(capacities[0], 1), round(after[0], 1)],
            "moto_service_ms": round(service * 1000, 1),
            "load_average_before_after": [load_before, os.getloadavg()],
        }
        stock_wall = {latency: wall for latency, label, (wall, _, _) in measured if label.startswith("stock")}
        rows = []
        for latency_ms, label, (wall, per_result, puts) in measured:
            latency = latency_ms / 1000
            ideal = max(args.results * (latency + service), args.runs * args.results / capacity)
            setup.setdefault("ideal_s", {})[latency_ms] = round(ideal, 3)
            setup.setdefault("lockstep_s", {})[latency_ms] = round(
                args.results * (latency + service + args.runs / capacity), 3
            )
            rows.append(
                Row(
                    latency_ms=latency_ms,
                    hook=label,
                    wall_s=round(wall, 3),
                    speedup=round(stock_wall[latency_ms] / wall, 2),
                    over_ideal=round(wall / ideal, 2),
                    requests_per_result=round(per_result, 2),
                    puts_per_result=round(puts, 2),
                )
            )
        return setup, rows
    finally:
        proxy.stop()
        moto.stop()


def table(setup: dict[str, Any], rows: list[Row]) -> str:
    before, after = setup["load_average_before_after"]
    lines = [
        f"N={setup['runs']} sessions x K={setup['results_per_run']} results of {setup['result_chars']:,} chars; "
        f"moto capacity {setup['moto_capacity_rps']} req/s (before/after: "
        f"{setup['moto_capacity_before_after_rps']}), service time {setup['moto_service_ms']} ms; "
        f"default thread pool {setup['default_thread_pool']}; median of {setup['repeat']}; load average (1, 5, 15 "
        f"min) before {', '.join(f'{x:.2f}' for x in before)}, after {', '.join(f'{x:.2f}' for x in after)}.",
        "",
        "| added latency | hook | wall time | speed-up over stock | / ideal | S3 requests per result |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.latency_ms} ms | {row.hook} | {row.wall_s:.2f} s | {row.speedup:.1f}x | {row.over_ideal:.2f}x "
            f"| {row.requests_per_result:.2f} |"
        )
    lines += [
        "",
        "Ideal: "
        + "; ".join(f"{latency} ms {ideal:.2f} s" for latency, ideal in setup["ideal_s"].items())
        + ". Lockstep estimate: "
        + "; ".join(f"{latency} ms {lockstep:.2f} s" for latency, lockstep in setup["lockstep_s"].items())
        + ".",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=32, help="concurrent sessions, N (default: %(default)s)")
    parser.add_argument("--results", type=int, default=4, help="tool results per session, K (default: %(default)s)")
    parser.add_argument("--size", type=int, default=50_000, help="characters per result (default: %(default)s)")
    parser.add_argument("--latency-ms", type=int, nargs="+", default=[200, 20], help="added latencies to test")
    parser.add_argument("--repeat", type=int, default=3, help="measurements per point; the median is reported")
    parser.add_argument(
        "--engines", nargs="+", default=["fsspec"], choices=["fsspec", "obstore"], help="store engines for ours"
    )
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    setup, rows = asyncio.run(benchmark(args))
    print(table(setup, rows))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"setup": setup, "rows": [asdict(row) for row in rows]}, file, indent=2)


if __name__ == "__main__":
    main()
