"""
The server's ``/metrics``, scraped over HTTP from real ``offload-haystack serve`` processes (each sets its own
MeterProvider): every counter against what happened outside our code (moto's request log, the fault proxy's log, the
documents in the store), the tenants' tokens against the scrape, two workers each on its own port, and the dashboard.
"""

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import httpx
import pytest
from fastapi.testclient import TestClient
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError
from server_processes import free_port
from server_tenants import ACME_TOKEN, GLOBEX_TOKEN, TOKENS, bearer

from haystack_integrations.offload import FsspecToolResultStore, Quota
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.operations.inventory import classify
from haystack_integrations.offload.sessions.errors import RunFailedError
from haystack_integrations.offload.sessions.history import NAMESPACE as HISTORY_NAMESPACE
from haystack_integrations.offload.sessions.service import ChatService
from haystack_integrations.offload.stores.compact_documents import decompress_document
from haystack_integrations.offload.testing.faults import Fault, FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RecordedRequest
from metric_readings import MetricReadings, process_reader
from offload_haystack_app.server import ServerSettings, create_app
from offload_haystack_app.server.agent import build_agent
from offload_haystack_app.server.metrics_endpoint import MAX_SCRAPE_CONNECTIONS, WORKERS_VARIABLE
from offload_haystack_app.server.startup import ServerStartupError

METRICS_TOKEN = "metrics-scrape-token-0123456789"  # noqa: S105 - a test token for loopback test servers
DASHBOARD = Path(__file__).resolve().parents[3] / "infra" / "grafana" / "offload-haystack-dashboard.json"
DEADLINE = 90.0
QUOTA = {"session_results": 2}
RESEARCH = "Research heat pumps and dump the invoices table"
TURNS = "offload_turn_duration_seconds_count"  # a turn is one value of its duration
METRICS_DEFAULTS = {"metrics_port": None, "metrics_host": "127.0.0.1", "metrics_token": None, "metrics_tenants": []}


class Scrape:
    """One ``/metrics`` answer: every sample, by name and labels."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def total(self, name: str, **labels: str | None) -> float:
        """The sum over the samples of `name` carrying these labels (None: without that label)."""
        return sum(value for (sample, pairs), value in self.samples.items() if sample == name and _has(pairs, labels))

    def names(self) -> set[str]:
        """Every sample name in the scrape."""
        return {name for name, _ in self.samples}

    def label(self, name: str, label: str) -> set[str]:
        """The values `label` takes on the samples of `name` (those without it left out)."""
        return {dict(pairs).get(label) or "" for (sample, pairs) in self.samples if sample == name} - {""}


def _has(pairs: frozenset[tuple[str, str]], labels: Mapping[str, str | None]) -> bool:
    # The exporter gives a family's series the union of its labels, "" where one has none: Prometheus reads that as
    # no label, and so does `None` here.
    present = dict(pairs)
    return all((present.get(label) or None) == value for label, value in labels.items())


def _growth(before: Scrape, after: Scrape, name: str, **labels: str | None) -> float:
    return after.total(name, **labels) - before.total(name, **labels)


# Processes and ports


def _wait_for(condition: Callable[[], Any], what: str, process: subprocess.Popen[str], log: Path) -> Any:
    """Poll `condition` until it returns something truthy; fail at the deadline, or at once if the server exited."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}:\n{log.read_text()}")
        try:
            found = condition()
        except httpx.HTTPError:
            found = None
        if found:
            return found
        time.sleep(0.1)
    raise RuntimeError(f"{what} within {DEADLINE} s:\n{log.read_text()}")


def free_port_range(count: int, host: str = "127.0.0.1") -> int:
    """The first of `count` consecutive ports nobody listens on right now at `host` (each bound once to be sure)."""
    for _ in range(50):
        first = free_port()
        with ExitStack() as probes:
            try:
                for port in range(first, first + count):
                    probe = probes.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    probe.bind((host, port))
            except OSError:
                continue
            return first
    raise RuntimeError(f"no {count} consecutive free ports found")


@dataclass(frozen=True)
class Served:
    """A running ``serve``: its API base URL and its metrics ports."""

    api: str
    metrics_host: str
    metrics_ports: range
    process: subprocess.Popen[str]
    log: Path

    def scrape(self, port: int, token: str | None = METRICS_TOKEN) -> Scrape:
        url = f"http://{self.metrics_host}:{port}/metrics"
        answer = httpx.get(url, headers=bearer(token) if token else {}, timeout=30)
        assert answer.status_code == 200, answer.text
        return Scrape(answer.text)


