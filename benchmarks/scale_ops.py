"""
Per-request operations at size, for `scale.py`: a list page at N results, a quota'd first write into a tenant of N
objects, a purge of N objects, an approval round trip at A approvals in the session; and, run on its own, a whole
session's history at L turns, priced per turn (``python benchmarks/scale_ops.py --sessions 1 2 10 50``).

Every figure is counted from the log of moto's S3 server (`LocalS3Server.requests`), real HTTP on loopback. Results
are seeded straight into moto's in-process backend (`S3Backend.put_object`, no HTTP, not in the log), named by the
store's own naming function (`stores.names.new_object_name`, dated one second apart going back from now), so they
are what the store would have written, at 100,000 in seconds rather than the minutes that many PUTs take.
"""

import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "approvals"))

# Test helpers: an approval history written as the code writes it, and a scripted agent.
from approval_history import round_trip
from approval_history import seed as seed_approvals
from approval_scenario import LEDGER_ENV, make_agent
from haystack.components.agents.state.state import State
from haystack.dataclasses import ChatMessage
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy

from haystack_integrations.offload import FsspecToolResultStore, Quota, list_tool_results, offload_context
from haystack_integrations.offload.sessions.conversation_cache import ConversationCache
from haystack_integrations.offload.sessions.errors import StaleHistoryError
from haystack_integrations.offload.sessions.history import SessionHistory
from haystack_integrations.offload.stores.names import new_object_name
from haystack_integrations.offload.testing.local_s3 import LocalS3Server

SESSION_RESULTS = 1000
"""Results per seeded session when a tenant holds more (a long chat's worth; the list page's session holds all N)."""


@dataclass
class Measured:
    """One operation at one size: its S3 requests by kind, the bytes the server sent, and its time."""

    requests: Counter[str] = field(default_factory=Counter)
    sent: int = 0
    seconds: float = 0.0
    cpu: float = 0.0

    @property
    def total(self) -> int:
        """Every request, of any kind."""
        return sum(self.requests.values())

    def kinds(self) -> str:
        """The requests as a cell: ``1 LIST 1 PUT``."""
        return " ".join(f"{count} {kind}" for kind, count in sorted(self.requests.items()) if count) or "none"


def kind_of(method: str, query: str, headers: Callable[[str], str | None]) -> str:
    """A request's kind as the tables name it: LIST, a batched DELETE (POST ?delete), a conditional PUT, or method."""
    if "list-type" in query:
        return "LIST"
    if method == "POST" and query.startswith("delete"):
        return "DELETE batch"
    if method == "PUT" and headers("if-none-match"):
        return "PUT if-none-match"
    return method


async def measure(server: LocalS3Server, operation: Callable[[], Awaitable[Any]]) -> tuple[Measured, Any]:
    """Run `operation` alone against `server` and count what it sent."""
    server.requests.clear()
    started, cpu = time.perf_counter(), time.process_time()
    result = await operation()
    measured = Measured(seconds=time.perf_counter() - started, cpu=time.process_time() - cpu)
    for request in server.requests.snapshot():
        measured.requests[kind_of(request.method, request.query, request.header)] += 1
        measured.sent += request.bytes_sent
    return measured, result


def seed(
    server: LocalS3Server,
    prefix: str,
    count: int,
    *,
    per_session: int = SESSION_RESULTS,
    older: timedelta = timedelta(0),
) -> None:
    """
    Put `count` results of 200 bytes below `prefix` (``<root>/<tenant>``), `per_session` per session (``chat-0``,
    ``chat-1``...), in moto's backend directly. Each is named as the store names a result written `older` plus its
    index in seconds ago.
    """
    # moto is the local-s3 extra's (LocalS3Server needs it too); its backend is reached here only.
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    now, body = datetime.now(UTC) - older, b"x" * 200
    for index in range(count):
        session = f"chat-{index // per_session}"
        created = now - timedelta(seconds=index + 1)
        name = new_object_name(key=f"{index}_search_call{index}.txt", kind="text", tool_name="search", now=created)
        backend.put_object(server.bucket, f"{prefix}/{session}/{name}", body)


def _root(server: LocalS3Server, name: str, **options: Any) -> FsspecToolResultStore:
    """A fresh root store, as a new worker process makes it (no listing, no usage view)."""
    return FsspecToolResultStore(f"{server.bucket_url}/{name}", storage_options=server.storage_options(), **options)


async def list_page(server: LocalS3Server, count: int) -> dict[str, Measured]:
    """The first page of a session holding `count` results: the store's `list_page_async` and the model's tool."""
    name = f"list-{uuid.uuid4().hex[:8]}"
    seed(server, f"{name}/acme", count, per_session=count)
    root = _root(server, name)
    await root.warm_up_async()
    session = root.for_session("acme", "chat-0")
    store, page = await measure(server, lambda: session.list_page_async(limit=20))
    if len(page.results) != 20:
        raise RuntimeError(f"a page of {len(page.results)} results at N={count}")
    state = _state(session)
    tool, text = await measure(server, lambda: list_tool_results.invoke_async(state=state))
    if text.startswith("Error"):
        raise RuntimeError(text)
    return {"store": store, "tool": tool}


def _state(store: FsspecToolResultStore) -> Any:
    # As the Agent builds it for a tool call.
    return State(schema={"hook_context": {"type": dict}}, data={"hook_context": offload_context(store)})


