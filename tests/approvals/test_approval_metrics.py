"""
The approval metrics against what really happened: the requests in the held step documents, the decision documents and
their verdicts, the calls the test's own tool ran, and the age of the oldest request waiting, as stored.

Real Agents with the scripted model drive the approval flows, as the other approval tests do; the session's
``.approvals/`` documents are read as plain JSON through a second store on the same root, never through our records.
"""

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from approval_scenario import ledger_lines, make_agent, plan
from haystack.components.agents import Agent
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy, NeverAskPolicy
from test_approval_composition import STOP_ONCE, Stop, agent_with, flaky_invoice, ran
from test_approval_service_faults import FAST_RETRY
from test_approval_workers import Worker

from haystack_integrations.offload import (
    APPROVAL_REQUIRED,
    ApprovalHook,
    CallbackApprovals,
    Decision,
    DurableApprovals,
    FsspecToolResultStore,
    decide,
    decide_async,
    metrics,
    offload_context,
    pending_approvals,
    pending_approvals_async,
    resume,
    resume_async,
)
from haystack_integrations.offload.approvals import (
    ApprovalAlreadyDecidedError,
    ApprovalClaimedError,
    ApprovalExpiredError,
)
from haystack_integrations.offload.approvals.decisions import open_step_async
from haystack_integrations.offload.approvals.ledger import known_pending
from haystack_integrations.offload.testing.faults import Fault, FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from metric_readings import MetricReadings

APPROVALS = "offload.approvals"
TENANT = "acme"
INVOICE_A = ("send_invoice", {"customer": "a", "amount": 10}, "call_a")
INVOICE_B = ("send_invoice", {"customer": "b", "amount": 20}, "call_b")
INVOICE_C = ("send_invoice", {"customer": "c", "amount": 30}, "call_c")
SEARCH = ("web_search", {"query": "acme"}, "call_search")


class Stored:
    """A session's ``.approvals/`` documents as a second store on the same root reads them: plain JSON."""

    def __init__(self, root: FsspecToolResultStore, session: FsspecToolResultStore) -> None:
        assert session.tenant is not None and session.session is not None
        self.documents = root.for_session(session.tenant, session.session).documents("approvals")

    def read(self, prefix: str) -> list[dict[str, Any]]:
        return [json.loads(self.documents.get(name)) for name in self.documents.list() if name.startswith(prefix)]

    def requests(self) -> list[dict[str, Any]]:
        """Every request of every held step document."""
        return [call["request"] for step in self.read("step.") for call in step["calls"] if call["request"]]

    def verdicts(self) -> Counter[str]:
        """The decision documents, by verdict."""
        return Counter(
            "rejected" if not decision["approved"] else "edited" if decision["edited"] else "approved"
            for decision in self.read("decision.")
        )


def created(request: dict[str, Any]) -> float:
    """When a stored request was made, in seconds since the epoch."""
    return datetime.fromisoformat(request["created"]).timestamp()


def counted(readings: MetricReadings, event: str, **attributes: str) -> float:
    """What the approvals counter counted for the test's tenant (every count must carry the session's tenant)."""
    return readings.added(APPROVALS, offload__event=event, offload__tenant=TENANT, **attributes)


def durable(session: FsspecToolResultStore, **channel: Any) -> dict[str, Any]:
    return offload_context(session, approval_channel=DurableApprovals(**channel))


def stop(agent: Agent, session: FsspecToolResultStore, *calls: Any, **channel: Any) -> dict[str, Any]:
    reply = agent.run([plan(*calls)], hook_context=durable(session, **channel))
    assert reply["exit_reason"] == APPROVAL_REQUIRED
    return reply


@pytest.fixture(autouse=True)
def labelled_tenant() -> Iterator[None]:
    metrics.label_tenants([TENANT])
    yield
    metrics.label_tenants([])


@pytest.fixture
def agent(ledger: Path) -> Agent:
    return make_agent({"send_invoice": AlwaysAskPolicy(), "*": NeverAskPolicy()})


@pytest.fixture
def second_root(backend: Any) -> FsspecToolResultStore:
    """Another store on the test's root, as another process would open it."""
    return FsspecToolResultStore(backend.url, storage_options=backend.storage_options, **backend.store_kwargs)