@contextmanager
def serve(
    *,
    store: str,
    options: Mapping[str, Any],
    workers: int,
    log: Path,
    environment: Mapping[str, str],
    metrics_host: str = "127.0.0.1",
) -> Iterator[Served]:
    """``offload-haystack serve --workers N --metrics-port P`` until the block ends; every metrics port answering."""
    port, first = free_port(), free_port_range(workers, metrics_host)
    command = [sys.executable, "-m", "haystack_integrations.offload.cli", "serve", "--port", str(port)]
    command += ["--workers", str(workers), "--metrics-port", str(first), "--metrics-host", metrics_host]
    command += ["--store", store, "--log-level", "warning"]
    command += ["--storage-options", json.dumps(dict(options))]
    variables = {**os.environ, **environment, "OFFLOAD_SERVER_TOKENS": json.dumps(TOKENS), "PYTHONUNBUFFERED": "1"}
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True, env=variables)
    served = Served(f"http://127.0.0.1:{port}", metrics_host, range(first, first + workers), process, log)
    try:
        _wait_for(lambda: httpx.get(f"{served.api}/api/health", timeout=2).is_success, "no health", process, log)
        for metrics_port in served.metrics_ports:  # each worker binds its port in its own start-up
            _wait_for(lambda p=metrics_port: served.scrape(p), f"no metrics on {metrics_port}", process, log)
        yield served
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait()


# What the store holds, read with s3fs directly


@dataclass(frozen=True)
class Stored:
    """The objects below one prefix, by kind: results, and the documents as parsed JSON."""

    results: dict[str, int]
    documents: dict[str, Any]

    def turn_ends(self, tenant: str | None = None) -> list[dict[str, Any]]:
        return [
            document
            for path, document in self.documents.items()
            if path.endswith(".end.json") and "/turn." in path and (tenant is None or path.startswith(f"{tenant}/"))
        ]

    def audit(self, event: str) -> list[dict[str, Any]]:
        return [document for document in self.documents.values() if document.get("event") == event]


def read_store(s3_server: LocalS3Server, prefix: str) -> Stored:
    fs = fsspec.filesystem("s3", **s3_server.storage_options(), skip_instance_cache=True)
    root = f"{s3_server.bucket}/{prefix}"
    results, documents = {}, {}
    for path, details in fs.find(root, detail=True).items():
        relative = path[len(root) + 1 :]
        item = classify(relative, 0)
        if item.kind == "result":
            results[relative] = int(details["size"])
        elif item.kind == "document":
            documents[relative] = json.loads(decompress_document(fs.cat_file(path)))  # a turn's end is gzipped
    return Stored(results, documents)


def _listing(request: RecordedRequest) -> bool:
    return request.method == "GET" and "list-type=2" in request.query


SENT_AS: dict[str, Callable[[RecordedRequest], bool]] = {
    # How each storage operation of the scripted runs reaches S3: one request each.
    "put": lambda request: request.method == "PUT" and request.header("if-none-match") is None,
    "put_exclusive": lambda request: request.method == "PUT" and request.header("if-none-match") == "*",
    "get": lambda request: request.method == "GET" and request.range is None and not _listing(request),
    "get_range_and_size": lambda request: request.method == "GET" and request.range is not None,
}


def _calls(before: Scrape, after: Scrape) -> Counter[str]:
    """The storage calls counted between two scrapes, by operation."""
    name = "offload_storage_requests_total"
    operations = after.label(name, "offload_operation")
    return Counter({operation: _growth(before, after, name, offload_operation=operation) for operation in operations})


def _each_call_is_counted_once(calls: Counter[str], reached_s3: list[RecordedRequest]) -> None:
    left = Counter(calls)
    for operation, sent_as in SENT_AS.items():
        assert left.pop(operation, 0) == sum(map(sent_as, reached_s3)), operation
    # A listing is one request or more (s3fs lists an empty prefix again after asking for it as an object); a turn's
    # history sends none (it starts from a head document), a session quota's refresh one page ("list").
    assert left.pop("find", 0) + left.pop("list", 0) <= sum(map(_listing, reached_s3))
    assert +left == Counter(), "an operation the checks do not know"


def _ours(requests: list[RecordedRequest], prefix: str) -> list[RecordedRequest]:
    # Listings name the prefix in their query, every other request in its path.
    return [request for request in requests if prefix in request.path or prefix in request.query]


