"""
What one chat turn's history costs as a session grows: requests, bytes and time at T earlier turns, warm and cold.

A turn is what `ChatService` does to the history per message: read it, claim the next turn (conditional create),
record its end. Each size gets a session of its own, seeded through `SessionHistory` on moto's S3 server (real HTTP on
loopback); then one more turn is measured three ways, in the same run:

- **warm**: on the worker that served the session's previous turn (its conversation in that worker's cache);
- **cold**: on a worker that holds nothing (`ConversationCache(0)`), as after a restart or on another replica.

With ``--before REV`` the history module of git revision REV (e.g. the commit before head documents) seeds a session
of its own and runs its next turn beside them (that layout keeps no conversation in a worker: every turn is cold), so
the table shows before and after from one run.

Run from the repository root::

    PYTHONPATH=src python benchmarks/scale.py --turns 1 10 100 500 1000 --before 274b53f~1

Prints the Markdown table kept in benchmarks/README.md.
"""

import argparse
import asyncio
import importlib.util
import shutil
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

MODULE = "src/haystack_integrations/offload/sessions/history.py"


@dataclass
class Cost:
    """One measured turn."""

    requests: Counter[str]
    read: int
    seconds: float
    cpu: float


def _exchange(number: int, chars: int) -> list[ChatMessage]:
    return [
        ChatMessage.from_user(f"question {number} " + "q" * chars),
        ChatMessage.from_assistant(f"answer {number} " + "a" * chars),
    ]


async def _turn(history: Any, number: int, chars: int) -> list[ChatMessage]:
    turn = await history.begin(await history.read(), kind="message", text=f"question {number}")
    conversation = [*turn.conversation, *_exchange(number, chars)]
    await history.finish(turn, status="completed", messages=conversation, reply=f"answer {number}")
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


async def _run(sizes: list[int], chars: int, revision: str | None) -> None:
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
            print(f"| {turns} | " + " | ".join(cells) + f" | {rows['sent']:,} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Measure each size and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 10, 100, 500, 1000])
    parser.add_argument("--chars", type=int, default=300, help="characters in each message of an exchange")
    parser.add_argument("--before", help="a git revision whose history module to measure beside (cold turns)")
    arguments = parser.parse_args(argv)
    asyncio.run(_run(arguments.turns, arguments.chars, arguments.before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