def new_session(store: FsspecToolResultStore) -> FsspecToolResultStore:
    # A session of its own per test: the worker's view of what waits is kept by tenant and session.
    return store.for_session(TENANT, f"chat-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def session(store: FsspecToolResultStore) -> FsspecToolResultStore:
    return new_session(store)


@pytest.fixture
def stored(second_root: FsspecToolResultStore, session: FsspecToolResultStore) -> Stored:
    return Stored(second_root, session)


def fresh_figure(monkeypatch: pytest.MonkeyPatch) -> metrics.PendingApprovals:
    """Give this worker's view a figure of its own: the process's holds whatever earlier tests left waiting."""
    fresh = metrics.PendingApprovals()
    monkeypatch.setattr(known_pending, "figure", fresh)
    return fresh


@pytest.fixture
def gauge(monkeypatch: pytest.MonkeyPatch) -> metrics.PendingApprovals:
    return fresh_figure(monkeypatch)


# Counters


def test_requests_decisions_and_runs_are_counted_as_the_store_and_the_tool_saw_them(
    agent: Agent, session: FsspecToolResultStore, stored: Stored, ledger: Path, metric_readings: MetricReadings
) -> None:
    reply = stop(agent, session, INVOICE_A, INVOICE_B, INVOICE_C, SEARCH)
    assert counted(metric_readings, "requested") == len(stored.requests()) == 3

    ids = {request.tool_call_id: request.request_id for request in pending_approvals(session)}
    decide(session, ids["call_a"], Decision.approve(by="alice"))
    decide(session, ids["call_b"], Decision.approve({"customer": "b", "amount": 25}, by="alice"))
    decide(session, ids["call_c"], Decision.deny("No.", by="alice"))
    with pytest.raises(ApprovalAlreadyDecidedError):  # a second answer records nothing
        decide(session, ids["call_a"], Decision.approve(by="bob"))
    verdicts = stored.verdicts()
    assert counted(metric_readings, "decided") == sum(verdicts.values()) == 3
    for verdict in ("approved", "edited", "rejected"):
        assert counted(metric_readings, "decided", offload__verdict=verdict) == verdicts[verdict] == 1

    final = resume(agent, reply["messages"], session)
    # The search needed no approval: it ran with the step, but only the calls a person approved count as executed.
    assert "results for acme" in (final["last_message"].text or "")
    assert counted(metric_readings, "executed") == len(ledger_lines(ledger)) == 2
    assert counted(metric_readings, "expired") == counted(metric_readings, "may_have_run") == 0


def test_deciders_racing_for_one_request_count_the_one_decision_recorded(
    agent: Agent, session: FsspecToolResultStore, stored: Stored, metric_readings: MetricReadings
) -> None:
    stop(agent, session, INVOICE_A)
    [request] = pending_approvals(session)

    def attempt(who: int) -> bool:
        try:
            decide(session, request.request_id, Decision.approve(by=f"decider-{who}"))
        except ApprovalAlreadyDecidedError:
            return False
        return True

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert sum(pool.map(attempt, range(6))) == 1
    assert counted(metric_readings, "decided", offload__verdict="approved") == len(stored.read("decision.")) == 1


def test_resumes_racing_for_one_step_count_its_call_once_where_it_ran(
    agent: Agent, session: FsspecToolResultStore, ledger: Path, metric_readings: MetricReadings
) -> None:
    reply = stop(agent, session, INVOICE_A)
    [request] = pending_approvals(session)
    decide(session, request.request_id, Decision.approve())

    def attempt(worker: int) -> str:
        try:
            resume(agent, reply["messages"], session, worker=f"worker-{worker}")
        except ApprovalClaimedError:
            return "claimed"
        return "resumed"

    with ThreadPoolExecutor(max_workers=3) as pool:
        assert sorted(pool.map(attempt, range(3))) == ["claimed", "claimed", "resumed"]
    assert counted(metric_readings, "executed") == len(ledger_lines(ledger)) == 1


def test_a_request_nobody_decided_counts_as_expired_once_when_its_resume_answers_it(
    agent: Agent, session: FsspecToolResultStore, stored: Stored, ledger: Path, metric_readings: MetricReadings
) -> None:
    reply = stop(agent, session, INVOICE_A, ttl=0)
    assert pending_approvals(session) == []
    assert counted(metric_readings, "expired") == 0  # a listing passes over it without counting

    final = resume(agent, reply["messages"], session)
    with pytest.raises(ApprovalClaimedError):
        resume(agent, reply["messages"], session)
    assert [outcome.outcome for outcome in final["approval_outcomes"]] == ["expired"]
    at = datetime.now(UTC)
    decided = {decision["request_id"] for decision in stored.read("decision.")}
    expired = [
        r for r in stored.requests() if datetime.fromisoformat(r["expires"]) <= at and r["request_id"] not in decided
    ]
    assert counted(metric_readings, "expired") == len(expired) == 1
    assert counted(metric_readings, "executed") == len(ledger_lines(ledger)) == 0


def test_a_decision_made_too_late_counts_as_expired_and_records_nothing(
    agent: Agent, session: FsspecToolResultStore, stored: Stored, metric_readings: MetricReadings
) -> None:
    stop(agent, session, INVOICE_A, ttl=0)
    [request] = stored.requests()
    with pytest.raises(ApprovalExpiredError):
        decide(session, request["request_id"], Decision.approve())
    assert counted(metric_readings, "expired") == 1
    assert counted(metric_readings, "decided") == len(stored.read("decision.")) == 0


async def test_a_call_whose_worker_stopped_counts_as_may_have_run_and_its_approved_retry_as_executed(
    session: FsspecToolResultStore, stored: Stored, ledger: Path, metric_readings: MetricReadings
) -> None:
    STOP_ONCE.clear()
    agent = agent_with([ApprovalHook({"send_invoice": AlwaysAskPolicy()})], invoice=flaky_invoice)
    reply = await agent.run_async([plan(INVOICE_A)], hook_context=durable(session))
    [request] = await pending_approvals_async(session)
    await decide_async(session, request.request_id, Decision.approve())
    with pytest.raises(Stop):  # the worker dies mid-call, after the invoice went out
        await resume_async(agent, reply["messages"], session, lease=0.3)
    await lease_passed(stored)

    again = await resume_async(agent, reply["messages"], session)
    assert again["exit_reason"] == APPROVAL_REQUIRED
    [uncertain] = [request for request in stored.requests() if request["guard"] == "may-have-run"]
    assert counted(metric_readings, "may_have_run") == 1
    assert counted(metric_readings, "requested") == len(stored.requests()) == 2
    assert counted(metric_readings, "executed") == 0
    await decide_async(session, uncertain["request_id"], Decision.approve())
    await resume_async(agent, again["messages"], session)
    # The invoice went out twice: in the try whose worker died (may have run), and in the approved retry (executed).
    assert len(ran(ledger)) == 2
    assert counted(metric_readings, "executed") + counted(metric_readings, "may_have_run") == len(ran(ledger))
    assert counted(metric_readings, "executed") == 1


async def lease_passed(stored: Stored) -> None:
    """Wait until the newest resume claim's lease has passed, as a dead worker's does."""
    until = max(datetime.fromisoformat(claim["lease_until"]) for claim in stored.read("resume."))
    await asyncio.sleep(max(0.0, (until - datetime.now(UTC)).total_seconds()) + 0.05)


def test_the_in_process_channel_counts_each_question_and_each_answer(
    session: FsspecToolResultStore, ledger: Path, metric_readings: MetricReadings
) -> None:
    answers = {
        "call_a": Decision.approve(),
        "call_b": Decision.approve({"customer": "b", "amount": 25}),
        "call_c": Decision.deny("No."),
    }
    asked: list[str | None] = []

    def answer(request: Any) -> Decision:
        asked.append(request.tool_call_id)
        return answers[request.tool_call_id]

    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    channel = CallbackApprovals(answer, timeout=60)
    agent.run([plan(INVOICE_A, INVOICE_B, INVOICE_C)], hook_context=offload_context(session, approval_channel=channel))
    assert counted(metric_readings, "requested") == len(asked) == 3
    for verdict in ("approved", "edited", "rejected"):
        assert counted(metric_readings, "decided", offload__verdict=verdict) == 1
    assert len(ledger_lines(ledger)) == 2


def test_a_question_nobody_answers_in_time_counts_as_expired(
    session: FsspecToolResultStore, ledger: Path, metric_readings: MetricReadings
) -> None:
    asked, released = threading.Event(), threading.Event()

    def never_in_time(request: Any) -> bool:
        asked.set()
        released.wait(30)
        return True

    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    channel = CallbackApprovals(never_in_time, timeout=0.05)
    try:
        agent.run([plan(INVOICE_A)], hook_context=offload_context(session, approval_channel=channel))
    finally:
        released.set()
    assert asked.wait(10)  # the person was asked (the callback runs in a thread of its own)
    assert counted(metric_readings, "requested") == 1
    assert counted(metric_readings, "expired") == 1
    assert counted(metric_readings, "decided") == 0
    assert ledger_lines(ledger) == []


# The oldest pending approval


def test_the_oldest_pending_age_is_the_oldest_stored_request_until_it_is_decided(
    agent: Agent, store: FsspecToolResultStore, second_root: FsspecToolResultStore, gauge: metrics.PendingApprovals
) -> None:
    first, second = new_session(store), new_session(store)
    stop(agent, first, INVOICE_A)
    stop(agent, second, INVOICE_B)
    [older], [newer] = Stored(second_root, first).requests(), Stored(second_root, second).requests()
    now = created(newer) + 600

    assert gauge.oldest_age(now=now) == now - created(older)
    decide(first, older["request_id"], Decision.approve())
    assert gauge.oldest_age(now=now) == now - created(newer)
    decide(second, newer["request_id"], Decision.deny())
    assert gauge.oldest_age(now=now) is None


def test_the_exported_gauge_is_fed_by_this_workers_view(
    agent: Agent, session: FsspecToolResultStore, stored: Stored
) -> None:
    assert known_pending.figure is metrics.pending_approvals
    stop(agent, session, INVOICE_A)
    [request] = stored.requests()
    now = created(request) + 60
    # The process's figure also holds what earlier tests left waiting: it is at least as old as this request.
    age = metrics.pending_approvals.oldest_age(now=now)
    assert age is not None and age >= now - created(request)


LISTINGS: dict[str, Callable[[FsspecToolResultStore], object]] = {
    "pending_approvals": pending_approvals,
    "pending_approvals_async": lambda session: asyncio.run(pending_approvals_async(session)),
    "open_step_async": lambda session: asyncio.run(open_step_async(session)),
}


@pytest.mark.parametrize("listing", LISTINGS)
def test_a_worker_that_lists_a_sessions_pending_requests_counts_them(
    agent: Agent,
    session: FsspecToolResultStore,
    stored: Stored,
    monkeypatch: pytest.MonkeyPatch,
    listing: str,
) -> None:
    stop(agent, session, INVOICE_A)
    # Another worker, which did not hold the step: it knows of the request once it lists it.
    other = fresh_figure(monkeypatch)
    assert other.oldest_age() is None
    LISTINGS[listing](session)
    [request] = stored.requests()
    now = created(request) + 60
    assert other.oldest_age(now=now) == now - created(request)


@pytest.mark.slow
def test_an_expired_request_leaves_the_figure_when_seen_expired_or_at_the_next_sighting_of_any_session(
    agent: Agent, store: FsspecToolResultStore, second_root: FsspecToolResultStore, gauge: metrics.PendingApprovals
) -> None:
    decided_late, forgotten, other = new_session(store), new_session(store), new_session(store)
    stop(agent, decided_late, INVOICE_A, ttl=3)
    stop(agent, forgotten, INVOICE_B, ttl=3)
    [late], [last] = Stored(second_root, decided_late).requests(), Stored(second_root, forgotten).requests()
    now = created(last) + 600
    assert gauge.oldest_age(now=now) == now - created(late)
    expires = datetime.fromisoformat(last["expires"])
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.05)

    with pytest.raises(ApprovalExpiredError):
        decide(decided_late, late["request_id"], Decision.approve())
    assert gauge.oldest_age(now=now) == now - created(last)
    assert pending_approvals(other) == []  # nobody looks at the forgotten session again
    assert gauge.oldest_age(now=now) is None


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def shared_root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A root that another process can reach: a directory, or a prefix on moto's S3 server."""
    if request.param == "local":
        return str(tmp_path / "results"), {}
    server = request.getfixturevalue("s3_server")
    return f"{server.bucket_url}/{uuid.uuid4().hex}", server.storage_options()


