"""
Approvals under faults: the reference server's message -> approval -> decide -> resume flow, exactly once or not?

Many sessions run the flow of `ChatService` (the framework-free core of ``offload-haystack serve``) on moto's S3
server, every S3 request through `FaultProxy`, which fails none of them (the baseline) or a share of them: a reset after
the request reached S3 (``reset-after``), ``503 SlowDown`` and an answer withheld until the client's read timeout
(``timeout``). Other runs SIGKILL a worker process at random points of the flow.

The worker side runs in child processes, as a server's workers would: each serves a share of the sessions and answers
the calls a web handler would make (`ChatService.send_message`, `decide`, `resume`, `pending`, `transcript`); a killed
worker is replaced by a new process and its clients retry against another worker. The Agent's model is scripted
(Haystack's `MockChatGenerator`, driven by the conversation alone, so any process can continue any conversation). In
each session the user asks for four calls in one step:

- ``send_invoice`` x2, under ``ApprovalHook({"send_invoice": AlwaysAskPolicy()})``: one approved, one approved or
  denied (by session);
- ``delete_file``, under a second ``ApprovalHook``: approved or denied (by session);
- ``wipe``, blocked by a plain Haystack ``@hook`` guardrail between the two approval hooks: it must never run.

Every tool appends one line (its call, `current_idempotency_key()`, its process) to a ledger file opened with
``O_APPEND``, so executions are counted across processes. The client decides each pending request as planned, approves
``may-have-run`` requests (a retry with the same idempotency key), and on a retryable error (storage unavailable, an
unknown create outcome, a busy session, a 409 or 502 of the server, a worker that died) retries with bounded backoff,
reading ``pending`` and the transcript to learn where the flow stands, as a web client would.

Reported per run, from the ledger and from the store read directly (around the proxy) after the flows ended, every lease
passed, and a later client (faults off) tried to finish each flow whose client gave up at its deadline, as a person
coming back to the page would (``--no-settle``: checked as the run left them): approved calls executed exactly once /
once more with the same idempotency key after a ``may-have-run`` approval / never / twice or more; unapproved or guarded
calls executed; sessions stuck (a step still open, a request still pending, a turn still running); executed calls whose
result is not in the transcript, and denied or blocked calls whose error answer is not; executed calls whose request or
decision is missing from the audit ("audit gaps"); decisions answered "resumed elsewhere" (with no kills, each is a
phantom: a client has one request in flight per session); resumes the client had to ask for, where the page offers
Continue and where it offers none (a person could not go on); requests a live worker never answered (it is then
restarted, as a process manager's worker timeout would); and the cost against the fault-free run: S3 requests per
session (as the proxy saw them) and the decide -> resumed round trip (from the client's last decision of a step to the
resumed turn's answer, retries included).

Run from the repository root (about four and a half minutes on two cores; ``--quick`` about half a minute)::

    PYTHONPATH=src python benchmarks/approvals_under_faults.py
    PYTHONPATH=src python benchmarks/approvals_under_faults.py --quick

``--server azurite`` (``az://``, adlfs or ``--engine obstore``) and ``--server fake-gcs`` (``gs://``, gcsfs) run the
same flow on those emulators (tests/support/), the proxy in front of them; every fault kind is plain HTTP, so all apply.

Prints Markdown tables (the ones in benchmarks/README.md) and, with ``--json PATH``, writes the raw numbers.
"""

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from haystack.components.agents import Agent
from haystack.components.agents.state.state import State
from haystack.components.agents.state.state_utils import replace_values
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.hooks import hook
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy
from haystack.tools.tool import Tool

from haystack_integrations.offload import ApprovalHook, FsspecToolResultStore, RetryPolicy
from haystack_integrations.offload.approvals.decisions import open_step_async
from haystack_integrations.offload.approvals.ledger import ApprovalLedger, sequence_of
from haystack_integrations.offload.approvals.resume import current_idempotency_key
from haystack_integrations.offload.sessions.service import ChatService

BUCKET = "offload-approvals-faults"
EMULATORS = ("azurite", "fake-gcs")
"""Servers other than S3: the same flow on ``az://`` (Azurite) and ``gs://`` (fake-gcs-server), the proxy in front."""
TENANTS = 4
MAY_HAVE_RUN = "may-have-run"
FAULT_KINDS = ["reset-after", "503", "timeout"]
# Client-side S3 settings: a withheld answer costs the read timeout, then the store retries (bounded).
S3_TIMEOUTS = {"read_timeout": 1.0, "connect_timeout": 1.0}


SETTLE_TIMEOUT = 60.0
"""How long a later client has to finish a flow the run left unfinished (faults off), before the check: what it cannot
finish is lost or stuck; what it finishes was only left unfinished when the flow's client gave up."""
RETRY = RetryPolicy(attempts=4, base_delay=0.05, max_delay=0.5, deadline=10.0, attempt_timeout=3.0)
_TESTS = Path(__file__).resolve().parents[1] / "tests"
"""The test rigs this benchmark borrows (tests/support/): the Ceph RGW launcher and the isolation the RGW lane uses."""
LEASE = 3.0
"""Seconds of both leases (a turn's, a resuming worker's claim), so a dead worker's work is recovered within the run."""
CALL_TIMEOUT = 30.0
"""A request a worker has not answered after this long is given up by its client, and the worker is restarted (as a
process manager's worker timeout does, gunicorn's 30 s default). No request should come near it: each S3 operation
gives up after 10 s."""

# The tools: every execution appends a line to the ledger (O_APPEND: whole lines, whatever the process).

INVOICE_SCHEMA = {
    "type": "object",
    "properties": {"ref": {"type": "string"}, "amount": {"type": "integer", "minimum": 1}},
    "required": ["ref", "amount"],
    "additionalProperties": False,
}
REF_SCHEMA = {
    "type": "object",
    "properties": {"ref": {"type": "string"}},
    "required": ["ref"],
    "additionalProperties": False,
}
_TOOLS: dict[str, Any] = {"ledger": None, "die_at": None, "executions": 0}
"""Per worker process: the ledger's path, and the execution after whose side effect the process SIGKILLs itself."""


