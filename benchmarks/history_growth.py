"""
What the reference server's conversation history stores and costs per turn: snapshots (main's format) against appends.

One conversation of `--turns` turns, each adding a user message and an assistant reply of `--chars` characters, run
through `SessionHistory` on moto's S3 server (real HTTP on loopback) exactly as `ChatService` runs a turn: read the
history, claim the turn (conditional create), record its end with the whole conversation after it.

- **snapshot**: the format on main, where every turn's end stored the whole conversation (reproduced here by recording
  every end as a checkpoint: the same documents, plus a token and two small fields, and the same requests);
- **append**: this format, where an end stores only the turn's new messages, with a checkpoint whenever the appends
  since the last one would outgrow it.

Both run in the same process against the same server. Stored bytes come from a listing of the session's ``.history``
documents; requests and bytes moved from the server's log (exact, not estimated).

Run from the repository root::

    PYTHONPATH=src python benchmarks/history_growth.py --turns 100 --chars 20000

Prints the Markdown table kept in benchmarks/README.md.
"""

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass

from haystack.dataclasses import ChatMessage

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.operations import scan, usage
from haystack_integrations.offload.sessions.history import HistoryLog, SessionHistory, Turn, TurnEnd, TurnStatus
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog


def check(condition: bool, message: str) -> None:
    """Stop the benchmark if a result is not what was measured for (asserts vanish under ``python -O``)."""
    if not condition:
        raise RuntimeError(message)


@dataclass
class Outcome:
    """What one format cost over the whole conversation."""

    name: str
    stored: int
    conversation: int
    requests: Counter[str]
    written: int
    read: int
    turn_seconds: list[float]
    last_turn: Counter[str]


class SnapshotHistory(SessionHistory):
    """main's format: every end stores the whole conversation (a turn that knows no checkpoint writes one)."""

    async def finish(
        self,
        turn: Turn,
        *,
        status: TurnStatus,
        messages: list[ChatMessage] | None,
        reply: str | None = None,
        error: str | None = None,
    ) -> TurnEnd:
        """Record the turn's end as a checkpoint, whatever it appended."""
        snapshot = dataclasses.replace(turn, log=HistoryLog())
        return await super().finish(snapshot, status=status, messages=messages, reply=reply, error=error)


def _kinds(log: RequestLog) -> Counter[str]:
    counts: Counter[str] = Counter()
    for request in log.snapshot():
        kind = "LIST" if request.method == "GET" and "list-type" in request.query else request.method
        counts[kind] += 1
    return counts


async def _run(
    server: LocalS3Server,
    root: FsspecToolResultStore,
    name: str,
    history_type: type[SessionHistory],
    turns: int,
    chars: int,
) -> Outcome:
    store = root.for_session("acme", f"chat-{name}")
    history = history_type(store, worker="bench")
    requests: Counter[str] = Counter()
    written = read = 0
    seconds: list[float] = []
    last: Counter[str] = Counter()
    conversation: list[ChatMessage] = []
    for number in range(1, turns + 1):
        user = ChatMessage.from_user(f"question {number}: " + "q" * chars)
        reply = ChatMessage.from_assistant(f"answer {number}: " + "a" * chars)
        server.requests.clear()
        started = time.perf_counter()
        turn = await history.begin(await history.read(), kind="message", text=user.text)
        conversation = [*turn.conversation, user, reply]
        await history.finish(turn, status="completed", messages=conversation, reply=reply.text)
        seconds.append(time.perf_counter() - started)
        log = server.requests.snapshot()
        last = _kinds(server.requests)
        requests.update(last)
        written += sum(int(request.header("content-length") or 0) for request in log if request.method == "PUT")
        read += sum(request.bytes_sent for request in log if request.method == "GET")
    state = await SessionHistory(store, worker="check").read()
    check(state.conversation == conversation, f"{name}: the conversation did not read back whole")
    stored = usage(scan(root, tenant="acme", session=f"chat-{name}")).total.document_bytes
    size = sum(len(message.text or "") for message in conversation)
    return Outcome(name, stored, size, requests, written, read, seconds, last)


async def _measure(turns: int, chars: int) -> list[Outcome]:
    with LocalS3Server() as server:
        root = FsspecToolResultStore(f"{server.bucket_url}/bench", storage_options=server.storage_options())
        await root.warm_up_async()
        snapshot = await _run(server, root, "snapshot", SnapshotHistory, turns, chars)
        append = await _run(server, root, "append", SessionHistory, turns, chars)
    return [snapshot, append]


def _size(count: float) -> str:
    for unit, scale in (("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count:,.0f} B"


def main(argv: list[str] | None = None) -> int:
    """Run both formats and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=100, help="turns in the conversation")
    parser.add_argument("--chars", type=int, default=20_000, help="characters in each user message and each reply")
    arguments = parser.parse_args(argv)
    turns = arguments.turns
    snapshot, append = asyncio.run(_measure(turns, arguments.chars))

    print(f"{turns} turns, each a {arguments.chars:,}-character message and a reply as long; S3 = moto on loopback.\n")
    print(
        "| format | stored after all turns | x conversation text | PUT / turn | GET / turn | LIST / turn "
        "| bytes written / turn | bytes read / turn | GETs in the last turn | median ms / turn | last turn ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for outcome in (snapshot, append):
        requests = outcome.requests
        print(
            f"| {outcome.name} | {_size(outcome.stored)} | {outcome.stored / outcome.conversation:.2f} "
            f"| {requests['PUT'] / turns:.2f} | {requests['GET'] / turns:.2f} | {requests['LIST'] / turns:.2f} "
            f"| {_size(outcome.written / turns)} | {_size(outcome.read / turns)} | {outcome.last_turn['GET']} "
            f"| {statistics.median(outcome.turn_seconds) * 1000:.1f} | {outcome.turn_seconds[-1] * 1000:.1f} |"
        )
    print(
        f"\nappend stores {snapshot.stored / append.stored:.1f}x less than snapshot, writes "
        f"{snapshot.written / append.written:.1f}x less and reads {append.read / max(snapshot.read, 1):.2f}x as much; "
        f"conversation text: {_size(append.conversation)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
