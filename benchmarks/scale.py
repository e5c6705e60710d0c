"""
What each per-request operation costs at size, side by side in one run: a chat turn's history at T earlier turns (warm
and cold), and (`scale_ops`, `scale_tenants`) the first list page at N results, a quota'd first write into a tenant of
N results, a purge of N results, an approval round trip at A approvals, a tenant's first use and a worker's RSS at up
to 5,000 tenants. Requests and bytes come from the log of moto's S3 server.

A turn is what `ChatService` does to the history per message: read it, claim the next turn (conditional create),
record its end. Each size gets a session of its own, seeded through `SessionHistory` on moto's S3 server (real HTTP on
loopback); then one more turn is measured three ways, in the same run:

- **warm**: on the worker that served the session's previous turn (its conversation in that worker's cache);
- **cold**: on a worker that holds nothing (`ConversationCache(0)`), as after a restart or on another replica.

With ``--before REV`` the history module of git revision REV (e.g. the commit before head documents) seeds a session
of its own and runs its next turn beside them (that layout keeps no conversation in a worker: every turn is cold), so
the table shows before and after from one run.

Run from the repository root (each size flag takes a list; given no values, that operation is skipped)::

    PYTHONPATH=src python benchmarks/scale.py --plot benchmarks/scale.png

    PYTHONPATH=src python benchmarks/scale.py --turns 1 10 100 500 --before 274b53f~1 --lists --quotas --purges
    --approvals --tenants --fsspec-tenants

The first measures every operation at its default sizes and draws the figure; the second, the turns only, before and
after.

Prints the Markdown tables kept in benchmarks/README.md; ``--plot PATH`` draws requests against size (matplotlib:
``pip install "offload-haystack[bench]"``).
"""

import argparse
import asyncio
import importlib.util
import inspect
import random
import shutil
import string
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from haystack.dataclasses import ChatMessage

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.sessions.conversation_cache import ConversationCache
from haystack_integrations.offload.sessions.history import SessionHistory
from haystack_integrations.offload.testing.local_s3 import LocalS3Server

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scale_* modules, when run as a script

import scale_ops
import scale_tenants

Curves = dict[str, list[tuple[int, float]]]

MODULE = "src/haystack_integrations/offload/sessions/history.py"


@dataclass
class Cost:
    """One measured turn."""

    requests: Counter[str]
    read: int
    seconds: float
    cpu: float


# Words of 2 to 9 letters drawn from a fixed vocabulary: text that gzip shrinks about as much as prose (2.5-3x), where
# one letter repeated would shrink to nothing and flatter the stored documents.
_VOCABULARY = [
    "".join(random.Random(index).choices(string.ascii_lowercase, k=2 + index % 8))  # noqa: S311 - test text
    for index in range(2_000)
]


def _prose(seed: str, chars: int) -> str:
    draw, words, length = random.Random(seed), [], 0  # noqa: S311 - test text
    while length < chars:
        words.append(draw.choice(_VOCABULARY))
        length += len(words[-1]) + 1
    return " ".join(words)[:chars]


def _exchange(number: int, chars: int) -> list[ChatMessage]:
    return [
        ChatMessage.from_user(f"question {number} " + _prose(f"q{number}", chars)),
        ChatMessage.from_assistant(f"answer {number} " + _prose(f"a{number}", chars)),
    ]


async def _turn(history: Any, number: int, chars: int) -> list[ChatMessage]:
    # Read as `ChatService.send_message` reads for a turn (the history module before had no `for_turn`).
    for_turn = "for_turn" in inspect.signature(history.read).parameters
    state = await (history.read(for_turn=True) if for_turn else history.read())
    turn = await history.begin(state, kind="message", text=f"question {number}")
    conversation = [*turn.conversation, *_exchange(number, chars)]
    # The reply as ChatService records it: the text of the last message.
    await history.finish(turn, status="completed", messages=conversation, reply=conversation[-1].text)
    return list(conversation)


async def _measure(server: LocalS3Server, history: Any, number: int, chars: int) -> Cost:
    server.requests.clear()
    started, cpu = time.perf_counter(), time.process_time()
    await _turn(history, number, chars)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    requests: Counter[str] = Counter()
    read = 0
    for request in server.requests.snapshot():
        requests["LIST" if "list-type" in request.query else request.method] += 1
        if request.method == "GET" and request.status == 200:
            read += request.bytes_sent
    return Cost(requests, read, seconds, cpu)


