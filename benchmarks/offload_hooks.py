"""
Offload hooks under load: Haystack's stock `ToolResultOffloadHook` against `OffloadHook`, writing to S3.

N concurrent `Agent.run_async` sessions on one Agent (scripted with `MockChatGenerator`), each producing K large tool
results one step after another; every result is offloaded to the session's own `FsspecToolResultStore` on S3.

- Stock: `ToolResultOffloadHook` has no `run_async`, so Haystack runs it with `asyncio.to_thread`, in asyncio's
  default thread pool (min(32, cores + 4) threads: 6 here); each write holds a thread for a whole S3 round trip.
- Ours: `OffloadHook.run_async` awaits the store's `write_async` on the event loop; writes overlap freely.
- Ours, write-behind: `OffloadHook(write_behind=True)` under after_tool and after_run; a step's writes overlap the
  session's next steps, and after_run waits for all of them before the run returns.

Ours run on each store engine given with ``--engine`` (``default``: the store built without an engine argument,
labelled with the engine it resolved to; ``fsspec``: s3fs; ``obstore``); the stock hook runs on the default engine
(it is bound by its thread pool, whatever the client).

S3 (``--server``) is moto's server or a one-node Ceph RGW, in a process of its own, behind `LatencyProxy` (in a
process of its own too) adding the service time real S3 has. The server's capacity is measured in the same run, and
the ideal wall time is the larger of K x (latency + service time) (each session's K writes are sequential) and
N x K / capacity (the server's throughput). Sessions that start together also write together, so every step's N
writes reach the server at once: write-through then takes at least about K x (latency + N / rate), the "lockstep
bound", where the rate is the server's requests per second (200 PUTs of a result's size at concurrency N, straight to
the server through raw obstore; the best of a measurement before the hooks run and one after). The table gives the
bound as a speed-up over the stock hook (the most write-through can reach in lockstep) and each wall time over it.
Requests are counted by the proxy and, on moto, cross-checked against moto's own count (RGW keeps no request log).

``--busy M`` runs M CPU-burning processes beside the whole measurement: a busy machine, as the header says.

Run from the repository root (takes about a minute)::

    PYTHONPATH=src python benchmarks/offload_hooks.py                 # N=32, K=4, 200 ms and 20 ms, moto
    PYTHONPATH=src python benchmarks/offload_hooks.py --runs 8 --results 2 --latency-ms 50 --repeat 1
    PYTHONPATH=src python benchmarks/offload_hooks.py --latency-ms 200 --engine default fsspec obstore
    PYTHONPATH=src python benchmarks/offload_hooks.py --latency-ms 200 --server rgw --busy 2

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
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

import obstore
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.hooks.tool_result_offloading import AlwaysOffload, ToolResultOffloadHook
from haystack.tools import Tool
from obstore.store import S3Store

from haystack_integrations.offload import FsspecToolResultStore, OffloadHook, offload_context
from haystack_integrations.offload.stores.obstore_io import obstore_settings
from haystack_integrations.offload.testing.relay import LatencyProxy

BUCKET = "offload-bench"
RATE_PUTS = 200  # PUTs timed to measure the server's rate for the lockstep bound
T = TypeVar("T")

# Helper processes: the proxy and the S3 server each run in a process of their own, driven over a pipe


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

    def methods(self) -> dict[str, int] | None:
        """Requests in the process's log, by HTTP method; None from a server that keeps no log (RGW)."""
        methods: dict[str, int] | None = self._ask("methods")
        return methods

    def stop(self) -> None:
        self._ask("stop")
        self._process.join(timeout=10)


def _serve_commands(connection: Connection, requests: Any, latency: Callable[[float], None] | None = None) -> None:
    # The loop both helper processes run: answer the log commands (and "latency", for the proxy) until "stop".
    while True:
        command, argument = connection.recv()
        if command == "methods":
            connection.send(dict(requests.methods()) if requests is not None else None)
            continue
        if command == "clear":
            if requests is not None:
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


def _server_process(connection: Connection, kind: str) -> None:
    """Run the S3 server in this process (moto's `LocalS3Server`, or `CephRGWServer`), until told to stop."""
    # The Ceph launcher is a test rig of ours (tests/support/), not part of the library.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from haystack_integrations.offload.testing.local_s3 import LocalS3Server
    from support.ceph_rgw import CephRGWServer

    server_class = CephRGWServer if kind == "rgw" else LocalS3Server
    with server_class(bucket=BUCKET) as server:
        connection.send(server.storage_options())
        _serve_commands(connection, getattr(server, "requests", None))  # RGW keeps no request log