# What this worker does when it next sees a session another worker moved on: each settles the session's request here.
Sighting = Callable[[Agent, FsspecToolResultStore, dict[str, Any], str], object]
SIGHTINGS: list[tuple[bool, Sighting]] = [
    # (resumed elsewhere too, what this worker does): agent, session, the held run's reply, its request
    (True, lambda agent, session, reply, request_id: pending_approvals(session)),
    (True, lambda agent, session, reply, request_id: asyncio.run(open_step_async(session))),
    (False, lambda agent, session, reply, request_id: resume(agent, reply["messages"], session)),
    (False, lambda agent, session, reply, request_id: decide_again(session, request_id)),
]


def decide_again(session: FsspecToolResultStore, request_id: str) -> None:
    with pytest.raises(ApprovalAlreadyDecidedError):
        decide(session, request_id, Decision.approve())


@pytest.mark.slow
def test_requests_another_worker_decided_leave_this_workers_figure_when_it_sees_their_sessions(
    shared_root: tuple[str, dict[str, Any]], ledger: Path, gauge: metrics.PendingApprovals
) -> None:
    url, options = shared_root
    root = FsspecToolResultStore(url, storage_options=options, engine="fsspec")
    sessions = [new_session(root) for _ in SIGHTINGS]
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})  # the workers' own rules, so the same guard
    replies = [stop(agent, session, INVOICE_A) for session in sessions]
    requests = [request for session in sessions for request in Stored(root, session).requests()]
    oldest_first = [created(request) for request in requests]
    now = oldest_first[-1] + 600
    elsewhere = Worker(ledger)
    try:
        for session, reply, (resumed, _) in zip(sessions, replies, SIGHTINGS, strict=True):
            decided_elsewhere(elsewhere, {"url": url, "storage_options": options}, session, reply, resume=resumed)
    finally:
        elsewhere.close()
    # This worker saw none of that: its figure has not moved.
    assert gauge.oldest_age(now=now) == now - oldest_first[0]

    for index, (session, reply, (_, sighting)) in enumerate(zip(sessions, replies, SIGHTINGS, strict=True)):
        sighting(agent, session, reply, requests[index]["request_id"])
        later = oldest_first[index + 1 :]
        assert gauge.oldest_age(now=now) == (now - later[0] if later else None)
    assert len(ledger_lines(ledger)) == 3