def _old_module(revision: str) -> ModuleType:
    git = shutil.which("git") or "git"
    # The revision is the operator's own argument, run as a list (no shell).
    source = subprocess.run([git, "show", f"{revision}:{MODULE}"], capture_output=True, check=True, text=True)  # noqa: S603
    path = Path(tempfile.mkdtemp()) / "history_before.py"
    path.write_text(source.stdout)
    spec = importlib.util.spec_from_file_location("history_before", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"Cannot load {MODULE} of {revision}.")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _size(
    server: LocalS3Server, root: FsspecToolResultStore, turns: int, chars: int, before: ModuleType | None
) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    store = root.for_session("acme", uuid.uuid4().hex)
    seed = SessionHistory(store, worker="seed", cache=ConversationCache())
    conversation: list[ChatMessage] = []
    for number in range(1, turns + 1):
        conversation = await _turn(seed, number, chars)
    sent = sum(len(message.text or "") for message in conversation)
    # Warm first: the seeding worker served every turn so far. Then a worker that holds nothing.
    rows["warm"] = await _measure(server, seed, turns + 1, chars)
    cold = SessionHistory(store, worker="cold", cache=ConversationCache(0))
    rows["cold"] = await _measure(server, cold, turns + 2, chars)
    if before is not None:  # a session of its own: the layout before cannot read the one after
        old = before.SessionHistory(root.for_session("acme", uuid.uuid4().hex), worker="old")
        for number in range(1, turns + 1):
            await _turn(old, number, chars)
        rows["before"] = await _measure(server, old, turns + 1, chars)
    rows["sent"] = sent
    return rows


def _requests(cost: Cost) -> str:
    return " ".join(f"{cost.requests[kind]} {kind}" for kind in ("GET", "PUT", "LIST") if cost.requests[kind])


async def _turns(sizes: list[int], chars: int, revision: str | None, curves: Curves) -> None:
    before = _old_module(revision) if revision else None
    kinds = ["warm", "cold", *(["before"] if revision else [])]
    print(f"Each exchange: 2 messages of {chars} characters; S3 = moto server on loopback.\n")
    header = "| T | " + " | ".join(f"{kind}: requests | {kind}: bytes read | {kind}: ms" for kind in kinds)
    print(header + " | text sent to the model |")
    print("|---:|" + "---|---:|---:|" * len(kinds) + "---:|", flush=True)
    with LocalS3Server() as server:
        root = FsspecToolResultStore(f"{server.bucket_url}/scale", storage_options=server.storage_options())
        await root.warm_up_async()
        for turns in sizes:  # a row as soon as it is measured: the largest sizes take minutes before the change
            rows = await _size(server, root, turns, chars, before)
            cells = []
            for kind in kinds:
                cost: Cost = rows[kind]
                cells.append(f"{_requests(cost)} | {cost.read:,} | {cost.seconds * 1000:.1f}")
                curves.setdefault(f"turn, {kind} (T)", []).append((turns, sum(cost.requests.values())))
            print(f"| {turns} | " + " | ".join(cells) + f" | {rows['sent']:,} |", flush=True)


OPERATIONS = {  # flag: (what it measures, its size's name, the function, the row plotted and its label)
    "lists": ("First list page (20 results) of a session holding N", "N", scale_ops.list_page, "tool", "list page"),
    "quotas": ("A fresh worker's first write with a Quota, tenant of N", "N", scale_ops.quota_write, "", ""),
    "purges": ("A tenant's purge of N results (older_than)", "N", scale_ops.purge, "purge", "purge, per 1,000 results"),
    "approvals": (
        "A durable approval round trip, A approvals in the session",
        "A",
        scale_ops.approvals,
        "round trip",
        "approval round trip",
    ),
}