class ServerControl(ChildProcess):
    """The benchmark's handle on the S3 server's process."""

    def __init__(self, kind: str) -> None:
        super().__init__(_server_process, kind, kind)
        self.kind = kind
        self.storage_options: dict[str, Any] = self.ready
        self.endpoint_url: str = self.storage_options["endpoint_url"]

    def s3_options(self, endpoint: str) -> dict[str, Any]:
        """The server's storage options, pointed at `endpoint` (the proxy, or the server itself)."""
        return {**self.storage_options, "endpoint_url": endpoint}


def _burn(started: Any) -> None:
    # A busy neighbour: one core's worth of pure-Python work, until terminated.
    started.put(os.getpid())
    while True:
        pass


def start_busy(count: int) -> list[Any]:
    """Start `count` CPU-burning processes and wait until each burns; the caller terminates them (`stop_busy`)."""
    context = multiprocessing.get_context("spawn")
    started = context.Queue()
    burners = [context.Process(target=_burn, args=(started,), name=f"busy-{i}", daemon=True) for i in range(count)]
    for burner in burners:
        burner.start()
    for _ in burners:
        started.get(timeout=60)
    return burners


def stop_busy(burners: list[Any]) -> None:
    for burner in burners:
        burner.terminate()
    for burner in burners:
        burner.join(timeout=10)


# The agent


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
    lockstep_speedup_bound: float
    over_lockstep: float
    requests_per_result: float
    puts_per_result: float


async def timed(awaitable: Awaitable[T]) -> tuple[float, T]:
    # Gathered tasks are created before the clock starts, but none runs before the first await below.
    start = time.perf_counter()
    value = await awaitable
    return time.perf_counter() - start, value