# (a) scripted runs through one server, with a fault, a quota and a durable approval


@dataclass(frozen=True)
class Run:
    """What one scripted run did, seen from outside: scrapes before and after, and what S3, the proxy and store saw."""

    served: Served
    before: Scrape
    after: Scrape
    reached_s3: list[RecordedRequest]
    faults: list[Fault]
    stored: Stored
    pending_since: float


def _post(served: Served, token: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{served.api}/api/sessions/{path}", json=body, headers=bearer(token), timeout=120)
    assert answer.status_code == 200, answer.text
    reply: dict[str, Any] = answer.json()
    return reply


def _drive(served: Served, proxy: FaultProxy) -> float:
    """The scripted runs; returns when the approval left pending was asked for."""
    proxy.inject(Fault.SLOW_DOWN, method="PUT")  # the first write meets S3's throttling answer, once
    assert _post(served, ACME_TOKEN, "research/messages", {"text": RESEARCH})["status"] == "completed"
    assert _post(served, ACME_TOKEN, "research/messages", {"text": "Read back the search results"})["reply"]
    # The session holds 2 results, its quota: this turn's two large results stay in the conversation.
    assert _post(served, ACME_TOKEN, "research/messages", {"text": "Dump the orders table and chart revenue"})
    held = _post(served, ACME_TOKEN, "invoice/messages", {"text": "Send an invoice to Hooli for 300 EUR"})
    assert held["status"] == "approval_required"
    decided = _post(served, ACME_TOKEN, f"invoice/approvals/{held['pending'][0]['request_id']}", {"approved": True})
    assert "Invoice INV-" in decided["resumed"]["reply"]
    assert _post(served, GLOBEX_TOKEN, "research/messages", {"text": "Research wind farms"})["status"] == "completed"
    asked = time.time()
    waiting = _post(served, GLOBEX_TOKEN, "pending/messages", {"text": "Send an invoice to Initech for 250 EUR"})
    assert waiting["status"] == "approval_required"  # left undecided: the oldest pending approval at the end
    return asked


@pytest.fixture(scope="module")
def run(s3_server: LocalS3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    prefix = f"metrics-{uuid.uuid4().hex[:10]}"
    environment = {
        "OFFLOAD_SERVER_ENGINE": "fsspec",
        "OFFLOAD_SERVER_QUOTA": json.dumps(QUOTA),
        "OFFLOAD_SERVER_CONTEXT_WINDOW": "128000",  # no compaction: every stored result is an offload
        "OFFLOAD_SERVER_METRICS_TOKEN": METRICS_TOKEN,
        "OFFLOAD_SERVER_METRICS_TENANTS": "acme",
    }
    log = tmp_path_factory.mktemp("metrics-server") / "serve.log"
    with FaultProxy(s3_server.endpoint_url) as proxy:
        options = {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        with serve(
            store=f"{s3_server.bucket_url}/{prefix}", options=options, workers=1, log=log, environment=environment
        ) as served:
            [port] = served.metrics_ports
            before = served.scrape(port)
            s3_server.requests.clear()
            proxy.faults.clear()
            pending_since = _drive(served, proxy)
            after = served.scrape(port)
            reached = _ours(s3_server.requests.snapshot(), prefix)
            faults = [fault.kind for fault in proxy.faults.snapshot()]
            yield Run(served, before, after, reached, faults, read_store(s3_server, prefix), pending_since)


@pytest.mark.s3
@pytest.mark.slow
def test_turns_are_counted_by_status_as_the_store_recorded_them(run: Run) -> None:
    for tenant, labelled in (("acme", "acme"), ("globex", None)):
        ends = run.stored.turn_ends(tenant)
        for status, recorded in (("completed", "completed"), ("held", "approval_required")):
            counted = _growth(run.before, run.after, TURNS, offload_status=status, offload_tenant=labelled)
            assert counted == sum(end["status"] == recorded for end in ends), (tenant, status)
    assert _growth(run.before, run.after, TURNS) == len(run.stored.turn_ends()) == 7


@pytest.mark.s3
@pytest.mark.slow
def test_every_storage_call_that_reached_s3_is_counted_once_and_the_fault_as_a_retry(run: Run) -> None:
    assert run.faults == [Fault.SLOW_DOWN]
    assert _growth(run.before, run.after, "offload_storage_retries_total", offload_cause="HTTP 503 SlowDown") == 1
    assert _growth(run.before, run.after, "offload_storage_retries_total") == len(run.faults)
    assert _growth(run.before, run.after, "offload_storage_requests_total", offload_outcome="retried") == 1
    assert _growth(run.before, run.after, "offload_storage_requests_total", offload_outcome="gave_up") == 0
    _each_call_is_counted_once(_calls(run.before, run.after), run.reached_s3)  # the faulted attempt never reached S3
    requests = _growth(run.before, run.after, "offload_storage_requests_total")
    assert _growth(run.before, run.after, "offload_storage_request_duration_seconds_count") == requests


@pytest.mark.s3
@pytest.mark.slow
def test_a_tenant_not_listed_gets_no_tenant_label(run: Run) -> None:
    assert run.after.label(TURNS, "offload_tenant") == {"acme"}
    assert run.after.label("offload_storage_retries_total", "offload_tenant") == set()


@pytest.mark.s3
@pytest.mark.slow
def test_offloads_and_quota_refusals_match_the_results_in_the_store(run: Run) -> None:
    assert len(run.stored.results) == 3  # the quota kept the session at 2 results
    assert _growth(run.before, run.after, "offload_results_total", offload_outcome="stored") == 3
    stored_bytes = _growth(run.before, run.after, "offload_result_bytes_total", offload_outcome="stored")
    assert stored_bytes == sum(run.stored.results.values())
    assert _growth(run.before, run.after, "offload_results_total", offload_outcome="refused_quota") == 2
    assert _growth(run.before, run.after, "offload_results_total", offload_outcome="kept_inline") == 0


@pytest.mark.s3
@pytest.mark.slow
def test_the_page_read_is_counted_with_the_bytes_s3_sent_for_it(run: Run) -> None:
    assert _growth(run.before, run.after, "offload_readback_calls_total", offload_kind="page") == 1
    ranged = [request for request in run.reached_s3 if request.range is not None]  # the page's read, and only it
    read = _growth(run.before, run.after, "offload_readback_bytes_total", offload_kind="page")
    assert read == sum(request.bytes_sent for request in ranged) > 0


@pytest.mark.s3
@pytest.mark.slow
def test_approvals_match_the_audit_in_the_store(run: Run) -> None:
    counted = {
        event: _growth(run.before, run.after, "offload_approvals_total", offload_event=event)
        for event in ("requested", "decided", "executed")
    }
    assert counted == {
        "requested": len(run.stored.audit("approval.requested")),
        "decided": len(run.stored.audit("approval.decided")),
        "executed": len(run.stored.audit("approval.executed")),
    }
    assert counted["requested"] == 2
    age = run.after.total("offload_approvals_oldest_pending_age_seconds")
    assert 0 <= age <= time.time() - run.pending_since + 1


@pytest.mark.s3
@pytest.mark.slow
def test_every_metric_the_dashboard_queries_is_in_the_scrape(run: Run) -> None:
    if not DASHBOARD.exists():
        pytest.skip(f"{DASHBOARD} does not exist yet")
    exprs = [
        target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for target in panel.get("targets", [])
    ]
    # Label names in selectors and groupings are not metrics: drop them first.
    bare = (re.sub(r"\bby \([^)]*\)", "", re.sub(r"\{[^}]*\}", "", expr)) for expr in exprs)
    queried = {name for expr in bare for name in re.findall(r"\boffload_[a-z0-9_]+", expr)}
    assert queried and queried <= run.after.names(), sorted(queried - run.after.names())


# (b) a tenant's token reads no metrics


@pytest.mark.s3
@pytest.mark.slow
def test_the_api_port_serves_no_metrics_to_anyone(run: Run) -> None:
    for headers in ({}, bearer(ACME_TOKEN), bearer(METRICS_TOKEN)):
        answer = httpx.get(f"{run.served.api}/metrics", headers=headers, timeout=30)
        assert answer.status_code in (401, 404) and "offload_" not in answer.text


@pytest.mark.s3
@pytest.mark.slow
def test_the_metrics_port_wants_its_own_token(run: Run) -> None:
    [port] = run.served.metrics_ports
    url = f"http://127.0.0.1:{port}"
    for headers in ({}, bearer(ACME_TOKEN), bearer(GLOBEX_TOKEN), {"Authorization": f"Basic {METRICS_TOKEN}"}):
        answer = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
        assert answer.status_code == 401 and "offload_" not in answer.text
        assert answer.headers["WWW-Authenticate"] == "Bearer"
    assert httpx.get(f"{url}/api/health", headers=bearer(METRICS_TOKEN), timeout=30).status_code == 404
    assert TURNS in httpx.get(f"{url}/metrics", headers=bearer(METRICS_TOKEN), timeout=30).text


# (c) two workers, a port each


@pytest.mark.s3
@pytest.mark.slow
def test_two_workers_serve_their_own_figures_on_their_own_ports(s3_server: LocalS3Server, tmp_path: Path) -> None:
    prefix = f"workers-{uuid.uuid4().hex[:10]}"
    with serve(
        store=f"{s3_server.bucket_url}/{prefix}",
        options=s3_server.storage_options(),
        workers=2,
        log=tmp_path / "serve.log",
        environment={"OFFLOAD_SERVER_ENGINE": "fsspec", "OFFLOAD_SERVER_METRICS_TOKEN": METRICS_TOKEN},
        metrics_host="127.0.0.2",  # another loopback address: --metrics-host reaches every worker
    ) as served:
        before = {port: served.scrape(port) for port in served.metrics_ports}
        s3_server.requests.clear()
        sessions = [f"chat-{n}" for n in range(8)]
        # At once, so that both workers are likely to answer some; the checks hold however the kernel splits them.
        with ThreadPoolExecutor(len(sessions)) as pool:
            replies = list(
                pool.map(lambda session: _post(served, ACME_TOKEN, f"{session}/messages", {"text": RESEARCH}), sessions)
            )
        assert all(reply["status"] == "completed" for reply in replies)
        after = {port: served.scrape(port) for port in served.metrics_ports}
        reached = _ours(s3_server.requests.snapshot(), prefix)
    workers = {port: _instance(scrape) for port, scrape in after.items()}
    assert len(set(workers.values())) == 2, workers
    ends = read_store(s3_server, prefix).turn_ends()
    assert len(ends) == len(sessions)
    for port, worker in workers.items():
        turns = _growth(before[port], after[port], TURNS)
        assert turns == sum(end["worker"] == worker for end in ends), (port, worker)
    _each_call_is_counted_once(sum((_calls(before[port], after[port]) for port in after), Counter()), reached)


def _instance(scrape: Scrape) -> str:
    [worker] = scrape.label("target_info", "service_instance_id")
    return worker


# The settings, the flag and the app's endpoint, in this process


@pytest.fixture
def _no_server_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OFFLOAD_SERVER_") or name == WORKERS_VARIABLE:
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("_no_server_variables")
def test_the_metrics_settings_come_from_the_environment_and_go_back_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServerSettings(tokens=TOKENS).model_dump(include=set(METRICS_DEFAULTS)) == METRICS_DEFAULTS
    given = {
        "OFFLOAD_SERVER_TOKENS": json.dumps(TOKENS),
        "OFFLOAD_SERVER_METRICS_PORT": "9464",
        "OFFLOAD_SERVER_METRICS_HOST": "10.0.0.5",
        "OFFLOAD_SERVER_METRICS_TOKEN": METRICS_TOKEN,
        "OFFLOAD_SERVER_METRICS_TENANTS": "acme, globex",
        "OFFLOAD_SERVER_QUOTA": json.dumps(QUOTA),
    }
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    settings = ServerSettings()
    assert (settings.metrics_port, settings.metrics_host, settings.metrics_tenants) == (
        9464,
        "10.0.0.5",
        ["acme", "globex"],
    )
    assert settings.metrics_token is not None and settings.metrics_token.get_secret_value() == METRICS_TOKEN
    assert METRICS_TOKEN not in repr(settings)
    assert settings.quota == Quota(**QUOTA) and settings.results_store().quota == Quota(**QUOTA)
    # Worker processes rebuild the same settings from the variables `serve` exports.
    for name in given:
        monkeypatch.delenv(name)
    for name, value in settings.environment().items():
        monkeypatch.setenv(name, value)
    assert ServerSettings() == settings


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"metrics_tenants": "acme,../globex"}, "tenant id"),
        ({"metrics_token": "short"}, "at least 16 characters"),
        ({"metrics_token": ACME_TOKEN}, "not be a tenant's token"),
        ({"metrics_port": 0}, "greater than or equal to 1"),
        ({"metrics_port": 65536}, "less than or equal to 65535"),
    ],
)
@pytest.mark.usefixtures("_no_server_variables")
def test_bad_metrics_settings_are_refused(given: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        ServerSettings(tokens=TOKENS, **given)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--metrics-port", "0"], "give from 1 to 65535"),
        (
            ["--port", "8123", "--workers", "2", "--metrics-port", "8122"],
            "--port 8123 is one of the metrics ports 8122-8123",
        ),
        (["--workers", "3", "--metrics-port", "65534"], "needs ports up to 65536"),
    ],
)
@pytest.mark.usefixtures("_no_server_variables")
def test_serve_refuses_metrics_ports_it_cannot_give_every_worker(
    arguments: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["serve", "--store", str(tmp_path / "results"), *arguments])
    error = capsys.readouterr().err
    assert code == 2 and len(error.splitlines()) == 1 and message in error, error