def _record(tool: str, ref: str) -> str:
    line = json.dumps({"tool": tool, "ref": ref, "key": current_idempotency_key(), "pid": os.getpid()}) + "\n"
    fd = os.open(_TOOLS["ledger"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    _TOOLS["executions"] += 1
    if _TOOLS["die_at"] == _TOOLS["executions"]:
        os.kill(os.getpid(), signal.SIGKILL)  # the side effect happened; the worker dies before it can say so
    return f"{tool} done: {ref}"


def send_invoice(ref: str, amount: int) -> str:
    """Send an invoice (a side effect that must happen exactly once)."""
    return _record("send_invoice", ref)


def delete_file(ref: str) -> str:
    """Delete a file."""
    return _record("delete_file", ref)


def wipe(ref: str) -> str:
    """Wipe a disk: the guardrail must keep this from ever running."""
    return _record("wipe", ref)


@hook
def block_wipe(state: State) -> None:
    """A plain Haystack guardrail: answers every ``wipe`` call with an error result instead of letting it run."""
    messages = state.data.get("messages") or []
    if not messages or not messages[-1].tool_calls:
        return
    message = messages[-1]
    blocked = [call for call in message.tool_calls if call.tool_name == "wipe"]
    if not blocked:
        return
    running = [call for call in message.tool_calls if call.tool_name != "wipe"]
    shaped: list[ChatMessage] = []
    for call in blocked:
        shaped.append(ChatMessage.from_assistant(tool_calls=[call]))
        shaped.append(ChatMessage.from_tool(tool_result="blocked by policy", origin=call, error=True))
    if running:
        shaped.append(ChatMessage.from_assistant(text=message.text, tool_calls=running))
    state.set("messages", messages[:-1] + shaped, handler_override=replace_values)


def script(messages: list[ChatMessage]) -> ChatMessage:
    """The model: a user message holding a JSON list of calls asks for them; after tool results, a final answer."""
    last = messages[-1]
    if last.is_from(ChatRole.USER) and last.text and last.text.startswith("["):
        calls = [ToolCall(tool_name=c["tool"], arguments=c["arguments"], id=c["id"]) for c in json.loads(last.text)]
        return ChatMessage.from_assistant("On it.", tool_calls=calls)
    answered = sum(1 for message in messages if message.tool_call_result is not None)
    return ChatMessage.from_assistant(f"final: {answered} tool results")


def build_agent() -> Agent:
    """The Agent every worker runs: two approval hooks with a guardrail between them."""
    tools = [
        Tool(name="send_invoice", description="Send an invoice.", parameters=INVOICE_SCHEMA, function=send_invoice),
        Tool(name="delete_file", description="Delete a file.", parameters=REF_SCHEMA, function=delete_file),
        Tool(name="wipe", description="Wipe a disk.", parameters=REF_SCHEMA, function=wipe),
    ]
    hooks: list[Any] = [
        ApprovalHook({"send_invoice": AlwaysAskPolicy()}),
        block_wipe,
        ApprovalHook({"delete_file": AlwaysAskPolicy()}),
    ]
    agent = Agent(chat_generator=MockChatGenerator(response_fn=script), tools=tools, hooks={"before_tool": hooks})
    agent.warm_up()
    return agent


# The sessions and what each call should come to


@dataclass(frozen=True)
class SessionPlan:
    """One session: its scope, the calls the user asks for, and the decision planned for each."""

    index: int
    tenant: str
    session: str
    calls: tuple[tuple[str, str, bool | None], ...]
    """(tool call id, tool, approve?) with None for a call no person decides (the guardrail blocks it)."""

    @property
    def text(self) -> str:
        asked = []
        for call_id, tool, _ in self.calls:
            arguments: dict[str, Any] = {"ref": self.ref(call_id)}
            if tool == "send_invoice":
                arguments["amount"] = 10 + self.index
            asked.append({"tool": tool, "arguments": arguments, "id": call_id})
        return json.dumps(asked)

    def ref(self, call_id: str) -> str:
        return f"{self.tenant}/{self.session}/{call_id}"

    def approve(self, tool_call_id: str) -> bool:
        return next(bool(approve) for call_id, _, approve in self.calls if call_id == tool_call_id)


def session_plans(count: int, run: str) -> list[SessionPlan]:
    plans = []
    for index in range(count):
        calls = (
            ("inv-1", "send_invoice", True),
            ("inv-2", "send_invoice", index % 2 == 0),
            ("del-1", "delete_file", index % 3 != 0),
            ("wipe-1", "wipe", None),
        )
        plans.append(SessionPlan(index, f"tenant-{index % TENANTS}", f"{run}-chat-{index}", calls))
    return plans


# Server processes: the S3 server (moto's, or a one-node Ceph RGW) and the fault proxy, each in a process of its own


def _s3_process(connection: Connection, server_kind: str, isolation: bool) -> None:
    # The Ceph, Azurite and fake-gcs-server launchers are test rigs of ours (tests/support/), not part of the library.
    sys.path.insert(0, str(_TESTS))
    if server_kind in EMULATORS:
        _emulator_process(connection, server_kind)
        return
    from haystack_integrations.offload.testing.local_s3 import LocalS3Server
    from support.ceph_rgw import CephRGWServer

    server = CephRGWServer(bucket=BUCKET, sts=isolation) if server_kind == "rgw" else LocalS3Server(bucket=BUCKET)
    with server:
        # With isolation, the role every tenant's STS credentials come from (as the RGW lane's `real_s3_tenant_role`).
        role_arn = server.create_tenant_role() if isolation else None
        options = server.storage_options()
        connection.send(
            {"options": options, "role_arn": role_arn, "root": f"s3://{BUCKET}", "upstream": options["endpoint_url"]}
        )
        while connection.recv() != "stop":
            pass
        connection.send(None)


def _emulator_process(connection: Connection, server_kind: str) -> None:
    """Azurite (``az://``, adlfs or obstore) or fake-gcs-server (``gs://``, gcsfs), with a container/bucket made."""
    server: Any
    if server_kind == "azurite":
        from support.azurite import AzuriteServer

        server = AzuriteServer()
        upstream = f"http://127.0.0.1:{server.port}"  # the account is the path's first segment, kept by the proxy
    else:
        from support.fake_gcs import FakeGCS

        server = FakeGCS()
        upstream = server.endpoint
    with server:
        root = server.bucket_url
        connection.send({"options": server.storage_options(), "role_arn": None, "root": root, "upstream": upstream})
        while connection.recv() != "stop":
            pass
        connection.send(None)


def proxied_options(server_kind: str, engine: str, options: dict[str, Any], proxy_url: str) -> dict[str, Any]:
    """
    The storage options that send every request of `server_kind`'s client through the fault proxy at `proxy_url`.

    :param server_kind: ``moto``/``rgw`` (S3), ``azurite`` or ``fake-gcs``.
    :param engine: The store's engine (obstore on Azure refuses a read timeout: its attempt timeout bounds a request).
    :param options: The server's own storage options.
    :param proxy_url: The proxy's endpoint.
    :returns: The options, with the proxy as the endpoint and client timeouts as short as the S3 runs' where the
        client takes them.
    """
    if server_kind == "azurite":
        # adlfs and obstore read the endpoint from the connection string's BlobEndpoint: the proxy, then the account.
        endpoint = options["connection_string"].split("BlobEndpoint=", 1)[1].split(";", 1)[0]
        account = urlsplit(endpoint).path
        through: dict[str, Any] = {
            "connection_string": options["connection_string"].replace(endpoint, f"{proxy_url}{account}")
        }
        # A per-read timeout, as botocore's in the S3 runs: adlfs's (azure-core's), which the obstore engine maps to
        # object_store's read timeout. Without it a withheld answer cost obstore the whole 3 s attempt (issue 46).
        through["connection_timeout"] = 1
        through["read_timeout"] = 1
        return through
    if server_kind == "fake-gcs":
        # gcsfs takes aiohttp's timeouts as `requests_timeout`: a per-read one, else a withheld answer costs the whole
        # 3 s attempt (the store's attempt timeout), three times adlfs's and botocore's 1 s.
        timeouts = aiohttp.ClientTimeout(
            sock_connect=S3_TIMEOUTS["connect_timeout"], sock_read=S3_TIMEOUTS["read_timeout"]
        )
        return {**options, "endpoint_url": proxy_url, "requests_timeout": timeouts}
    return {**options, "endpoint_url": proxy_url, "config_kwargs": S3_TIMEOUTS}


def _proxy_process(connection: Connection, upstream: str) -> None:
    # The proxy resets connections on purpose; asyncio would log each reset copy task it never awaited.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    from haystack_integrations.offload.testing.faults import FaultPlan, FaultProxy

    with FaultProxy(upstream, hold_seconds=5.0) as proxy:
        connection.send(proxy.endpoint_url)
        while (command := connection.recv())[0] != "stop":
            name, argument = command
            if name == "plan":
                rate, seed = argument
                proxy.plan = FaultPlan(rate=rate, kinds=FAULT_KINDS, seed=seed) if rate else FaultPlan()
                proxy.faults.clear()
                proxy.requests.clear()
                connection.send(None)
            elif name == "report":
                requests = proxy.requests.snapshot()
                connection.send(
                    {
                        "requests": len(requests),
                        "methods": dict(Counter(request.method for request in requests)),
                        "faults": {kind.value: count for kind, count in proxy.faults.counts().items()},
                    }
                )
        connection.send(None)


class ServerProcess:
    """A child process obeying commands over a pipe."""

    def __init__(self, target: Callable[..., None], *args: Any) -> None:
        self._connection, child = multiprocessing.Pipe()
        self._process = multiprocessing.get_context("spawn").Process(target=target, args=(child, *args), daemon=True)
        self._process.start()
        child.close()
        self.hello = self._connection.recv()

    def ask(self, command: Any) -> Any:
        self._connection.send(command)
        return self._connection.recv()

    def stop(self, command: Any) -> None:
        with contextlib.suppress(OSError, EOFError):
            self.ask(command)
        self._process.join(timeout=10)


# Worker processes: what a server's worker does per request, answering over a pipe


@dataclass(frozen=True)
class WorkerConfig:
    url: str
    storage_options: dict[str, Any]
    ledger: str
    name: str
    die_at: int | None = None
    """SIGKILL this process right after the side effect of its n-th tool execution (None: never)."""
    engine: str = "fsspec"
    isolation: "Isolation | None" = None


@dataclass(frozen=True)
class Isolation:
    """
    Per-tenant isolation on RGW, as the tests' isolated lane builds its stores (``tests/support/isolation.py``): every
    tenant's requests sign with STS credentials of `role_arn` limited to its prefix, and each tenant has its own SSE-C
    key. STS is asked directly (`sts_endpoint_url`, not through the fault proxy): the faults are the object store's.
    """

    role_arn: str
    sts_endpoint_url: str

    def store_kwargs(self) -> dict[str, Any]:
        """The store's ``credentials`` and ``encryption`` arguments."""
        if str(_TESTS) not in sys.path:
            sys.path.insert(0, str(_TESTS))
        from support.isolation import isolation_kwargs

        return isolation_kwargs(self.role_arn, sts_endpoint_url=self.sts_endpoint_url)


def _store(url: str, storage_options: dict[str, Any], engine: str, isolation: Isolation | None, **kwargs: Any) -> Any:
    """A root store on `url`, isolated per tenant when `isolation` is given."""
    extra = isolation.store_kwargs() if isolation is not None else {}
    return FsspecToolResultStore(url, storage_options=storage_options, engine=engine, **extra, **kwargs)


def _requests_of(pending: list[Any]) -> list[dict[str, Any]]:
    return [
        {"request_id": r.request_id, "tool_call_id": r.tool_call_id, "tool_name": r.tool_name, "guard": r.guard}
        for r in pending
    ]


async def _transcript(service: ChatService, store: FsspecToolResultStore) -> dict[str, Any]:
    transcript = await service.transcript(store)
    messages = transcript.messages
    last = messages[-1] if messages else None
    finished = (
        transcript.status == "completed"
        and not transcript.busy
        and last is not None
        and last.is_from(ChatRole.ASSISTANT)
        and not last.tool_calls
        and (last.text or "").startswith("final:")
    )
    return {
        "status": transcript.status,
        "busy": transcript.busy,
        "resumable": transcript.resumable,
        "finished": finished,
        "user_texts": [m.text for m in messages if m.is_from(ChatRole.USER)],
        "results": {
            str(m.tool_call_result.origin.id): m.tool_call_result.error for m in messages if m.tool_call_result
        },
    }


async def _serve(service: ChatService, root: FsspecToolResultStore, op: str, args: dict[str, Any]) -> Any:
    store = root.for_session(args["tenant"], args["session"])
    if op == "send":
        turn = await service.send_message(store, args["text"], actor="client")
        return {"status": turn.status, "pending": _requests_of(turn.pending)}
    if op == "decide":
        outcome = await service.decide(
            store, args["request_id"], approved=args["approved"], reason=args.get("reason"), actor="client"
        )
        return {
            "pending": _requests_of(outcome.pending),
            "resumed": outcome.resumed.status if outcome.resumed is not None else None,
            "elsewhere": outcome.resumed_elsewhere,
        }
    if op == "resume":
        turn = await service.resume(store, actor="client")
        return {"status": turn.status, "pending": _requests_of(turn.pending)}
    if op == "pending":
        return _requests_of(await service.pending(store))
    if op == "transcript":
        return await _transcript(service, store)
    raise ValueError(f"unknown op {op!r}")


def _describe(error: BaseException) -> dict[str, Any]:
    cause = error.__cause__
    return {
        "type": type(error).__name__,
        "mro": [klass.__name__ for klass in type(error).__mro__],
        "cause": type(cause).__name__ if cause is not None else None,
        "cause_mro": [klass.__name__ for klass in type(cause).__mro__] if cause is not None else [],
        "message": str(error)[:300],
        # Where an unexpected failure came from, for the report (the last frames of the cause, or of the error).
        "where": "".join(traceback.format_exception(cause or error)[-3:])[-1200:],
    }


def _worker_process(connection: Connection, config: WorkerConfig) -> None:
    logging.disable(logging.CRITICAL)  # the flows fail on purpose; the benchmark counts what happened
    _TOOLS.update(ledger=config.ledger, die_at=config.die_at, executions=0)
    asyncio.run(_worker(connection, config))
    os._exit(0)  # skip the interpreter's teardown: aiohttp would warn about the S3 sessions it still holds


async def _worker(connection: Connection, config: WorkerConfig) -> None:
    root = _store(config.url, config.storage_options, config.engine, config.isolation, retry=RETRY)
    await root.warm_up_async()
    service = ChatService(build_agent(), turn_lease=LEASE, resume_lease=LEASE, worker=config.name)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()

    async def handle(number: int, op: str, args: dict[str, Any]) -> None:
        try:
            answer: tuple[int, bool, Any] = (number, True, await _serve(service, root, op, args))
        except Exception as error:  # every failure goes back to the client, which decides whether to retry
            answer = (number, False, _describe(error))
        connection.send(answer)

    def start(message: tuple[int, str, dict[str, Any]]) -> None:
        task = loop.create_task(handle(*message))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def read() -> None:
        while True:
            try:
                message = connection.recv()
            except (EOFError, OSError):
                message = None
            if message is None:
                loop.call_soon_threadsafe(stop.set)
                return
            loop.call_soon_threadsafe(start, message)

    threading.Thread(target=read, daemon=True).start()
    connection.send(("ready", os.getpid()))
    await stop.wait()


class WorkerDiedError(ConnectionError):
    """The worker process serving a request died before it answered (the client sees a dropped connection)."""


class RemoteError(Exception):
    """A worker answered a request with an error."""

    def __init__(self, described: dict[str, Any]) -> None:
        super().__init__(f"{described['type']}: {described['message']}")
        self.type: str = described["type"]
        self.mro: list[str] = described["mro"]
        self.cause: str | None = described["cause"]
        self.cause_mro: list[str] = described["cause_mro"]
        self.where: str = described["where"]

    @property
    def expected(self) -> bool:
        """Whether a client retries this (a 409/503-like answer, or a 502 whose cause was the storage)."""
        if self.type == "RunFailedError":
            return self.cause is None or any(name in RETRYABLE for name in self.cause_mro)
        return any(name in RETRYABLE for name in self.mro)


class Worker:
    """The client side of one worker process: requests go out over a pipe, answers resolve futures."""

    _numbers = itertools.count(1)

    def __init__(self, config: WorkerConfig, on_death: Callable[["Worker"], None]) -> None:
        self.config = config
        self._loop = asyncio.get_running_loop()
        self._connection, child = multiprocessing.Pipe()
        self.process = multiprocessing.get_context("spawn").Process(
            target=_worker_process, args=(child, config), daemon=True
        )
        self.process.start()
        child.close()
        self.ready: asyncio.Future[int] = self._loop.create_future()
        self.alive = True
        self.hung = False
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._ops: dict[int, str] = {}
        self.cut: Counter[str] = Counter()
        """The requests in flight when this worker died, by operation."""
        self._on_death = on_death
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                message = self._connection.recv()
            except (EOFError, OSError):
                with contextlib.suppress(RuntimeError):  # the benchmark's loop may be closed by now
                    self._loop.call_soon_threadsafe(self._died)
                return
            self._loop.call_soon_threadsafe(self._deliver, message)

    def _deliver(self, message: tuple[Any, ...]) -> None:
        if message[0] == "ready":
            if not self.ready.done():
                self.ready.set_result(message[1])
            return
        number, ok, payload = message
        future = self._waiting.pop(number, None)
        if future is None or future.done():
            return
        if ok:
            future.set_result(payload)
        else:
            future.set_exception(RemoteError(payload))

    def _died(self) -> None:
        if not self.alive:
            return
        self.alive = False
        for number, future in self._waiting.items():
            if not future.done():
                self.cut[self._ops.get(number, "?")] += 1
                future.set_exception(WorkerDiedError(f"worker {self.config.name} died"))
        self._waiting.clear()
        if not self.ready.done():
            self.ready.set_exception(WorkerDiedError(f"worker {self.config.name} died while starting"))
        self._on_death(self)

    async def call(self, op: str, args: dict[str, Any]) -> Any:
        if not self.alive:
            raise WorkerDiedError(f"worker {self.config.name} is gone")
        number = next(self._numbers)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._waiting[number] = future
        self._ops[number] = op
        try:
            self._connection.send((number, op, args))
        except OSError:
            self._died()
        try:
            return await asyncio.wait_for(future, CALL_TIMEOUT)
        except TimeoutError:
            self.hung = True  # the watchdog: a worker that does not answer is replaced
            self.kill()
            raise
        finally:
            self._waiting.pop(number, None)
            self._ops.pop(number, None)

    def kill(self) -> None:
        if self.alive and self.process.pid is not None:
            os.kill(self.process.pid, signal.SIGKILL)

    def stop(self) -> None:
        if self.alive:
            with contextlib.suppress(OSError):
                self._connection.send(None)
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.kill()
            self.process.join(timeout=5)


class WorkerPool:
    """Worker slots; a worker that dies is replaced by a new process in its slot (as a process manager would)."""

    def __init__(self, count: int, make_config: Callable[[int, int], WorkerConfig]) -> None:
        self._make_config = make_config
        self._generation = itertools.count(1)
        self.slots: list[Worker] = []
        self.deaths = 0
        self.restarted_hung = 0
        self.cut: Counter[str] = Counter()
        self.started = 0
        for slot in range(count):
            self.slots.append(self._start(slot))

    def _start(self, slot: int) -> Worker:
        self.started += 1
        return Worker(self._make_config(slot, next(self._generation)), self._replace)

    def _replace(self, worker: Worker) -> None:
        if worker.hung:
            self.restarted_hung += 1
        else:
            self.deaths += 1
        self.cut.update(worker.cut)
        if self._closing:
            return
        for slot, current in enumerate(self.slots):
            if current is worker:
                self.slots[slot] = self._start(slot)

    _closing = False

    async def wait_ready(self) -> None:
        await asyncio.gather(*(worker.ready for worker in self.slots))

    async def route(self, session_index: int, avoid: Worker | None) -> Worker:
        """The session's own worker, or the next live one (a client retries elsewhere after a dropped connection)."""
        count = len(self.slots)
        for attempt in range(400):
            for shift in range(count):
                worker = self.slots[(session_index + shift) % count]
                if worker.alive and worker is not avoid and worker.ready.done() and not worker.ready.exception():
                    return worker
            avoid = None if attempt else avoid
            await asyncio.sleep(0.05)
        raise WorkerDiedError("no worker is alive")

    def close(self) -> None:
        self._closing = True
        for worker in self.slots:
            worker.stop()


# The client: one session's flow, retried like a web client would


RETRYABLE = {
    "StorageUnavailableError",  # also CreateOutcomeUnknownError (a subclass)
    "SessionBusyError",
    "TurnAbandonedError",
    "ApprovalPendingConflict",
    "NothingToResumeError",
    "ApprovalAlreadyDecidedError",
    "RunFailedError",
    "ResumeInterruptedError",  # as the cause of a 502: the calls ran, continuing failed (retried by resume)
}


def _cause_of(error: BaseException) -> str:
    """A short name for why a call failed, for the retry tally."""
    if isinstance(error, WorkerDiedError):
        return "worker died"
    if isinstance(error, TimeoutError):
        return "no answer (worker restarted)"
    if isinstance(error, RemoteError):
        if error.type == "RunFailedError" and error.cause:
            return f"RunFailedError({error.cause})"
        return error.type
    return type(error).__name__


@dataclass
class FlowResult:
    index: int
    finished: bool = False
    gave_up: str | None = None
    retries: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    hung: list[str] = field(default_factory=list)
    round_trips: list[float] = field(default_factory=list)
    may_have_run_asks: int = 0
    calls: int = 0
    elsewhere: int = 0
    """Decisions answered "resumed elsewhere"."""
    continues: int = 0
    """Resumes the client asked for where the page offers Continue (the step is decided, nothing resumes it)."""
    no_continue: int = 0
    """Resumes the client asked for where the page offers no Continue (a person could not go on)."""
    stalls: list[str] = field(default_factory=list)


class Client:
    """Drives one session through the flow against the pool, observing state after every failure."""

    def __init__(
        self, pool: WorkerPool, plan: SessionPlan, timeout: float, rng: random.Random, *, settling: bool = False
    ) -> None:
        self.pool = pool
        self.plan = plan
        self.settling = settling
        """A later client of a flow the run left unfinished: its message was sent; it decides and resumes."""
        self.deadline = time.monotonic() + timeout
        self.rng = rng
        self.result = FlowResult(plan.index)
        self._avoid: Worker | None = None
        self._asked: set[str] = set()

    async def call(self, op: str, **args: Any) -> Any:
        worker = await self.pool.route(self.plan.index, self._avoid)
        self._avoid = None
        self.result.calls += 1
        try:
            return await worker.call(op, {"tenant": self.plan.tenant, "session": self.plan.session, **args})
        except WorkerDiedError:
            self._avoid = worker
            raise
        except TimeoutError:
            self._avoid = worker
            self.result.hung.append(f"no answer to {op!r} from worker {worker.config.name} in {CALL_TIMEOUT:.0f} s")
            raise

    async def run(self) -> FlowResult:
        sent, unsure = self.settling, False
        seen_step = self.settling
        waiting_since: float | None = None
        """When the client sent the last decision of a step whose resumed turn it has not seen yet."""
        waiting_step: str | None = None
        failures = 0
        nothing_to_resume = 0
        while time.monotonic() < self.deadline:
            try:
                if not sent:
                    if unsure:
                        # A send failed: was the message taken? Ask before sending it again.
                        if await self.call("pending"):
                            sent = seen_step = True
                            continue
                        state = await self.call("transcript")
                        if self.plan.text in state["user_texts"] or state["results"]:
                            sent = True
                            continue
                        if state["busy"]:
                            raise _Wait
                    unsure = True
                    await self.call("send", text=self.plan.text)
                    sent = seen_step = True
                    failures = 0
                    continue
                pending = await self.call("pending")
                if pending:
                    seen_step = True
                    step = pending[0]["request_id"].rsplit("-", 1)[0]
                    if waiting_since is not None and step != waiting_step:
                        # The step was resumed (by a request whose answer was lost): this is the next one.
                        self.result.round_trips.append(time.monotonic() - waiting_since)
                        waiting_since = None
                    for position, request in enumerate(pending):
                        if request["guard"] == MAY_HAVE_RUN:
                            approve = True  # the designed answer: run it again with the same idempotency key
                            if request["request_id"] not in self._asked:
                                self.result.may_have_run_asks += 1
                        else:
                            approve = self.plan.approve(request["tool_call_id"])
                        self._asked.add(request["request_id"])
                        if position == len(pending) - 1 and waiting_since is None:
                            waiting_since, waiting_step = time.monotonic(), step
                        try:
                            outcome = await self.call(
                                "decide",
                                request_id=request["request_id"],
                                approved=approve,
                                reason=None if approve else "not approved",
                            )
                        except RemoteError as error:
                            if error.type != "ApprovalAlreadyDecidedError":
                                raise
                            continue  # an earlier try whose answer was lost had recorded it
                        self.result.elsewhere += bool(outcome["elsewhere"])
                        if (outcome["resumed"] is not None or outcome["elsewhere"]) and waiting_since is not None:
                            self.result.round_trips.append(time.monotonic() - waiting_since)
                            waiting_since = None
                    failures = 0
                    continue
                state = await self.call("transcript")
                if state["finished"]:
                    if waiting_since is not None:
                        self.result.round_trips.append(time.monotonic() - waiting_since)
                    self.result.finished = True
                    return self.result
                if state["busy"]:
                    raise _Wait
                if not seen_step and not state["results"]:
                    sent, unsure = False, True  # the message never held a step: send it (again)
                    continue
                # Decided but not resumed (the decide's resume failed, or its worker died): resume it.
                if state["resumable"]:
                    self.result.continues += 1
                else:
                    self.result.no_continue += 1
                stall = None if state["resumable"] else f"{self.plan.session}: no Continue offered at {state['status']}"
                if waiting_since is None:
                    waiting_since = time.monotonic()
                try:
                    await self.call("resume")
                except RemoteError as error:
                    if stall is not None:
                        self.result.stalls.append(f"{stall}; resume answered {error.type}")
                    if error.type == "NothingToResumeError":
                        nothing_to_resume += 1
                        if nothing_to_resume >= 3:
                            self.result.gave_up = "nothing to resume, no final answer"
                            return self.result
                    raise
                if stall is not None:
                    self.result.stalls.append(f"{stall}; resume ran")
                self.result.round_trips.append(time.monotonic() - waiting_since)
                waiting_since = None
                failures = 0
            except _Wait:
                self.result.retries["busy (turn running)"] += 1
                failures += 1
                await self._backoff(failures)
            except (RemoteError, WorkerDiedError, TimeoutError) as error:
                cause = _cause_of(error)
                self.result.retries[cause] += 1
                if isinstance(error, RemoteError) and error.type == "RunFailedError" and not error.expected:
                    # A 502 a client retries, but not one the faults explain: keep where it came from.
                    if len(self.result.unexpected) < 3:
                        self.result.unexpected.append(f"{error} caused by {error.cause}: {error.where}")
                elif isinstance(error, RemoteError) and not error.expected:
                    # Not something a client retries (a 4xx of the server, or a bug): stop, and report it.
                    self.result.unexpected.append(str(error))
                    self.result.gave_up = f"unexpected {error.type}"
                    return self.result
                failures += 1
                await self._backoff(failures)
        self.result.gave_up = "deadline"
        return self.result

    async def _backoff(self, failures: int) -> None:
        ceiling = min(2.0, 0.1 * 2 ** min(failures - 1, 6))
        await asyncio.sleep(self.rng.uniform(ceiling / 2, ceiling))


class _Wait(Exception):
    """The session is busy (a turn runs, or a dead worker's lease has not passed): try again later."""


# Checking what happened, from the ledger and the store read directly


@dataclass
class Scenario:
    name: str
    fault_rate: float = 0.0
    kills: str | None = None
    """None, "instants" (SIGKILL a random worker at random times) or "mid-call" (right after a side effect)."""


@dataclass
class RunResult:
    scenario: str
    sessions: int
    wall_s: float
    approved: int = 0
    once: int = 0
    same_key_retried: int = 0
    never: int = 0
    twice: int = 0
    unapproved_run: int = 0
    stuck: int = 0
    results_missing: int = 0
    answers_missing: int = 0
    unfinished: int = 0
    settled: int = 0
    """Of the unfinished flows, those a later client finished (faults off) before the check."""
    may_have_run_asks: int = 0
    elsewhere: int = 0
    continues: int = 0
    no_continue: int = 0
    audit_gaps: int = 0
    """Calls whose audit is wrong as the flows left it: a call that ran without its request's `approval.requested`,
    `approval.decided` and exactly one `approval.executed`, or a call that never ran with an `approval.executed`."""
    audit_gaps_after_read: int = 0
    """Of those, the ones still wrong after the checker's own reads (which repair a finished step's executed events)."""
    kills: int = 0
    hung_requests: int = 0
    """Requests a live worker never answered (its worker was restarted after `CALL_TIMEOUT`)."""
    cut_requests: dict[str, int] = field(default_factory=dict)
    """Requests in flight at a killed worker, by operation (the client saw its connection drop)."""
    s3_requests: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    methods: dict[str, int] = field(default_factory=dict)
    """S3 requests by HTTP method, as the proxy saw them."""
    round_trip_p50_ms: float = 0.0
    round_trip_p95_ms: float = 0.0
    round_trips: int = 0
    retries: dict[str, int] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def read_ledger(path: Path) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            runs.setdefault(entry["ref"], []).append(entry)
    return runs


async def check(
    plans: list[SessionPlan], flows: list[FlowResult], root: FsspecToolResultStore, ledger: Path, result: RunResult
) -> None:
    service = ChatService(build_agent(), turn_lease=LEASE, resume_lease=LEASE, worker="checker")
    runs = read_ledger(ledger)
    for plan, flow in zip(plans, flows, strict=True):
        store = root.for_session(plan.tenant, plan.session)
        # The audit first, as the flows left it: the reads below (pending, the open step) repair a finished step's
        # missing `approval.executed` events, as any request would, and would hide what a failed append left.
        left = await service.audit(store)
        transcript = await service.transcript(store)
        answered = {
            str(m.tool_call_result.origin.id): m.tool_call_result for m in transcript.messages if m.tool_call_result
        }
        pending = await service.pending(store)
        step = await open_step_async(store)
        after = await service.audit(store) if _audit_faults(plan, runs, left) else left
        if pending or step is not None or transcript.busy:
            result.stuck += 1
            result.notes.append(
                f"{plan.session}: stuck ({len(pending)} pending, step open: {step is not None}, "
                f"busy: {transcript.busy}, last turn: {transcript.status})"
            )
        if not flow.finished:
            result.unfinished += 1
            result.notes.append(f"{plan.session}: flow not finished ({flow.gave_up}), last turn {transcript.status}")
        for call_id, tool, approve in plan.calls:
            executed = runs.get(plan.ref(call_id), [])
            if approve:
                result.approved += 1
                keys = {entry["key"] for entry in executed}
                if len(executed) == 1:
                    result.once += 1
                elif not executed:
                    result.never += 1
                    result.notes.append(f"{plan.session}/{call_id}: approved, never ran")
                elif len(keys) == 1 and None not in keys:
                    result.same_key_retried += 1
                else:
                    result.twice += 1
                    result.notes.append(
                        f"{plan.session}/{call_id}: ran {len(executed)} times, keys {sorted(map(str, keys))}"
                    )
            elif executed:
                result.unapproved_run += 1
                result.notes.append(f"{plan.session}/{call_id}: {tool} ran without approval ({len(executed)}x)")
            fault = _audit_fault(call_id, executed, left)
            if fault is not None:
                result.audit_gaps += 1
                still = _audit_fault(call_id, executed, after)
                then = f"still after the checker's reads: {still}" if still else "repaired by the checker's reads"
                trail = [(e.event, e.request_id, e.actor) for e in left if e.tool_call_id == call_id]
                result.notes.append(f"{plan.session}/{call_id}: {fault} ({then}); audit {trail}")
                result.audit_gaps_after_read += still is not None
            answer = answered.get(call_id)
            if executed and (answer is None or answer.error):
                result.results_missing += 1
                result.notes.append(f"{plan.session}/{call_id}: ran, result not in the transcript")
            if not approve and (answer is None or not answer.error):
                result.answers_missing += 1
                why = await _without_done_record(store)
                result.notes.append(f"{plan.session}/{call_id}: denial/guard answer not in the transcript{why}")


def _audit_fault(call_id: str, executed: list[dict[str, Any]], events: list[Any]) -> str | None:
    """
    What is wrong with one call's audit, or None: a call that ran (its ledger line) must have its request's
    ``approval.requested`` and ``approval.decided`` and exactly one ``approval.executed``; one that never ran, none.
    """
    counts = Counter(e.event for e in events if e.tool_call_id == call_id)
    if not executed:
        return f"never ran, {counts['approval.executed']} approval.executed" if counts["approval.executed"] else None
    wrong = [f"{e} missing" for e in ("approval.requested", "approval.decided") if not counts[e]]
    if counts["approval.executed"] != 1:
        wrong.append(f"{counts['approval.executed']} approval.executed")
    return f"ran {len(executed)}x, {', '.join(wrong)}" if wrong else None


def _audit_faults(plan: SessionPlan, runs: dict[str, list[dict[str, Any]]], events: list[Any]) -> bool:
    return any(_audit_fault(call_id, runs.get(plan.ref(call_id), []), events) for call_id, _, _ in plan.calls)


async def _without_done_record(store: FsspecToolResultStore) -> str:
    """Name the held steps that were continued by a later step but have no done record (their answers are lost)."""
    ledger = ApprovalLedger(store)
    listing = await ledger.listing_async()
    lost = []
    for sequence in listing.sequences():
        step = await ledger.step_async(sequence)
        if step.continues is not None and not listing.done(sequence_of(step.continues)):
            lost.append(f"step {sequence_of(step.continues)} (continued by step {sequence}) has no done record")
    return f" ({'; '.join(lost)})" if lost else ""


# Running one scenario


async def run_scenario(
    scenario: Scenario,
    args: argparse.Namespace,
    s3_options: dict[str, Any],
    proxy: ServerProcess,
    seed: int,
    baseline_wall: float | None,
    isolation: Isolation | None = None,
    root: str = f"s3://{BUCKET}",
) -> RunResult:
    run = f"run{seed}-{uuid.uuid4().hex[:6]}"
    url = f"{root}/{run}"
    ledger = Path(tempfile.gettempdir()) / f"approvals-under-faults-{run}.ledger"
    proxied = proxied_options(args.server, args.engine, s3_options, proxy.hello)
    rng = random.Random(seed)  # noqa: S311 - the benchmark's own random choices, seeded to be replayable
    kills_left = [args.kills if scenario.kills else 0]

    def make_config(slot: int, generation: int) -> WorkerConfig:
        die_at = None
        if scenario.kills == "mid-call" and kills_left[0] > 0 and slot == 0:
            die_at = rng.randint(1, 4)  # the n-th execution of this worker dies right after its side effect
            kills_left[0] -= 1
        return WorkerConfig(url, proxied, str(ledger), f"w{slot}.{generation}", die_at, args.engine, isolation)

    proxy.ask(("plan", (0.0, seed)))
    pool = WorkerPool(args.workers, make_config)
    try:
        await pool.wait_ready()
        proxy.ask(("plan", (scenario.fault_rate, seed)))
        plans = session_plans(args.sessions, run)
        gate = asyncio.Semaphore(args.concurrency)

        async def flow(plan: SessionPlan) -> FlowResult:
            async with gate:
                client = Client(pool, plan, args.flow_timeout, random.Random(seed * 1000 + plan.index))  # noqa: S311
                return await client.run()

        async def killer() -> None:
            horizon = max(baseline_wall or 10.0, 3.0)
            moments = sorted(rng.uniform(0.1, 0.8) * horizon for _ in range(args.kills))
            begun = time.monotonic()
            for moment in moments:
                await asyncio.sleep(max(0.0, moment - (time.monotonic() - begun)))
                live = [worker for worker in pool.slots if worker.alive and worker.ready.done()]
                if live:
                    rng.choice(live).kill()

        started = time.monotonic()
        kill_task = asyncio.create_task(killer()) if scenario.kills == "instants" else None
        flows = await asyncio.gather(*(flow(plan) for plan in plans))
        wall = time.monotonic() - started
        if kill_task is not None:
            kill_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await kill_task
        report = proxy.ask(("report", None))
        kills, cut, hung = pool.deaths, dict(pool.cut), pool.restarted_hung
        settled = 0
        if not all(done.finished for done in flows):
            await asyncio.sleep(LEASE + 1.0)  # every lease of the run has passed
            if args.settle:
                # Once the store answers again, a later client finishes what the run left (the flow's client gave up
                # at its deadline): what it cannot finish is what the check calls lost or stuck.
                proxy.ask(("plan", (0.0, seed)))
                later = [
                    Client(pool, plan, SETTLE_TIMEOUT, random.Random(seed), settling=True)  # noqa: S311
                    for plan, done in zip(plans, flows, strict=True)
                    if not done.finished
                ]
                settled = sum(done.finished for done in await asyncio.gather(*(c.run() for c in later)))
    finally:
        pool.close()
    result = RunResult(
        scenario=scenario.name,
        sessions=len(plans),
        wall_s=round(wall, 1),
        settled=settled,
        kills=kills,
        cut_requests=cut,
        hung_requests=hung,
    )
    direct = _store(url, s3_options, args.engine, isolation)
    await check(plans, flows, direct, ledger, result)
    ledger.unlink(missing_ok=True)
    trips = sorted(trip for done in flows for trip in done.round_trips)
    if len(trips) > 1:
        quantiles = statistics.quantiles(trips, n=100)
        result.round_trip_p50_ms = round(statistics.median(trips) * 1000, 1)
        result.round_trip_p95_ms = round(quantiles[94] * 1000, 1)
    result.round_trips = len(trips)
    result.s3_requests = report["requests"]
    result.faults = report["faults"]
    result.methods = report["methods"]
    result.may_have_run_asks = sum(done.may_have_run_asks for done in flows)
    result.elsewhere = sum(done.elsewhere for done in flows)
    result.continues = sum(done.continues for done in flows)
    result.no_continue = sum(done.no_continue for done in flows)
    result.notes.extend(stall for done in flows for stall in done.stalls)
    retries: Counter[str] = Counter()
    for done in flows:
        retries.update(done.retries)
        result.unexpected.extend(done.unexpected)
        result.unexpected.extend(done.hung)
    result.retries = dict(retries.most_common())
    return result


# Reporting


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%} ({part}/{whole})" if whole else "-"


def tables(setup: dict[str, Any], results: list[RunResult]) -> str:
    base = results[0]
    base_requests = base.s3_requests / max(base.sessions, 1)
    isolated = ", STS credentials and an SSE-C key per tenant" if setup.get("isolation") else ""
    storage = {"azurite": "Azurite (az://)", "fake-gcs": "fake-gcs-server (gs://)"}.get(setup["server"])
    s3_timeout = f"S3 read timeout {S3_TIMEOUTS['read_timeout']:.0f} s"
    azure = f"Azure read timeout {S3_TIMEOUTS['read_timeout']:.0f} s"
    gcs = f"gcsfs read timeout {S3_TIMEOUTS['read_timeout']:.0f} s"
    timeout = {"azurite": azure, "fake-gcs": gcs}.get(setup["server"], s3_timeout)
    lines = [
        f"{setup['sessions']} sessions per run, {setup['workers']} worker processes, {setup['concurrency']} flows at "
        f"a time; {storage or setup['server'] + ' S3'} ({setup['engine']} engine{isolated}) and the fault proxy in "
        f"processes of their own (faults per request); leases {LEASE:.0f} s; "
        f"{timeout}; store attempt timeout "
        f"{RETRY.attempt_timeout:.0f} s; {setup['cpus']} CPUs; seed {setup['seed']}. Faults drawn among "
        "reset-after, 503 SlowDown and timeout.",
        "",
        "| run | approved calls run once | same key, retried | never | twice or more | unapproved/guarded run "
        "| stuck | results missing | denials/blocks missing | audit gaps | flows unfinished |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.scenario} | {_share(r.once, r.approved)} | {r.same_key_retried} | {r.never} | {r.twice} "
            f"| {r.unapproved_run} | {r.stuck} | {r.results_missing} | {r.answers_missing} | {r.audit_gaps} "
            f"| {r.unfinished} ({r.settled} finished later) |"
        )
    lines += [
        "",
        "| run | S3 requests per session | x baseline | injected faults | decide -> resumed p50 | p95 | p50 x baseline "
        "| wall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        per_session = r.s3_requests / max(r.sessions, 1)
        faults = sum(r.faults.values())
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(r.faults.items()))
        injected = f"{faults} of {r.s3_requests} ({kinds})" if faults else "0"
        ratio = r.round_trip_p50_ms / base.round_trip_p50_ms if base.round_trip_p50_ms else 0.0
        lines.append(
            f"| {r.scenario} | {per_session:.1f} | {per_session / base_requests:.2f}x | {injected} "
            f"| {r.round_trip_p50_ms:,.0f} ms | {r.round_trip_p95_ms:,.0f} ms | {ratio:.2f}x | {r.wall_s:.0f} s |"
        )
    lines += [
        "",
        "| run | workers killed (requests cut) | requests never answered | may-have-run asks "
        "| 'resumed elsewhere' | Continue needed | no Continue offered | client retries, by cause |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        cut = ", ".join(f"{count} {op}" for op, count in sorted(r.cut_requests.items()))
        killed = f"{r.kills} ({cut})" if cut else str(r.kills)
        retries = ", ".join(f"{count} {cause}" for cause, count in r.retries.items()) or "none"
        lines.append(
            f"| {r.scenario} | {killed} | {r.hung_requests} | {r.may_have_run_asks} | {r.elsewhere} | {r.continues} "
            f"| {r.no_continue} | {retries} |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> list[RunResult]:
    scenarios = [Scenario("baseline (0%)")]
    scenarios += [Scenario(f"{rate:.0%} faults", fault_rate=rate) for rate in args.rates]
    if "instants" in args.kill_modes:
        scenarios += [Scenario("SIGKILL at random instants", kills="instants")]
    if "mid-call" in args.kill_modes:
        scenarios += [Scenario("SIGKILL mid-call", kills="mid-call")]
    if args.kills_with_faults:
        scenarios += [
            Scenario(f"SIGKILL mid-call + {args.kills_with_faults:.0%} faults", args.kills_with_faults, "mid-call")
        ]
    s3 = ServerProcess(_s3_process, args.server, args.isolation)
    options = s3.hello["options"]
    isolation = Isolation(s3.hello["role_arn"], options["endpoint_url"]) if args.isolation else None
    proxy = ServerProcess(_proxy_process, s3.hello["upstream"])
    results: list[RunResult] = []
    try:
        for number, scenario in enumerate(scenarios):
            baseline_wall = results[0].wall_s if results else None
            result = await run_scenario(
                scenario, args, options, proxy, args.seed + number, baseline_wall, isolation, s3.hello["root"]
            )
            summary = {k: v for k, v in asdict(result).items() if k not in {"notes", "unexpected"}}
            print(f"# {json.dumps(summary)}", file=sys.stderr, flush=True)
            for note in result.notes[:20]:
                print(f"#   {note}", file=sys.stderr, flush=True)
            for message in sorted(set(result.unexpected))[:10]:
                print(f"#   unexpected: {message}", file=sys.stderr, flush=True)
            results.append(result)
    finally:
        proxy.stop(("stop", None))
        s3.stop("stop")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=40, help="sessions per run (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=12, help="flows at a time (default: %(default)s)")
    parser.add_argument(
        "--rates", type=float, nargs="*", default=[0.05, 0.15, 0.30], help="fault rates (default: 0.05 0.15 0.3)"
    )
    parser.add_argument(
        "--kill-modes",
        nargs="*",
        default=["instants", "mid-call"],
        choices=["instants", "mid-call"],
        help="kill runs: SIGKILL a random worker at random instants, and a worker right after a tool's side effect",
    )
    parser.add_argument("--kills", type=int, default=3, help="workers SIGKILLed per kill run (default: %(default)s)")
    parser.add_argument(
        "--kills-with-faults", type=float, default=0.15, help="fault rate of a kill run with faults (0: none)"
    )
    parser.add_argument("--flow-timeout", type=float, default=90.0, help="a client gives up a flow after this")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--server",
        choices=["moto", "rgw", *EMULATORS],
        default="moto",
        help="the storage server: moto's S3, a Ceph RGW, Azurite (az://) or fake-gcs-server (gs://)",
    )
    parser.add_argument("--engine", choices=["fsspec", "obstore"], default="fsspec", help="the store's engine")
    parser.add_argument(
        "--isolation",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="per-tenant STS credentials and SSE-C keys, as the tests' isolated RGW lane (default: on for rgw; "
        "moto cannot: it has no role to assume here)",
    )
    parser.add_argument("--quick", action="store_true", help="10 sessions; baseline, 10%% faults, one kill mid-call")
    parser.add_argument("--json", help="also write the numbers to this file")
    parser.add_argument(
        "--no-settle",
        dest="settle",
        action="store_false",
        help="check the flows as the run left them, without a later client finishing the unfinished ones",
    )
    args = parser.parse_args(argv)
    if args.isolation is None:
        args.isolation = args.server == "rgw"
    if args.isolation and args.server != "rgw":
        parser.error("--isolation needs --server rgw (STS roles are made on the RGW this benchmark starts)")
    if args.server == "fake-gcs" and args.engine == "obstore":
        parser.error("--engine obstore serves s3:// and az:// only; fake-gcs-server runs with --engine fsspec (gcsfs)")
    if args.server == "fake-gcs":
        # Before any worker imports gcsfs (they inherit the environment): else gcsfs waits 60 s per client on a gRPC
        # probe of the bucket's type that cannot succeed off Google's endpoint (tests/support/fake_gcs.py).
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    if args.server in EMULATORS:
        # Every fault kind here is plain HTTP (a reset, a 503, a withheld answer): adlfs and gcsfs retry a 503 by its
        # status, whatever its body (S3's SlowDown XML), so none is left out.
        print(f"# {args.server}: fault kinds {', '.join(FAULT_KINDS)} (none S3-only)", file=sys.stderr, flush=True)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # aiohttp's "Unclosed client session" at teardown
    if args.quick:
        args.sessions, args.rates, args.kills, args.kills_with_faults = 10, [0.10], 1, 0.0
        args.kill_modes = ["mid-call"]
        args.flow_timeout = 45.0
    results = asyncio.run(main_async(args))
    setup = {
        "sessions": args.sessions,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "cpus": os.cpu_count(),
        "seed": args.seed,
        "server": args.server,
        "engine": args.engine,
        "isolation": args.isolation,
    }
    print(tables(setup, results))
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"setup": setup, "results": [asdict(result) for result in results]}, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