TENANT_QUOTA = Quota(tenant_results=10_000_000, tenant_bytes=2**40)
SESSION_QUOTA = Quota(session_results=10_000_000, session_bytes=2**40)


async def quota_write(server: LocalS3Server, count: int) -> dict[str, Measured]:
    """
    A fresh worker's first write with a `Quota`. Tenant limits, into a tenant holding `count` results: the tenant's
    first quota'd write ever (no usage mark yet), then another fresh worker's once a mark exists. Session limits, into
    a session holding all `count` results.
    """
    rows = {}
    name = f"quota-{uuid.uuid4().hex[:8]}"
    seed(server, f"{name}/acme", count)
    for kind in ("tenant limits, first ever", "tenant limits"):
        session = _root(server, name, quota=TENANT_QUOTA).for_session("acme", "chat-0")
        await session.warm_up_async()
        rows[kind], _ = await measure(server, lambda s=session: s.write_async(key="1_search_q.txt", content="x" * 200))
    name = f"quota-{uuid.uuid4().hex[:8]}"
    seed(server, f"{name}/acme", count, per_session=count)
    session = _root(server, name, quota=SESSION_QUOTA).for_session("acme", "chat-0")
    await session.warm_up_async()
    rows["session limits"], _ = await measure(server, lambda: session.write_async(key="1_search_q.txt", content="x"))
    return rows


async def purge(server: LocalS3Server, count: int) -> dict[str, Measured]:
    """A tenant's purge of `count` results older than a second (named and stored long enough ago): every one goes."""
    name = f"purge-{uuid.uuid4().hex[:8]}"
    seed(server, f"{name}/acme", count, older=timedelta(hours=1))
    await asyncio.sleep(1.5)  # the storage's clock (LastModified) must agree that they are old: a purge checks both
    tenant = _root(server, name).for_tenant("acme")
    await tenant.warm_up_async()
    measured, deleted = await measure(server, lambda: tenant.purge_async(older_than=timedelta(seconds=1)))
    if deleted != count:
        raise RuntimeError(f"purged {deleted} of {count}")
    return {"purge": measured}


async def approvals(server: LocalS3Server, count: int) -> dict[str, Measured]:
    """One durable approval round trip (run stops, pending, decide, resume) in a session holding `count` approvals."""
    os.environ.setdefault(LEDGER_ENV, tempfile.mktemp(prefix="scale-approvals-"))  # noqa: S306 - a scratch name
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    root = _root(server, f"approvals-{uuid.uuid4().hex[:8]}")
    await root.warm_up_async()
    session = root.for_session("bench", "history")
    await seed_approvals(root, session, agent, count)
    await round_trip(agent, session, "warm")  # the first look at a seeded session writes its head
    measured, _ = await measure(server, lambda: round_trip(agent, session, "measured"))
    return {"round trip": measured}


DOLLARS_PER_1000 = {"PUT": 0.005, "PUT if-none-match": 0.005, "LIST": 0.005, "DELETE batch": 0.005, "GET": 0.0004}
"""AWS S3 list prices (Standard, us-east-1) per 1,000 requests."""
RESULT_PUTS = 4
"""The reference turn's offloaded results (issue 42): one PUT each, $20 a million turns, beside the history's cost."""


def per_million_turns(measured: Measured, turns: int) -> float:
    """What `turns` turns' requests cost per million turns, with the reference turn's result PUTs."""
    dollars = sum(DOLLARS_PER_1000[kind] * count for kind, count in measured.requests.items()) / 1000
    return 1e6 * (dollars / turns + RESULT_PUTS * DOLLARS_PER_1000["PUT"] / 1000)


async def session(server: LocalS3Server, length: int) -> dict[str, Measured]:
    """
    A session's whole life of `length` turns on one worker, as `ChatService` runs each (read for a turn, claim, record
    the end; exchanges of two 300-character messages): its first turns are new, the rest warm.
    """
    root = _root(server, f"session-{uuid.uuid4().hex[:8]}")
    await root.check_exclusive_creates_async()  # once per process and root: no session's cost
    history = SessionHistory(root.for_session("acme", "chat-1"), worker="w1", cache=ConversationCache())

    async def turns() -> None:
        for number in range(1, length + 1):
            try:
                turn = await history.begin(await history.read(for_turn=True), kind="message", text=f"q{number}")
            except StaleHistoryError:
                turn = await history.begin(await history.read(), kind="message", text=f"q{number}")
            added = [
                ChatMessage.from_user(f"question {number} " + "q" * 300),
                ChatMessage.from_assistant(f"answer {number} " + "a" * 300),
            ]
            await history.finish(turn, status="completed", messages=[*turn.conversation, *added], reply="a")

    measured, _ = await measure(server, turns)
    return {"whole session": measured}


async def _sessions(lengths: list[int]) -> None:
    print("| turns in the session | history requests, whole session | per turn | $ per million turns |")
    print("|---:|---|---|---:|", flush=True)
    with LocalS3Server() as server:
        for length in lengths:
            measured = (await session(server, length))["whole session"]
            each = " ".join(f"{count / length:.2f} {kind}" for kind, count in sorted(measured.requests.items()))
            print(f"| {length:,} | {measured.kinds()} | {each} | {per_million_turns(measured, length):.2f} |")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="A whole session's history requests per turn, priced.")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 10, 11, 50, 200])
    asyncio.run(_sessions(parser.parse_args().sessions))