def _app(port: int) -> Any:
    return create_app(ServerSettings(store=f"memory://metrics-{uuid.uuid4().hex}", tokens=TOKENS, metrics_port=port))


@pytest.mark.usefixtures("_no_server_variables")
def test_the_app_serves_metrics_on_their_own_port_while_it_runs_and_keeps_a_provider_already_set(
    caplog: pytest.LogCaptureFixture,
) -> None:
    process_reader()  # this test process's provider (a process sets one once): the app must keep it, and say so
    port = free_port()
    with caplog.at_level(logging.INFO), TestClient(_app(port)) as client:
        assert client.get("/metrics", headers=bearer(ACME_TOKEN)).status_code == 404
        answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
        assert answer.status_code == 200 and answer.headers["Content-Type"].startswith("text/plain")
    assert "already set" in caplog.text
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)


@pytest.mark.usefixtures("_no_server_variables")
def test_a_worker_takes_the_first_free_port_of_its_range_and_stops_when_none_is_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    process_reader()
    monkeypatch.setenv(WORKERS_VARIABLE, "2")
    first = free_port_range(2)
    with socket.create_server(("127.0.0.1", first)):  # another worker (or anyone) holds the first port
        with TestClient(_app(first)):
            assert httpx.get(f"http://127.0.0.1:{first + 1}/metrics", timeout=30).status_code == 200
        refused = pytest.raises(ServerStartupError, match=f"Every port of {first}-{first + 1}")
        with socket.create_server(("127.0.0.1", first + 1)), refused, TestClient(_app(first)):
            pass