def decided_elsewhere(
    worker: Worker, root: dict[str, Any], session: FsspecToolResultStore, reply: dict[str, Any], *, resume: bool
) -> None:
    """Approve a session's one request in another worker process, and resume its step there too if asked."""
    scope = {**root, "tenant": session.tenant, "session": session.session}
    worker.send(op="decide", decisions={"call_a": Decision.approve().model_dump(mode="json")}, **scope)
    assert worker.receive() == {"status": "decided", "calls": ["call_a"]}
    if not resume:
        return
    messages = [message.to_dict() for message in reply["messages"]]
    worker.send(op="prepare", messages=messages, worker="elsewhere", **scope, **{"async": False})
    assert worker.receive() == {"status": "ready"}
    worker.send(op="go")
    assert worker.receive()["status"] == "resumed"


# On moto, through the fault proxy


@pytest.fixture(scope="module")
def fault_proxy(s3_server: LocalS3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint_url) as proxy:
        yield proxy


@pytest.fixture(params=["fsspec", "obstore"])
def faulty_root(s3_server: LocalS3Server, fault_proxy: FaultProxy, request: pytest.FixtureRequest) -> Any:
    options = {**s3_server.storage_options(), "endpoint_url": fault_proxy.endpoint_url}
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    return FsspecToolResultStore(url, storage_options=options, retry=FAST_RETRY, engine=request.param)


