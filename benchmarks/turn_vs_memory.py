"""
A chat turn through `ChatService` against the same turn answered from memory, at T turns already in the session.

For each T, three sessions hold the same conversation of T exchanges (two messages of ``--chars`` characters each,
seeded through `SessionHistory` as `scale.py` seeds them), and each round answers one more message three ways, in an
order shuffled each round so that load from other processes falls on all of them alike:

- **in memory** (the baseline, 1.00): a bare ``agent.run_async`` given the conversation held in this process and the
  session's store (what a server keeping history in memory does); it keeps the run's messages for its next round;
- **warm**: `ChatService.send_message` on the worker that served the session's previous turn (its conversation in that
  worker's `ConversationCache`): it reads the conversation from the store, claims the turn, runs the same Agent and
  records the turn;
- **cold**: `ChatService.send_message` on a fresh service with an empty cache each round (a restarted worker, or
  another replica), which reads the conversation from the store.

The Agent is the reference server's (`build_agent`: offload, compaction and approval hooks) with its scripted model
(Haystack's `MockChatGenerator`); the message makes it call three tools whose results are offloaded. Each session
grows by one turn per round, alike for all three. Times are medians over the rounds, ratios the median of each round's
ratio to the turn in memory of the same round; client CPU is this process's (`time.process_time`, every thread:
obstore's too), the S3 server being processes of its own (``--server``: moto's server, or a one-node Ceph RGW). A
second table splits each turn into its parts by the public methods they run in (`SessionHistory.read`, `begin`,
`finish`; `Agent.run_async`), timed by wrapping those methods for the run.

Run from the repository root::

    PYTHONPATH=src python benchmarks/turn_vs_memory.py --server rgw
    PYTHONPATH=src python benchmarks/turn_vs_memory.py --server moto --turns 1 100 --rounds 5

``--profile DIR`` also writes a cProfile of each variant's measured turns at each T (``DIR/T<T>-<variant>.prof``, read
with ``python -m pstats``); profiling slows every variant, so take times from a run without it.

Prints the Markdown table kept in benchmarks/README.md and whether the target (a warm turn at most 1.2x the turn in
memory at every T) is met.
"""

import argparse
import asyncio
import contextlib
import cProfile
import functools
import random
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmarks, when run as a script

from client_cpu import s3_server
from scale import _turn as seed_turn
from server_turns import MESSAGE

from haystack_integrations.offload import DurableApprovals, FsspecToolResultStore, offload_context
from haystack_integrations.offload.sessions.conversation_cache import ConversationCache
from haystack_integrations.offload.sessions.history import SessionHistory
from haystack_integrations.offload.sessions.service import ChatService
from offload_haystack_app.demo.scripted_model import scripted_generator
from offload_haystack_app.server.agent import build_agent

TARGET = 1.2  # a warm turn, at most this times the turn in memory (issue 42)
VARIANTS = ("in memory", "warm", "cold")
PHASES: dict[str, tuple[type, str]] = {  # a turn's parts, by the public method each runs in
    "read": (SessionHistory, "read"),
    "claim": (SessionHistory, "begin"),
    "agent": (Agent, "run_async"),
    "record": (SessionHistory, "finish"),
}


@dataclass
class Samples:
    """One variant's measured turns at one T: wall and CPU seconds, in all and per phase (one dict per turn)."""

    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    phases: list[dict[str, list[float]]] = field(default_factory=list)


_sink: dict[str, list[float]] | None = None
"""Where the phases of the turn being measured add their wall and CPU seconds (turns run one at a time)."""