async def test_a_failed_turn_is_counted_as_failed(metric_readings: MetricReadings) -> None:
    def unreachable_model(messages: list[ChatMessage]) -> ChatMessage:
        raise ConnectionError("the model endpoint does not answer")

    service = ChatService(build_agent(MockChatGenerator(response_fn=unreachable_model)))
    store = FsspecToolResultStore(f"memory://metrics-{uuid.uuid4().hex}").for_session("acme", "chat-1")
    with pytest.raises(RunFailedError):
        await service.send_message(store, "Chart revenue")
    [end] = [
        json.loads(decompress_document(data)) for name, data in _history(store).items() if name.endswith(".end.json")
    ]
    assert end["status"] == "failed"
    assert metric_readings.recorded("offload.turn.duration", offload__status="failed")[0] == 1


def _history(store: FsspecToolResultStore) -> dict[str, bytes]:
    documents = store.documents(HISTORY_NAMESPACE)
    return {name: documents.get(name) for name in documents.list()}


def test_idle_connections_to_the_metrics_port_get_no_thread_past_the_cap_and_the_api_keeps_answering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    process_reader()
    monkeypatch.setenv(WORKERS_VARIABLE, "1")
    port = free_port()
    with TestClient(_app(port)) as client:
        threads_before = threading.active_count()
        with ExitStack() as idle:
            # Connect and send nothing, as the red team's 1,010 connections did.
            # No socket timeout: peeking with MSG_DONTWAIT must not wait (Python waits up to a timeout set).
            held = [idle.enter_context(socket.create_connection(("127.0.0.1", port))) for _ in range(200)]
            deadline = time.monotonic() + 20
            while len(_closed_by_server(held)) < len(held) - MAX_SCRAPE_CONNECTIONS and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(_closed_by_server(held)) == len(held) - MAX_SCRAPE_CONNECTIONS
            assert threading.active_count() - threads_before <= MAX_SCRAPE_CONNECTIONS
            assert client.get("/api/health").status_code == 200
        # The idle ones gone, their slots come back: the port serves a scrape again.
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).status_code == 200


def _closed_by_server(connections: list[socket.socket]) -> list[socket.socket]:
    closed = []
    for connection in connections:
        try:
            if connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                closed.append(connection)
        except (BlockingIOError, TimeoutError):
            pass
        except ConnectionResetError:
            closed.append(connection)
    return closed
