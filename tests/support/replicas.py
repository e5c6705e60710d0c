"""
Replicas of the reference server behind Debian's HAProxy, as the deployment in ``app/deploy`` runs them, but as
processes: each replica runs the container's own command (the Dockerfile's ``CMD``) on a loopback address of its own
(127.0.0.2, 127.0.0.3, ... as hosts would be), and HAProxy runs ``app/deploy/haproxy.cfg`` with the replicas'
addresses in place of its DNS discovery. `Load` sends concurrent tenants' messages and decisions through it and keeps
what each request was answered, for the checks and the benchmark.
"""

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "app" / "deploy"
READY_TIMEOUT = 90.0


def container_command() -> list[str]:
    """The Dockerfile's ``CMD``, as the container would run it."""
    lines = [line for line in (DEPLOY / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")]
    command: list[str] = json.loads(lines[-1].removeprefix("CMD "))
    return command


def free_port(host: str) -> int:
    """A port nobody listens on at `host` right now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class Replica:
    """One replica: the container's command on `host`, restartable, with its output appended to `log`."""

    def __init__(self, name: str, host: str, environment: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.host = host
        self.port = free_port(host)
        self.environment = dict(environment)
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.exits: list[int] = []

    def command(self) -> list[str]:
        """The container's command with this replica's address; its ``uvicorn`` from this interpreter."""
        command = container_command()
        command[command.index("--host") + 1] = self.host
        command[command.index("--port") + 1] = str(self.port)
        assert command[0] == "uvicorn", command
        return [sys.executable, "-m", *command]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as output:
            variables = {**os.environ, **self.environment, "PYTHONUNBUFFERED": "1"}
            self.process = subprocess.Popen(self.command(), stdout=output, stderr=subprocess.STDOUT, env=variables)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/api/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"replica {self.name} was not ready within {READY_TIMEOUT} s")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, as an orchestrator stops a container; its exit code (uvicorn re-raises the signal: -15)."""
        return self._end(signal.SIGTERM, timeout)

    def kill(self) -> int:
        return self._end(signal.SIGKILL, 10.0)

    def _end(self, number: int, timeout: float) -> int:
        if self.process is None:
            return 0
        self.process.send_signal(number)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self.exits.append(code)
        self.process = None
        return code


class LoadBalancer:
    """HAProxy (Debian's) on ``app/deploy/haproxy.cfg``, with `replicas` for its servers and a stats socket."""

    def __init__(self, replicas: list[Replica], workdir: Path) -> None:
        self.port = free_port("127.0.0.1")
        self.socket_path = workdir / "haproxy.sock"
        self.config = workdir / "haproxy.cfg"
        self.log = workdir / "haproxy.log"
        self.config.write_text(self.render(replicas))
        self.process: subprocess.Popen[bytes] | None = None

    def render(self, replicas: list[Replica]) -> str:
        text = (DEPLOY / "haproxy.cfg").read_text()
        text = re.sub(r"\nresolvers docker\n(?:    .*\n)+", "\n", text)  # no DNS discovery: the addresses are known
        servers = "".join(f"    server {r.name} {r.host}:{r.port} check\n" for r in replicas)
        text = re.sub(r"    server-template .*\n", servers, text)
        text = text.replace("bind *:8080", f"bind 127.0.0.1:{self.port}")
        return text.replace("global\n", f"global\n    stats socket {self.socket_path} level admin\n", 1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as output:
            command = ["haproxy", "-db", "-f", str(self.config)]
            self.process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not self.socket_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def stats(self) -> dict[str, dict[str, str]]:
        """HAProxy's own counters (``show stat``), by server name (and ``FRONTEND`` / ``BACKEND``)."""
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(str(self.socket_path))
            connection.sendall(b"show stat\n")
            chunks = []
            while chunk := connection.recv(65536):
                chunks.append(chunk)
        lines = b"".join(chunks).decode().strip().splitlines()
        names = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(names, line.split(","), strict=False)) for line in lines[1:] if line]
        return {row["svname"]: row for row in rows if row.get("pxname") == "replicas"}

    def in_flight(self, server: str) -> int:
        """Requests the balancer has open on `server` now."""
        return int(self.stats()[server].get("scur") or 0)

    def wait_busy(self, server: str, patience: float = 10.0) -> int:
        """Wait until the balancer has a request open on `server` (so what comes next happens mid-turn); how many."""
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            if (open_now := self.in_flight(server)) > 0:
                return open_now
            time.sleep(0.01)
        return 0

    def times_down(self, server: str) -> int:
        """How often HAProxy's health checks have taken `server` out (``chkdown``)."""
        return int(self.stats()[server].get("chkdown") or 0)

    def wait_down(self, server: str, since: int, patience: float = 15.0) -> None:
        """Wait until HAProxy has taken `server` out more than `since` times, as a rolling restart waits."""
        deadline = time.monotonic() + patience
        while self.times_down(server) <= since:
            if time.monotonic() > deadline:
                raise AssertionError(f"HAProxy did not take {server} out within {patience} s: {self.stats()[server]}")
            time.sleep(0.05)

    def wait_up(self, server: str, patience: float = 15.0) -> None:
        """Wait until HAProxy's checks have put `server` back in service."""
        deadline = time.monotonic() + patience
        while self.stats()[server].get("status") != "UP":
            if time.monotonic() > deadline:
                raise AssertionError(f"HAProxy did not put {server} back within {patience} s: {self.stats()[server]}")
            time.sleep(0.05)


HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


@contextlib.contextmanager
def deployment(
    count: int,
    store: str,
    storage_options: Mapping[str, Any],
    tokens: Mapping[str, str],
    workdir: Path,
    settings: Mapping[str, str] | None = None,
) -> Iterator[tuple[list[Replica], LoadBalancer]]:
    """
    `count` replicas (up to 3) on `store`, each ready, behind a started `LoadBalancer`; all killed when it ends.

    :param count: How many replicas.
    :param store: The store URL they share.
    :param storage_options: Its options.
    :param tokens: Bearer token -> tenant.
    :param workdir: Where the logs and HAProxy's configuration go.
    :param settings: More ``OFFLOAD_SERVER_*`` variables every replica gets (e.g. a tenant role and an SSE-C master
        key for isolation per tenant).
    :yields: The replicas and the balancer.
    """
    environment = {**replica_environment(store, storage_options, tokens), **(settings or {})}
    replicas = [Replica(f"r{n}", host, environment, workdir / f"r{n}.log") for n, host in enumerate(HOSTS[:count], 1)]
    balancer = LoadBalancer(replicas, workdir)
    try:
        for replica in replicas:
            replica.start()
        for replica in replicas:
            replica.wait_ready()
        balancer.start()
        yield replicas, balancer
    finally:
        for replica in replicas:
            replica.kill()
        balancer.stop()


def replica_environment(store: str, storage_options: Mapping[str, Any], tokens: Mapping[str, str]) -> dict[str, str]:
    """What every replica must share (the store, the tokens, the leases), with short leases for a test's patience."""
    return {
        "OFFLOAD_SERVER_STORE": store,
        "OFFLOAD_SERVER_STORAGE_OPTIONS": json.dumps(dict(storage_options)),
        "OFFLOAD_SERVER_TOKENS": json.dumps(dict(tokens)),
        "OFFLOAD_SERVER_TURN_LEASE": "8",
        "OFFLOAD_SERVER_RESUME_LEASE": "8",
        "OFFLOAD_SERVER_DRAIN_SECONDS": "20",
        "OFFLOAD_SERVER_SCRIPTED_TOOL_DELAY": "0.05",
    }


@dataclass
class Sent:
    """One message as the client saw it: its answer's status (None: no answer) and how long it took."""

    session: str
    text: str
    status: int | None
    seconds: float
    turn_status: str | None = None


@dataclass
class Decided:
    session: str
    request_id: str
    approved: bool
    status: int | None


@dataclass
class Load:
    """Tenants' clients sending messages and deciding approvals through `url` until `stop` is set."""

    url: str
    tokens: Mapping[str, str]
    sessions_per_tenant: int = 2
    sent: list[Sent] = field(default_factory=list)
    decided: list[Decided] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    details: list[str] = field(default_factory=list)  # what `check_sessions` found wrong, one line each
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sessions(self) -> list[tuple[str, str]]:
        run = uuid.uuid4().hex[:6]
        return [
            (token, f"load-{run}-{tenant}-{number}")
            for token, tenant in self.tokens.items()
            for number in range(self.sessions_per_tenant)
        ]

    def run(self, seconds: float | None = None) -> list[tuple[str, str]]:
        """Start one client thread per session; with `seconds`, stop them after that long and wait for them."""
        sessions = self.sessions()
        self.threads = [threading.Thread(target=self._client, args=pair, daemon=True) for pair in sessions]
        for thread in self.threads:
            thread.start()
        if seconds is not None:
            time.sleep(seconds)
            self.finish()
        return sessions

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)

    def _client(self, token: str, session: str) -> None:
        chooser = random.Random(session)  # noqa: S311 - a workload, not a secret
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
            number = 0
            while not self.stop.is_set():
                number += 1
                pending = self._pending(client, session)
                if pending:
                    self._decide(client, session, pending, chooser)
                    continue
                if chooser.random() < 0.3:
                    text = f"Send an invoice to Initech for {number} EUR"
                else:
                    text = f"Research heat pumps {number} and chart revenue"
                self._send(client, session, text)

    def _send(self, client: httpx.Client, session: str, text: str) -> None:
        started = time.monotonic()
        status: int | None
        turn_status = None
        try:
            answer = client.post(f"/api/sessions/{session}/messages", json={"text": text})
            status = answer.status_code
            turn_status = answer.json().get("status") if status == 200 else None
        except httpx.HTTPError:
            status = None
        with self.lock:
            self.sent.append(Sent(session, text, status, time.monotonic() - started, turn_status))
        if status != 200:
            time.sleep(0.2)  # busy (409), a lease to lapse, or a replica going away

    def _pending(self, client: httpx.Client, session: str) -> list[dict[str, Any]]:
        try:
            answer = client.get(f"/api/sessions/{session}/approvals")
            if answer.status_code != 200:
                return []
            pending: list[dict[str, Any]] = answer.json().get("pending", [])
            if not pending and client.get(f"/api/sessions/{session}/messages").json().get("resumable"):
                client.post(f"/api/sessions/{session}/resume")  # a decided step whose turn was cut
            return pending
        except (httpx.HTTPError, ValueError):
            return []

    def _decide(
        self, client: httpx.Client, session: str, pending: list[dict[str, Any]], chooser: random.Random
    ) -> None:
        for request in pending:
            approved = chooser.random() < 0.5
            try:
                answer = client.post(
                    f"/api/sessions/{session}/approvals/{request['request_id']}", json={"approved": approved}
                )
                status: int | None = answer.status_code
            except httpx.HTTPError:
                status = None
            with self.lock:
                self.decided.append(Decided(session, request["request_id"], approved, status))
            if status not in (200, 409):
                time.sleep(0.2)


def check_sessions(url: str, tokens: Mapping[str, str], load: Load, sessions: list[tuple[str, str]]) -> dict[str, int]:
    """
    What the load left, from the server's own answers: turns lost or answered twice, approved calls run never or
    twice, denied calls run, and sessions that cannot take a message afterwards (waiting out any lease). An approved
    call whose worker was killed after claiming it, before its result was recorded, is neither run nor lost: the
    audit says it may have run and a person is asked again (``asked_again``), as the design promises.

    :returns: Counts by name; every one but ``turns``, ``calls`` and ``asked_again`` must be 0.
    """
    counts = {"turns": 0, "lost": 0, "twice": 0, "approved_never": 0, "approved_twice": 0, "denied_ran": 0}
    counts |= {"stuck": 0, "calls": 0, "asked_again": 0}
    details: list[str] = []
    for token, session in sessions:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
            usable = _usable(client, session)
            counts["stuck"] += not usable
            transcript = client.get(f"/api/sessions/{session}/messages").json()
            texts = [m["text"] for m in transcript["messages"] if m["role"] == "user"]
            answered = [s.text for s in load.sent if s.session == session and s.status == 200]
            counts["turns"] += len(answered)
            lost = [text for text in answered if text not in texts]
            twice = [text for text in set(texts) if texts.count(text) > 1]
            counts["lost"] += len(lost)
            counts["twice"] += len(twice)
            details += [f"{session}: lost {text!r}" for text in lost] + [f"{session}: twice {text!r}" for text in twice]
            events = client.get(f"/api/sessions/{session}/audit").json()["events"]
            ran: dict[str, int] = {}
            verdicts: dict[str, bool] = {}
            calls: dict[str, str] = {}
            asked_again = {event["tool_call_id"] for event in events if event["event"] == "approval.may_have_run"}
            for event in events:
                if event["event"] == "approval.executed" and event["request_id"]:
                    ran[event["request_id"]] = ran.get(event["request_id"], 0) + 1
                if event["event"] == "approval.decided" and event["request_id"]:
                    verdicts[event["request_id"]] = bool(event["detail"].get("approved"))
                    calls[event["request_id"]] = event["tool_call_id"]
            for request_id, approved in verdicts.items():
                times = ran.get(request_id, 0)
                counts["calls"] += 1
                if approved and times == 0 and calls[request_id] in asked_again:
                    counts["asked_again"] += 1
                    continue
                if approved:
                    counts["approved_never"] += times == 0
                    counts["approved_twice"] += times > 1
                else:
                    counts["denied_ran"] += times > 0
                if times != int(approved):
                    # With the call's whole audit trail, so a failure can be read without running it again.
                    trail = [
                        (event["event"], event["request_id"], event["actor"], event["at"])
                        for event in events
                        if event["tool_call_id"] == calls[request_id]
                    ]
                    verdict = "approved" if approved else "denied"
                    details.append(f"{session}: {request_id} {verdict}, ran {times}; audit {trail}")
            if not usable:
                details.append(f"{session}: stuck, {transcript.get('status')}")
    load.details = details
    return counts


def _usable(client: httpx.Client, session: str, patience: float = 60.0) -> bool:
    """Whether the session takes a message once held steps are settled and leases have lapsed."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        pending = client.get(f"/api/sessions/{session}/approvals").json().get("pending", [])
        for request in pending:
            client.post(f"/api/sessions/{session}/approvals/{request['request_id']}", json={"approved": False})
        transcript = client.get(f"/api/sessions/{session}/messages").json()
        if transcript.get("resumable"):
            client.post(f"/api/sessions/{session}/resume")
            continue
        answer = client.post(f"/api/sessions/{session}/messages", json={"text": f"usable {uuid.uuid4().hex[:6]}"})
        if answer.status_code == 200:
            return True
        time.sleep(1.0)
    return False
