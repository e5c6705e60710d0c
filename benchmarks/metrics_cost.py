"""
CPU per offloaded result with the library's metrics on (SDK MeterProvider + PrometheusMetricReader) against off.

Each variant is a worker process of its own (a MeterProvider is set once per process), pinned with the other to one
CPU, running `OffloadHook` in concurrent `Agent.run_async` sessions on one store; the two take turns batch by batch,
in alternating order, over fresh pairs, and the median pair's ratio of median CPU per result is reported. Run from
the repository root (a few minutes)::

    PYTHONPATH=src python benchmarks/metrics_cost.py --backends memory local s3 --control
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import IO, Any

import prometheus_client
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading import AlwaysOffload
from local_disk_cpu import make_agent
from prometheus_client.parser import text_string_to_metric_families

from haystack_integrations.offload import FsspecToolResultStore, OffloadHook, offload_context
from haystack_integrations.offload.testing.local_s3 import local_s3_process

VARIANTS = ("off", "on")
CONTROL = ("off", "off")  # the same variant twice: how far apart two processes measure with nothing changed
# Counters a scrape of the "on" worker shows per offloaded result: proof that the metrics really ran.
COUNTED = {"offload_results": "results", "offload_storage_requests": "storage requests"}


def install_metrics(variant: str) -> None:
    """Set the SDK's MeterProvider with a Prometheus reader ("on"), or leave the API's no-ops in place ("off")."""
    if variant != "on":
        return
    # Imported by the "on" worker only: the "off" worker runs with the API alone, as an application without an SDK.
    from opentelemetry import metrics
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider

    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))


def counted_per_result(results: int) -> dict[str, float]:
    """The `COUNTED` counters of a scrape of this process, per offloaded result (zero without a provider)."""
    totals = dict.fromkeys(COUNTED.values(), 0.0)
    for family in text_string_to_metric_families(prometheus_client.generate_latest().decode()):
        if family.name in COUNTED:
            totals[COUNTED[family.name]] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return {name: total / results for name, total in totals.items()}


class Worker:
    """One variant's agent and store, in this process: batches of concurrent runs, timed in CPU."""

    def __init__(self, args: argparse.Namespace, target: dict[str, Any]) -> None:
        payload = ("lorem ipsum dolor sit amet " * (args.size // 27 + 1))[: args.size]
        self.agent = make_agent(payload, args.results, {"after_tool": [OffloadHook({"fetch": AlwaysOffload()})]})
        self.store = FsspecToolResultStore(target["url"], storage_options=target.get("storage_options"))
        self.runs, self.results = args.runs, args.results
        self.offloaded = 0
        self.loop = asyncio.new_event_loop()  # one loop for every batch: an S3 client is made once

    def batch(self) -> float:
        """CPU seconds per result of one batch of concurrent runs."""
        before = time.process_time()
        outcomes = self.loop.run_until_complete(self._runs(uuid.uuid4().hex[:8]))
        spent = time.process_time() - before
        offloaded = sum(1 for o in outcomes for m in o["messages"] if m.meta.get("tool_result_offloaded"))
        if offloaded != self.runs * self.results:
            raise RuntimeError(f"{offloaded} results offloaded, expected {self.runs * self.results}")
        self.offloaded += offloaded
        return spent / offloaded

    async def _runs(self, label: str) -> list[dict[str, Any]]:
        sessions = [offload_context(self.store.for_session("bench", f"{label}-{i}")) for i in range(self.runs)]
        runs = (self.agent.run_async([ChatMessage.from_user("fetch")], hook_context=s) for s in sessions)
        return list(await asyncio.gather(*runs))


def serve(args: argparse.Namespace) -> None:
    """The worker's loop: one JSON line per command read from standard input ("batch", "counted")."""
    # Both workers on one CPU: they take turns anyway, and neither gets a quieter core than the other.
    os.sched_setaffinity(0, {args.cpu})
    install_metrics(args.worker)
    worker = Worker(args, json.loads(args.target))
    for _ in range(args.warm_up):
        worker.batch()
    print(json.dumps("ready"), flush=True)
    for command in sys.stdin:
        answer = worker.batch() if command.strip() == "batch" else counted_per_result(worker.offloaded)
        print(json.dumps(answer), flush=True)


class WorkerProcess:
    """The benchmark's handle on one variant's worker process, driven over its standard input and output."""

    def __init__(self, args: argparse.Namespace, variant: str, target: dict[str, Any]) -> None:
        settings = ["--runs", str(args.runs), "--results", str(args.results), "--size", str(args.size)]
        settings += ["--cpu", str(args.cpu)]
        command = [__file__, "--worker", variant, "--target", json.dumps(target), "--warm-up", str(args.warm_up)]
        self.process = subprocess.Popen(  # noqa: S603 - this script again, with arguments built here
            [sys.executable, *command, *settings], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.ask(None)  # wait for its warm-up

    def ask(self, command: str | None) -> Any:
        stdin, stdout = self._pipes()
        if command is not None:
            stdin.write(command + "\n")
            stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the worker exited with code {self.process.wait()}")
        return json.loads(line)

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        if self.process.stdin is None or self.process.stdout is None:  # pragma: no cover - both are PIPE
            raise RuntimeError("the worker has no pipes")
        return self.process.stdin, self.process.stdout

    def stop(self) -> None:
        self._pipes()[0].close()
        self.process.wait(timeout=30)


@dataclass
class Row:
    store: str
    variants: tuple[str, str]
    first: float  # median CPU per result over every pair's rounds
    second: float
    pair_ratios: list[float]  # each pair's median of the second over its median of the first
    counted: dict[str, float]

    @property
    def ratio(self) -> float:
        """The median pair's ratio: pairs differ in level (a process's layout, the disk's state), not in the ratio."""
        return statistics.median(self.pair_ratios)


def measure_pair(
    args: argparse.Namespace, store: str, target: dict[str, Any], variants: tuple[str, str]
) -> tuple[list[float], list[float], dict[str, float]]:
    """CPU per result of each batch of a fresh pair of workers taking turns, and what its "on" worker counted."""
    workers = [WorkerProcess(args, variant, target) for variant in variants]
    samples: tuple[list[float], list[float]] = ([], [])
    try:
        for number in range(args.s3_rounds if store == "s3" else args.rounds):
            for slot in (0, 1) if number % 2 == 0 else (1, 0):
                samples[slot].append(workers[slot].ask("batch"))
        counted = workers[variants.index("on")].ask("counted") if "on" in variants else {}
    finally:
        for worker in workers:
            worker.stop()
    return samples[0], samples[1], counted


def measure(args: argparse.Namespace, store: str, target: dict[str, Any], variants: tuple[str, str]) -> Row:
    """The two variants over ``--pairs`` fresh pairs of workers."""
    pairs = [measure_pair(args, store, target, variants) for _ in range(args.pairs)]
    return Row(
        store,
        variants,
        statistics.median(sample for first, _, _ in pairs for sample in first),
        statistics.median(sample for _, second, _ in pairs for sample in second),
        [statistics.median(second) / statistics.median(first) for first, second, _ in pairs],
        pairs[-1][2],
    )


@contextmanager
def targets(stores: list[str]) -> Iterator[dict[str, dict[str, Any]]]:
    """Where each store lives: memory://, a temporary directory, or moto's S3 server in a process of its own."""
    with ExitStack() as stack:
        found: dict[str, dict[str, Any]] = {}
        for store in stores:
            if store == "memory":
                found[store] = {"url": f"memory://metrics-cost-{uuid.uuid4().hex[:8]}"}
            elif store == "local":
                found[store] = {"url": stack.enter_context(tempfile.TemporaryDirectory())}
            else:
                s3 = stack.enter_context(local_s3_process())
                found[store] = {"url": f"{s3.bucket_url}/metrics-cost", "storage_options": s3.storage_options}
        yield found


def load_average() -> str:
    with open("/proc/loadavg") as loadavg:
        return " ".join(loadavg.read().split()[:3])


def print_table(args: argparse.Namespace, rows: list[Row], load: str) -> None:
    print(
        f"N={args.runs} concurrent runs x one step of K={args.results} results of {args.size:,} chars; CPU per result "
        f"(process_time), {args.pairs} worker pairs x {args.rounds} alternating rounds ({args.s3_rounds} on S3), both "
        f"workers on CPU {args.cpu}; ratio: the median pair's ratio of medians; load average {load}.\n"
    )
    print("| store | metrics | first | second | second / first | lowest, highest pair | counted per result (on) |")
    print("|---|---|---:|---:|---:|---:|---|")
    for row in rows:
        pair = " / ".join(row.variants) + (" (control)" if row.variants == CONTROL else "")
        counted = ", ".join(f"{value:.2f} {name}" for name, value in row.counted.items()) or "-"
        first, second = f"{1e6 * row.first:.0f} us", f"{1e6 * row.second:.0f} us"
        spread = f"{min(row.pair_ratios):.3f}x, {max(row.pair_ratios):.3f}x"
        print(f"| {row.store} | {pair} | {first} | {second} | {row.ratio:.3f}x | {spread} | {counted} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--backends", nargs="+", choices=("memory", "local", "s3"), default=["memory", "local"])
    parser.add_argument("--runs", type=int, default=8, help="concurrent runs per batch, N (default: %(default)s)")
    parser.add_argument("--results", type=int, default=10, help="tool results in the run's step, K (%(default)s)")
    parser.add_argument("--size", type=int, default=2000, help="characters per result (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=20, help="measured rounds per worker pair (%(default)s)")
    parser.add_argument("--s3-rounds", type=int, default=8, help="measured rounds per pair on S3 (%(default)s)")
    parser.add_argument("--pairs", type=int, default=6, help="fresh worker pairs per row (default: %(default)s)")
    parser.add_argument("--warm-up", type=int, default=3, help="unmeasured batches per worker (%(default)s)")
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)), help="the workers' CPU (%(default)s)")
    parser.add_argument("--control", action="store_true", help="also measure off against off (not on S3)")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        serve(args)
        return
    before = load_average()
    with targets(args.backends) as found:
        rows = [
            measure(args, store, target, variants)
            for store, target in found.items()
            for variants in ([VARIANTS, CONTROL] if args.control and store != "s3" else [VARIANTS])
        ]
    print_table(args, rows, f"{before} before, {load_average()} after")


if __name__ == "__main__":
    main()