@pytest.mark.s3
async def test_a_decision_retried_after_a_503_is_counted_once(
    faulty_root: FsspecToolResultStore,
    s3_server: LocalS3Server,
    fault_proxy: FaultProxy,
    s3_requests: RequestLog,
    ledger: Path,
    metric_readings: MetricReadings,
) -> None:
    session = faulty_root.for_session(TENANT, "chat-503")
    stored = Stored(FsspecToolResultStore(faulty_root.url, storage_options=s3_server.storage_options()), session)
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    await agent.run_async([plan(INVOICE_A)], hook_context=durable(session))
    [request] = await pending_approvals_async(session)
    earlier = len(fault_proxy.faults.snapshot())  # the proxy serves the whole module
    s3_requests.clear()

    fault_proxy.inject(Fault.SLOW_DOWN, method="PUT", path_contains="/.approvals/decision.")
    await decide_async(session, request.request_id, Decision.approve())
    with pytest.raises(ApprovalAlreadyDecidedError) as again:  # the client, unsure, sends it again
        await decide_async(session, request.request_id, Decision.approve())
    assert again.value.repeated

    injected = fault_proxy.faults.snapshot()[earlier:]
    assert [(fault.kind, "/.approvals/decision." in fault.request.target) for fault in injected] == [
        (Fault.SLOW_DOWN, True)
    ]
    # moto saw the create that landed and the repeat it refused; the 503 was answered before it.
    reached = [put.status for put in s3_requests.filter(method="PUT", path_contains="/.approvals/decision.")]
    assert reached == [200, 412]
    assert counted(metric_readings, "decided") == reached.count(200) == len(stored.read("decision.")) == 1