async def _operation(server: LocalS3Server, flag: str, sizes: list[int], curves: Curves) -> None:
    title, size_name, function, plotted, label = OPERATIONS[flag]
    print(f"\n{title}\n")
    header = None
    for size in sizes:
        rows = await function(server, size)
        if header is None:
            print(f"| {size_name} | " + " | ".join(f"{kind}: requests | bytes sent | ms" for kind in rows) + " |")
            print("|---:|" + "---|---:|---:|" * len(rows), flush=True)
            header = rows
        cells = " | ".join(f"{m.kinds()} | {m.sent:,} | {m.seconds * 1000:,.0f}" for m in rows.values())
        print(f"| {size:,} | {cells} |", flush=True)
        if flag == "quotas":  # beyond the write's own PUT, after the tenant's first quota'd write ever
            for kind in ("tenant limits", "session limits"):
                curves.setdefault(f"quota'd first write, {kind}, beyond its PUT (N)", []).append(
                    (size, rows[kind].total - 1)
                )
        elif flag == "purges":  # per 1,000 objects: a purge lists and deletes a page per 1,000 by design
            curves.setdefault(f"{label} (N)", []).append((size, rows[plotted].total * 1000 / size))
        else:
            curves.setdefault(f"{label} ({size_name})", []).append((size, rows[plotted].total))


def _tenants(server: LocalS3Server, sizes: dict[str, list[int]], curves: Curves, memory: Curves) -> None:
    print("\nTenants: credentials and SSE-C keys per tenant, one root store; a first use is a 1 KB write + a page\n")
    print("First-use figures: medians over the tenants first used since the row before (STS: the run's mean).\n")
    print("| engine | tenants | RSS MiB | live handles | first use: S3 requests | STS | median ms | CPU ms | wall s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    for engine, counts in sizes.items():
        points = scale_tenants.measure(server, engine, counts)
        sts = points[-1]["sts_per_tenant"]
        for point in points:
            print(
                f"| {engine} | {point['tenants']:,} | {point['rss_mib']:.0f} | {point['live']} | "
                f"{point['s3_requests']:g} | {sts:g} | {point['median_ms']:.0f} | {point['cpu_ms']:.1f} | "
                f"{point['wall_s']:.0f} |",
                flush=True,
            )
        memory[engine] = [(point["tenants"], point["rss_mib"]) for point in points]
        first_use = [(point["tenants"], point["s3_requests"] + sts) for point in points]
        curves[f"tenant first use, S3 + STS, {engine} (tenants)"] = first_use


async def _run(arguments: argparse.Namespace) -> Curves:
    curves: Curves = {}
    memory: Curves = {}
    if arguments.turns:
        await _turns(arguments.turns, arguments.chars, arguments.before, curves)
    with LocalS3Server() as server:
        for flag in OPERATIONS:
            if getattr(arguments, flag):
                await _operation(server, flag, getattr(arguments, flag), curves)
        tenants = {"obstore": arguments.tenants, "fsspec": arguments.fsspec_tenants}
        if any(tenants.values()):
            _tenants(server, {engine: counts for engine, counts in tenants.items() if counts}, curves, memory)
    if arguments.plot:
        from scale_plot import plot

        plot(curves, memory, Path(arguments.plot))
    return curves


def main(argv: list[str] | None = None) -> int:
    """Measure each size and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, nargs="*", default=[1, 10, 100, 500, 1000])
    parser.add_argument("--chars", type=int, default=300, help="characters in each message of an exchange")
    parser.add_argument("--before", help="a git revision whose history module to measure beside (cold turns)")
    parser.add_argument("--lists", type=int, nargs="*", default=[100, 1000, 10_000, 100_000])
    # 100,000 is left to the command line for quotas and purges: moto's listing reads every key of the bucket per page,
    # so listing 100,000 objects takes it minutes (our requests are counted all the same).
    parser.add_argument("--quotas", type=int, nargs="*", default=[100, 1000, 10_000])
    parser.add_argument("--purges", type=int, nargs="*", default=[1000, 10_000])
    parser.add_argument("--approvals", type=int, nargs="*", default=[10, 100, 500])
    parser.add_argument("--tenants", type=int, nargs="*", default=[10, 100, 200, 1000, 5000], help="on obstore")
    # s3fs clients cost ~50 ms of CPU each: 5,000 tenants take it 10 minutes or more on a busy 2-core machine.
    parser.add_argument("--fsspec-tenants", type=int, nargs="*", default=[10, 100, 200, 1000, 2000], help="on s3fs")
    parser.add_argument("--plot", help="write the figure (PNG) here")
    asyncio.run(_run(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
