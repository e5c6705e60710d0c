"""
CPU per offloaded result on local disk: `OffloadHook` against Haystack's stock hook, in one run.

N concurrent `Agent.run_async` sessions (scripted with `MockChatGenerator`), each one step that calls a tool K times
(10 by default), every result offloaded to local disk:

- stock: `ToolResultOffloadHook` with Haystack's `FileSystemToolResultStore` (a sync hook: Haystack runs it in a
  worker thread, one hop per step);
- ours: `OffloadHook` with `FsspecToolResultStore` on a local directory, `write_async` per result (local disk's async
  writes run inline on the loop up to `stores.local_io.INLINE_IO_BYTES`, in a worker thread above);
- no hook: the same agent without offloading, for what the agent itself costs per result.

And the stores alone, without the agent: one step's K writes, the stock store's as the stock hook makes them (all in
one worker thread, one after another), ours as `OffloadHook` does (K `write_async` gathered on the loop).

What is measured is the process's CPU time (`time.process_time`, all threads) over a batch of N runs, divided by the
N x K results; contenders take turns in shuffled order each round, and the median over rounds is reported, with the
ratio to the stock hook. Run it against an older tree to compare (``PYTHONPATH=/path/to/old/src``).

Run from the repository root (about half a minute)::

    PYTHONPATH=src python benchmarks/local_disk_cpu.py
    PYTHONPATH=src python benchmarks/local_disk_cpu.py --runs 8 --results 10 --size 2000 --rounds 30
"""

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.hooks.tool_result_offloading import AlwaysOffload, FileSystemToolResultStore, ToolResultOffloadHook
from haystack.tools import Tool

from haystack_integrations.offload import FsspecToolResultStore, OffloadHook, offload_context


def make_agent(payload: str, results: int, hooks: dict[str, list[Any]]) -> Agent:
    def fetch(page: int) -> str:
        return f"page {page}\n{payload}"

    tool = Tool(
        name="fetch",
        description="Fetch a page.",
        parameters={"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]},
        function=fetch,
    )

    def script(messages: list[ChatMessage]) -> ChatMessage:
        # One step with `results` tool calls, then done.
        user = max(i for i, message in enumerate(messages) if message.is_from(ChatRole.USER))
        if any(message.tool_call_result is not None for message in messages[user:]):
            return ChatMessage.from_assistant("done")
        calls = [ToolCall(tool_name="fetch", arguments={"page": i}, id=f"call_{i}") for i in range(results)]
        return ChatMessage.from_assistant(tool_calls=calls)

    agent = Agent(chat_generator=MockChatGenerator(response_fn=script), tools=[tool], hooks=hooks, max_agent_steps=3)  # type: ignore[arg-type]
    agent.warm_up()
    return agent


class Contender:
    def __init__(self, name: str, agent: Agent, store: FsspecToolResultStore | None) -> None:
        self.name = name
        self.agent = agent
        self.store = store

    async def batch(self, runs: int, results: int) -> float:
        """CPU seconds per result of `runs` concurrent runs."""
        label = uuid.uuid4().hex[:8]
        contexts = [
            offload_context(self.store.for_session("bench", f"{label}-{i}")) if self.store is not None else None
            for i in range(runs)
        ]
        before = time.process_time()
        outcomes = await asyncio.gather(
            *(
                self.agent.run_async([ChatMessage.from_user("fetch")], hook_context=context)
                if context is not None
                else self.agent.run_async([ChatMessage.from_user("fetch")])
                for context in contexts
            )
        )
        spent = time.process_time() - before
        if self.name != "no hook":
            offloaded = sum(
                1
                for outcome in outcomes
                for message in outcome["messages"]
                if message.meta.get("tool_result_offloaded")
            )
            if offloaded != runs * results:
                raise RuntimeError(f"{self.name}: {offloaded} results offloaded, expected {runs * results}")
        return spent / (runs * results)


async def stores_only(args: argparse.Namespace, root: Path) -> dict[str, list[float]]:
    """CPU seconds per result of one step's K writes, through each store alone."""
    payload = ("lorem ipsum dolor sit amet " * (args.size // 27 + 1))[: args.size]
    stock = FileSystemToolResultStore(root / "stock-only")
    ours = FsspecToolResultStore(str(root / "ours-only"))

    async def stock_step() -> None:
        label = uuid.uuid4().hex[:8]
        await asyncio.to_thread(
            lambda: [stock.write(key=f"{label}/{i}.txt", content=payload) for i in range(args.results)]
        )

    async def ours_step() -> None:
        session = ours.for_session("bench", uuid.uuid4().hex[:8])
        await asyncio.gather(*(session.write_async(key=f"{i}.txt", content=payload) for i in range(args.results)))

    steps = {
        "stock `FileSystemToolResultStore.write` (one thread hop per step)": stock_step,
        "`FsspecToolResultStore.write_async`": ours_step,
    }
    samples: dict[str, list[float]] = {name: [] for name in steps}
    order = list(steps)
    for round_number in range(args.warm_up + args.rounds):
        random.shuffle(order)
        for name in order:
            before = time.process_time()
            for _ in range(args.runs):
                await steps[name]()
            if round_number >= args.warm_up:
                samples[name].append((time.process_time() - before) / (args.runs * args.results))
    return samples


async def benchmark(args: argparse.Namespace, root: Path) -> dict[str, list[float]]:
    payload = ("lorem ipsum dolor sit amet " * (args.size // 27 + 1))[: args.size]
    policy = {"fetch": AlwaysOffload()}
    stock = ToolResultOffloadHook(store=FileSystemToolResultStore(root / "stock"), offload_strategies=policy)
    ours_store = FsspecToolResultStore(str(root / "ours"))
    contenders = [
        Contender(
            "stock `ToolResultOffloadHook` + `FileSystemToolResultStore`",
            make_agent(payload, args.results, {"after_tool": [stock]}),
            None,
        ),
        Contender(
            "`OffloadHook` + `FsspecToolResultStore` (local)",
            make_agent(payload, args.results, {"after_tool": [OffloadHook(policy)]}),
            ours_store,
        ),
        Contender("no hook", make_agent(payload, args.results, {}), None),
    ]
    samples: dict[str, list[float]] = {contender.name: [] for contender in contenders}
    for contender in contenders:
        for _ in range(args.warm_up):
            await contender.batch(args.runs, args.results)
    for _ in range(args.rounds):
        random.shuffle(contenders)
        for contender in contenders:
            samples[contender.name].append(await contender.batch(args.runs, args.results))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=8, help="concurrent runs per batch, N (default: %(default)s)")
    parser.add_argument("--results", type=int, default=10, help="tool results in the step, K (default: %(default)s)")
    parser.add_argument("--size", type=int, default=2000, help="characters per result (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=20, help="measured rounds (default: %(default)s)")
    parser.add_argument("--warm-up", type=int, default=3, help="unmeasured rounds first (default: %(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        samples = asyncio.run(benchmark(args, Path(directory)))
        alone = asyncio.run(stores_only(args, Path(directory)))
    print(
        f"N={args.runs} concurrent runs x one step of K={args.results} results of {args.size:,} chars, local disk; "
        f"{args.rounds} rounds, median CPU per result (process_time, all threads).\n"
    )
    for heading, table in (("hook", samples), ("store alone", alone)):
        names = list(table)
        stock = statistics.median(table[names[0]])
        print(f"| {heading} | CPU per result | / stock |")
        print("|---|---:|---:|")
        for name in names:
            median = statistics.median(table[name])
            print(f"| {name} | {1e6 * median:.0f} us | {median / stock:.2f}x |")
        print()


if __name__ == "__main__":
    main()