@contextlib.contextmanager
def timed_phases() -> Iterator[None]:
    """Time the `PHASES` methods (wrapped on their classes, restored after) into `_sink` while one is set."""

    def timed(phase: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(method)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            sink, started, cpu = _sink, time.perf_counter(), time.process_time()
            try:
                return await method(*args, **kwargs)
            finally:
                if sink is not None:
                    spent = sink.setdefault(phase, [0.0, 0.0])
                    spent[0] += time.perf_counter() - started
                    spent[1] += time.process_time() - cpu

        return wrapper

    originals = {phase: getattr(owner, name) for phase, (owner, name) in PHASES.items()}
    try:
        for phase, (owner, name) in PHASES.items():
            setattr(owner, name, timed(phase, originals[phase]))
        yield
    finally:
        for phase, (owner, name) in PHASES.items():
            setattr(owner, name, originals[phase])


async def _seed(store: FsspecToolResultStore, turns: int, chars: int, worker: str, cache: ConversationCache) -> Any:
    history = SessionHistory(store, worker=worker, cache=cache)
    conversation: list[ChatMessage] = []
    for number in range(1, turns + 1):
        conversation = await seed_turn(history, number, chars)
    return conversation


class Size:
    """The three sessions of one T and how each variant answers one more message in its own."""

    def __init__(self, agent: Agent, root: FsspecToolResultStore, turns: int) -> None:
        self.agent = agent
        self.turns = turns
        run = uuid.uuid4().hex[:8]
        self.stores = {
            variant: root.for_session("acme", f"t{turns}-{variant.replace(' ', '-')}-{run}") for variant in VARIANTS
        }
        self.warm_cache = ConversationCache()
        self.warm = ChatService(agent, worker="warm", conversation_cache=self.warm_cache)
        self.conversation: list[ChatMessage] = []
        self.cold_turns = 0

    async def seed(self, chars: int) -> None:
        """
        Seed the warm and cold sessions alike (the warm one by the warm worker, so its conversation is in its cache);
        the turn in memory starts from the same conversation, which needs no history in the store.
        """
        self.conversation = await _seed(self.stores["warm"], self.turns, chars, "warm", self.warm_cache)
        await _seed(self.stores["cold"], self.turns, chars, "seed", ConversationCache(0))

    def call(self, variant: str) -> Callable[[], Awaitable[None]]:
        """The turn `variant` answers, as an operation to time."""
        return {"in memory": self.in_memory, "warm": self.served_warm, "cold": self.served_cold}[variant]

    async def in_memory(self) -> None:
        context = offload_context(self.stores["in memory"], approval_channel=DurableApprovals())
        reply = await self.agent.run_async([*self.conversation, ChatMessage.from_user(MESSAGE)], hook_context=context)
        self.conversation = list(reply["messages"])

    async def served_warm(self) -> None:
        await self.warm.send_message(self.stores["warm"], MESSAGE)

    async def served_cold(self) -> None:
        self.cold_turns += 1
        service = ChatService(self.agent, worker=f"cold-{self.cold_turns}", conversation_cache=ConversationCache())
        await service.send_message(self.stores["cold"], MESSAGE)


async def _measure_size(
    agent: Agent, root: FsspecToolResultStore, turns: int, arguments: argparse.Namespace
) -> tuple[dict[str, Samples], float]:
    size = Size(agent, root, turns)
    started = time.perf_counter()
    await size.seed(arguments.chars)
    seeded = time.perf_counter() - started
    for variant in VARIANTS:  # unmeasured: the first service turn after seeding, and any first-call costs
        await size.call(variant)()
    samples = {variant: Samples() for variant in VARIANTS}
    profiles = {variant: cProfile.Profile() for variant in VARIANTS} if arguments.profile else {}
    order = list(VARIANTS)
    global _sink
    for _ in range(arguments.rounds):
        random.shuffle(order)
        for variant in order:
            profile = profiles.get(variant)
            _sink = {}
            started, cpu = time.perf_counter(), time.process_time()
            if profile is not None:
                profile.enable()
            await size.call(variant)()
            if profile is not None:
                profile.disable()
            samples[variant].seconds.append(time.perf_counter() - started)
            samples[variant].cpu.append(time.process_time() - cpu)
            samples[variant].phases.append(_sink)
            _sink = None
    for variant, profile in profiles.items():
        path = Path(arguments.profile) / f"T{turns}-{variant.replace(' ', '-')}.prof"
        path.parent.mkdir(parents=True, exist_ok=True)
        profile.dump_stats(path)
    return samples, seeded


def _row(turns: int, samples: dict[str, Samples]) -> tuple[str, float]:
    """
    The table's row for one T, and the warm turn's ratio. Ratios are medians of each round's ratio to the turn in memory
    of the same round (paired: a load that comes and goes on a shared machine falls on both sides of each pair).
    """
    memory = samples["in memory"]
    cells = [f"{statistics.median(memory.seconds) * 1000:.1f} | {statistics.median(memory.cpu) * 1000:.1f}"]
    ratios = {}
    for variant in ("warm", "cold"):
        measured = samples[variant]
        ratios[variant] = statistics.median(a / b for a, b in zip(measured.seconds, memory.seconds, strict=True))
        cpu_ratio = statistics.median(a / b for a, b in zip(measured.cpu, memory.cpu, strict=True))
        cells.append(
            f"{statistics.median(measured.seconds) * 1000:.1f} | **{ratios[variant]:.2f}x** | "
            f"{statistics.median(measured.cpu) * 1000:.1f} | {cpu_ratio:.2f}x"
        )
    return f"| {turns:,} | " + " | ".join(cells) + " |", ratios["warm"]


def _phase_rows(turns: int, samples: dict[str, Samples]) -> list[str]:
    """Per variant: the median wall / CPU ms of each phase, and of the rest of the turn (the service's own code)."""
    rows = []
    for variant in VARIANTS:
        measured = samples[variant]
        cells = []
        for phase in (*PHASES, "rest"):
            if phase == "rest":
                spent = [
                    (wall - sum(p[0] for p in parts.values()), cpu - sum(p[1] for p in parts.values()))
                    for wall, cpu, parts in zip(measured.seconds, measured.cpu, measured.phases, strict=True)
                ]
            else:
                spent = [tuple(parts.get(phase, [0.0, 0.0])) for parts in measured.phases]  # type: ignore[misc]
            wall = statistics.median(s[0] for s in spent) * 1000
            cpu = statistics.median(s[1] for s in spent) * 1000
            cells.append(f"{wall:.1f} / {cpu:.1f}")
        rows.append(f"| {turns:,} | {variant} | " + " | ".join(cells) + " |")
    return rows


async def _run(arguments: argparse.Namespace) -> bool:
    server = "Ceph RGW (one node, daemons of its own)" if arguments.server == "rgw" else "moto (its own process)"
    print(
        f"{server}; exchanges of two {arguments.chars}-character messages seeded; medians of {arguments.rounds} "
        "interleaved rounds; ms per turn (wall) and client CPU ms per turn; ratios to the turn in memory (median of "
        "the rounds' ratios).\n"
    )
    print(
        "| T | in memory: ms | in memory: CPU ms | warm: ms | warm: x memory | warm: CPU ms | warm: CPU x memory "
        "| cold: ms | cold: x memory | cold: CPU ms | cold: CPU x memory |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    worst = 0.0
    phase_rows: list[str] = []
    agent = build_agent(scripted_generator())
    with s3_server(arguments.server) as (bucket, options), timed_phases():
        root = FsspecToolResultStore(f"s3://{bucket}/turns-{uuid.uuid4().hex[:8]}", storage_options=options)
        await root.warm_up_async()
        for turns in arguments.turns:
            samples, seeded = await _measure_size(agent, root, turns, arguments)
            row, ratio = _row(turns, samples)
            worst = max(worst, ratio)
            phase_rows += _phase_rows(turns, samples)
            print(row, flush=True)
            print(f"(T={turns}: two sessions seeded in {seeded:.0f} s)", file=sys.stderr, flush=True)
    print(
        "\nWhere a turn's time goes: median wall / CPU ms of each part (read the history, claim the turn, the Agent's "
        "run, record the turn; rest: the service's own code and waits between them).\n"
    )
    print("| T | variant | " + " | ".join(PHASES) + " | rest |")
    print("|---:|---|" + "---:|" * (len(PHASES) + 1))
    print("\n".join(phase_rows))
    met = worst <= TARGET
    print(
        f"\nTarget: a warm turn at most {TARGET:.1f}x the turn in memory at every T: worst {worst:.2f}x, "
        f"{'met' if met else 'NOT met'}."
    )
    return met


def main(argv: list[str] | None = None) -> int:
    """Measure each T and print the table; exit 0 whether or not the target is met (the table says)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--server", choices=["moto", "rgw"], default="rgw", help="the S3 server (default: %(default)s)")
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 10, 100, 500, 1000], help="T, turns seeded")
    parser.add_argument("--chars", type=int, default=300, help="characters in each seeded message (as scale.py)")
    parser.add_argument("--rounds", type=int, default=11, help="measured rounds per T (default: %(default)s)")
    parser.add_argument("--profile", help="write a cProfile of each variant's measured turns per T into this folder")
    asyncio.run(_run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