async def server_capacity(store: FsspecToolResultStore, payload: str, writes: int, repeat: int) -> tuple[float, float]:
    """
    The server's parallel capacity (requests/s) for `writes` concurrent PUTs, and one PUT's service time (s), direct.

    Other load on the machine only ever slows the server down, so the capacity is the best of `repeat` bursts; the
    service time is the median of 20 PUTs one after another.
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


async def server_rate(options: dict[str, Any], payload: bytes, concurrency: int) -> float:
    """
    The server's requests/s: `RATE_PUTS` PUTs of `payload` with `concurrency` in flight, through raw obstore.

    Straight to the server (no proxy), and with obstore's client, whose CPU per request is the least of the clients
    here, so the figure is the server's. The best of two bursts (other load only ever slows the server down), after
    one unmeasured PUT per connection.
    """
    settings = obstore_settings(options, retrying=False, attempt_timeout=None)
    store = S3Store(
        BUCKET,
        config=settings.config,  # type: ignore[arg-type]
        client_options=settings.client_options,  # type: ignore[arg-type]
        retry_config=settings.retry_config,  # type: ignore[arg-type]
    )

    async def worker(keys: Iterator[str]) -> None:
        # The workers share `keys`: each takes the next PUT as soon as its last one is answered.
        for key in keys:
            await obstore.put_async(store, key, payload, use_multipart=False)

    await asyncio.gather(*(worker(iter([f"rate/warm-{i}"])) for i in range(concurrency)))
    rates = []
    for burst in range(2):
        keys = iter([f"rate/{burst}-{i}" for i in range(RATE_PUTS)])
        wall, _ = await timed(asyncio.gather(*(worker(keys) for _ in range(concurrency))))
        rates.append(RATE_PUTS / wall)
    return max(rates)


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
    servers: tuple[ServerControl, ProxyControl],
    runs: int,
    results: int,
    repeat: int,
    label: str,
) -> tuple[float, float, float]:
    """Median wall time of `runs` concurrent sessions, and S3 requests and PUTs per offloaded result."""
    server, proxy = servers
    await run_sessions(agent, root, 2, f"{label}-warm")
    walls, per_result, puts_per_result = [], [], []
    for attempt in range(repeat):
        server.clear()
        proxy.clear()
        wall, outcomes = await timed(run_sessions(agent, root, runs, f"{label}-{attempt}"))
        offloaded = sum(offloaded_results(outcome) for outcome in outcomes)
        if offloaded != runs * results:
            raise RuntimeError(f"{label}: {offloaded} results offloaded, expected {runs * results}")
        # Counted by the proxy; moto's own count, where the server keeps one, must agree.
        methods = proxy.methods() or {}
        seen = server.methods()
        if seen is not None and seen != methods:
            raise RuntimeError(f"{label}: the server saw {seen}, the proxy forwarded {methods}")
        walls.append(wall)
        per_result.append(sum(methods.values()) / offloaded)
        puts_per_result.append(methods.get("PUT", 0) / offloaded)
    return statistics.median(walls), statistics.median(per_result), statistics.median(puts_per_result)


def engine_label(engine: str, store: FsspecToolResultStore) -> str:
    if engine != "default":
        return f"engine={engine}"
    # The engine the default resolved to (stores before "auto" have no resolved_engine: engine says it).
    return f"engine=default ({store.resolved_engine})"


def make_store(url: str, options: dict[str, Any], engine: str) -> FsspecToolResultStore:
    """The store on `engine`; ``"default"`` passes no engine argument."""
    if engine == "default":
        return FsspecToolResultStore(url, storage_options=options)
    return FsspecToolResultStore(url, storage_options=options, engine=engine)


async def benchmark(args: argparse.Namespace) -> tuple[dict[str, Any], list[Row]]:
    load_before = os.getloadavg()
    payload = ("lorem ipsum dolor sit amet " * (args.size // 27 + 1))[: args.size]
    server = ServerControl(args.server)
    endpoint = server.endpoint_url
    proxy = ProxyControl(endpoint)
    burners = start_busy(args.busy)
    try:
        direct = FsspecToolResultStore(f"s3://{BUCKET}/direct", storage_options=server.s3_options(endpoint))
        proxied = FsspecToolResultStore(f"s3://{BUCKET}/proxied", storage_options=server.s3_options(proxy.endpoint_url))
        await direct.warm_up_async()
        await proxied.warm_up_async()
        # The rate too is measured before and after the hooks run; the bound uses the best.
        rate_before = await server_rate(server.s3_options(endpoint), payload.encode(), args.runs)
        burst = max(args.runs * args.results, 128)
        # The capacity is measured before and after the hooks run, so the ideal uses its best in this run.
        capacities, services = zip(*[await server_capacity(direct, payload, burst, args.repeat)], strict=True)

        stores = {
            engine: make_store(f"s3://{BUCKET}/proxied-{engine}", server.s3_options(proxy.endpoint_url), engine)
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
                    f"`OffloadHook`, {engine_label(engine, store)}",
                    make_agent(payload, args.results, {"after_tool": [OffloadHook(policy)]}),
                    store,
                ),
                (
                    f"`OffloadHook(write_behind=True)`, {engine_label(engine, store)}",
                    make_agent(payload, args.results, {"after_tool": [behind_hook], "after_run": [behind_hook]}),
                    store,
                ),
            ]
        measured: list[tuple[int, str, tuple[float, float, float]]] = []
        for latency_ms in args.latency_ms:
            proxy.set_latency(latency_ms / 1000)
            point = (args.runs, args.results, args.repeat)
            for number, (label, agent, store) in enumerate(contenders):
                outcome = await measure_hook(agent, store, (server, proxy), *point, f"c{number}-{latency_ms}")
                measured.append((latency_ms, label, outcome))
                print(f"# {latency_ms} ms: {label}: {outcome}", file=sys.stderr, flush=True)

        after = await server_capacity(direct, payload, burst, args.repeat)
        rate_after = await server_rate(server.s3_options(endpoint), payload.encode(), args.runs)
        rate = max(rate_before, rate_after)
        capacity, service = max(*capacities, after[0]), statistics.median([*services, after[1]])
        setup = {
            "server": args.server,
            "runs": args.runs,
            "results_per_run": args.results,
            "result_chars": args.size,
            "repeat": args.repeat,
            "busy_processes": args.busy,
            "cpu_count": os.cpu_count(),
            "default_thread_pool": min(32, (os.cpu_count() or 1) + 4),
            "stock_engine": engine_label("default", proxied),
            "server_rate_rps": round(rate, 1),
            "server_rate_before_after_rps": [round(rate_before, 1), round(rate_after, 1)],
            "server_capacity_rps": round(capacity, 1),
            "server_capacity_before_after_rps": [round(capacities[0], 1), round(after[0], 1)],
            "server_service_ms": round(service * 1000, 1),
            "load_average_before_after": [load_before, os.getloadavg()],
        }
        stock_wall = {latency: wall for latency, label, (wall, _, _) in measured if label.startswith("stock")}
        rows = []
        for latency_ms, label, (wall, per_result, puts) in measured:
            latency = latency_ms / 1000
            ideal = max(args.results * (latency + service), args.runs * args.results / capacity)
            lockstep = args.results * (latency + args.runs / rate)
            setup.setdefault("ideal_s", {})[latency_ms] = round(ideal, 3)
            setup.setdefault("lockstep_s", {})[latency_ms] = round(lockstep, 3)
            rows.append(
                Row(
                    latency_ms=latency_ms,
                    hook=label,
                    wall_s=round(wall, 3),
                    speedup=round(stock_wall[latency_ms] / wall, 2),
                    over_ideal=round(wall / ideal, 2),
                    lockstep_speedup_bound=round(stock_wall[latency_ms] / lockstep, 2),
                    over_lockstep=round(wall / lockstep, 2),
                    requests_per_result=round(per_result, 2),
                    puts_per_result=round(puts, 2),
                )
            )
        return setup, rows
    finally:
        stop_busy(burners)
        proxy.stop()
        server.stop()


def table(setup: dict[str, Any], rows: list[Row]) -> str:
    before, after = setup["load_average_before_after"]
    server = "moto" if setup["server"] == "moto" else "Ceph RGW"
    busy = (
        f"BUSY MACHINE, {setup['busy_processes']} CPU-burning processes running beside the whole measurement; "
        if setup["busy_processes"]
        else ""
    )
    load = f"before {', '.join(f'{x:.2f}' for x in before)}, after {', '.join(f'{x:.2f}' for x in after)}"
    header = [
        f"{busy}{server} S3",
        f"N={setup['runs']} sessions x K={setup['results_per_run']} results of {setup['result_chars']:,} chars",
        f"server rate {setup['server_rate_rps']} req/s ({RATE_PUTS} PUTs at concurrency N, raw obstore; before/after: "
        f"{setup['server_rate_before_after_rps']})",
        f"capacity {setup['server_capacity_rps']} req/s (before/after: {setup['server_capacity_before_after_rps']}), "
        f"service time {setup['server_service_ms']} ms",
        f"stock hook on {setup['stock_engine']}",
        f"default thread pool {setup['default_thread_pool']}",
        f"{setup['cpu_count']} CPUs",
        f"median of {setup['repeat']}",
        f"load average (1, 5, 15 min) {load}",
    ]
    lines = [
        "; ".join(header) + ".",
        "",
        "| added latency | hook | wall time | speed-up over stock | lockstep bound (speed-up) | / lockstep | / ideal "
        "| S3 requests per result |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        stock = row.hook.startswith("stock")
        bound = "-" if stock else f"{row.lockstep_speedup_bound:.1f}x"
        lines.append(
            f"| {row.latency_ms} ms | {row.hook} | {row.wall_s:.2f} s | {row.speedup:.1f}x | {bound} "
            f"| {row.over_lockstep:.2f}x | {row.over_ideal:.2f}x | {row.requests_per_result:.2f} |"
        )
    lines += [
        "",
        "Ideal: "
        + "; ".join(f"{latency} ms {ideal:.2f} s" for latency, ideal in setup["ideal_s"].items())
        + ". Lockstep bound K x (latency + N / rate): "
        + "; ".join(f"{latency} ms {lockstep:.2f} s" for latency, lockstep in setup["lockstep_s"].items())
        + " (about the least wall time of write-through when every step's N writes arrive together; as a speed-up: the "
        "stock hook's wall time over it; write-behind is not bound by it).",
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
        "--server", choices=["moto", "rgw"], default="moto", help="the S3 server (rgw: a Ceph RGW; default: moto)"
    )
    parser.add_argument(
        "--engine",
        "--engines",
        dest="engines",
        nargs="+",
        default=["default"],
        choices=["default", "fsspec", "obstore"],
        help="store engines for ours; default: the store built without an engine argument (default: %(default)s)",
    )
    parser.add_argument(
        "--busy", type=int, default=0, metavar="M", help="CPU-burning processes to run beside the measurement"
    )
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    if args.busy < 0:
        parser.error("--busy takes a count of processes, 0 or more")
    setup, rows = asyncio.run(benchmark(args))
    print(table(setup, rows))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"setup": setup, "rows": [asdict(row) for row in rows]}, file, indent=2)


if __name__ == "__main__":
    main()
