"""
A decision through `ChatService.decide` (the decision, the pending check and the resume it runs, in one request) reads
each approval, audit and history document at most once, at any length of the session's approval history (issue 42):
what one part of the request read is passed on to the next, never read again; a message whose run holds a step does not
read back the step it just recorded. The conditional writes still guard: a claim another worker makes after the
decision's read is refused by the resume claim's conditional create.
"""

import asyncio
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from approval_history import seed
from approval_scenario import ledger_lines, make_agent, plan
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy

from haystack_integrations.offload import Decision, FsspecToolResultStore, decide_async
from haystack_integrations.offload.approvals.approval_records import StepClaim
from haystack_integrations.offload.approvals.ledger import now
from haystack_integrations.offload.sessions import ChatService, ConversationCache
from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy, ProxiedRequest

pytestmark = pytest.mark.s3

DECIDE_READS = 10
"""
The approval and audit reads of one decide request that resumes a one-call step (29 before each part passed on what it
read): the step (decide), the head, the next step number, the step's done record and resume claim (one snapshot), the
step's request and decision events (the audit check), the previous step's done record (a lost turn's answers), the
call's claim and outcome (before it runs). Beside them the turn reads the history (3 GETs today: its head, newest end
and next start), counted in the request's totals, which are equal at both sizes.
"""

HOLD_READS = 2
"""
The approval and audit reads of a message whose run holds a step (8 before the hook handed the step it held to the
service): the approvals head and the next step number (the hold numbers its step).
"""

Costs = tuple[Counter[str], Counter[str]]
"""A request's requests by kind, and its reads by object."""


def kind(request: Any) -> str:
    """A request's kind: LIST for a ListObjectsV2, else its method."""
    return "LIST" if "list-type=2" in request.query else str(request.method)


def key(request: Any) -> str:
    """The object a request is about, below the session (its prefix, for a LIST)."""
    return f"{request.path.split('/chat-1/', 1)[-1]}?{request.query}" if kind(request) == "LIST" else request.path


def approval_reads(reads: Counter[str]) -> int:
    """How many of the reads were of the session's approval and audit documents."""
    return sum(count for name, count in reads.items() if "/.approvals/" in name or "/.audit/" in name)


def costs(log: list[Any]) -> Costs:
    """A request log's requests by kind, and its reads by object."""
    reads = Counter(key(request) for request in log if kind(request) in ("GET", "HEAD", "LIST"))
    return Counter(kind(request) for request in log), reads


async def round_trip_costs(s3_server: Any, s3_requests: Any, ledger: Path, prior: int) -> dict[str, Costs]:
    """
    Seed `prior` decided approvals, run one round trip through `ChatService`, then another, measured.

    :returns: The `Costs` of the measured round trip's message (``send``) and decision (``decide``).
    """
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options()
    )
    await root.warm_up_async()
    assert root.check_exclusive_creates().enforced
    session = root.for_session("acme", "chat-1")
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    await seed(root, session, agent, prior)
    # A cache of its own: what other tests in this process leave in the shared one is not this test's cost.
    service = ChatService(agent, conversation_cache=ConversationCache())
    measured: dict[str, Costs] = {}
    for call_id in ("warm", "measured"):  # what the first round trip learns once (a process's checks) is not measured
        s3_requests.clear()
        held = await service.send_message(
            session, plan(("send_invoice", {"customer": "acme", "amount": 10}, call_id)).text or ""
        )
        measured["send"] = costs(s3_requests.snapshot())
        # What the message reports waiting is what the ledger says waits.
        assert held.status == "approval_required" and held.pending == await service.pending(session)
        [request] = held.pending
        assert request.tool_call_id == call_id
        ran = len(ledger_lines(ledger))
        s3_requests.clear()
        decided = await service.decide(session, request.request_id, approved=True, actor="alice")
        measured["decide"] = costs(s3_requests.snapshot())
        assert len(ledger_lines(ledger)) == ran + 1  # the approved call ran, once
        assert decided.resumed is not None and decided.resumed.status == "completed"
        assert decided.resumed.reply == "final: invoice sent to acme for 10"
    return measured


def test_a_decide_request_reads_each_document_once_after_10_and_after_200_decided_approvals(
    s3_server: Any, s3_requests: Any, ledger: Path
) -> None:
    small, small_reads = asyncio.run(round_trip_costs(s3_server, s3_requests, ledger, 10))["decide"]
    large, large_reads = asyncio.run(round_trip_costs(s3_server, s3_requests, ledger, 200))["decide"]
    for kinds, reads in ((small, small_reads), (large, large_reads)):
        assert [name for name, count in reads.items() if count > 1] == [], reads
        assert approval_reads(reads) == DECIDE_READS, reads
        assert kinds["HEAD"] == kinds["LIST"] == 0, kinds
    assert small == large, (small, large)  # every kind, GET and LIST included, the same at both sizes


def test_a_message_that_holds_reads_no_document_twice_after_10_and_after_200_decided_approvals(
    s3_server: Any, s3_requests: Any, ledger: Path
) -> None:
    small, small_reads = asyncio.run(round_trip_costs(s3_server, s3_requests, ledger, 10))["send"]
    large, large_reads = asyncio.run(round_trip_costs(s3_server, s3_requests, ledger, 200))["send"]
    for kinds, reads in ((small, small_reads), (large, large_reads)):
        assert [name for name, count in reads.items() if count > 1] == [], reads
        assert approval_reads(reads) == HOLD_READS, reads
        assert kinds["HEAD"] == kinds["LIST"] == 0, kinds
    assert small == large, (small_reads, large_reads)


TAKEOVER_READS = 12
"""
The approval and audit reads of a resume that takes over a claim whose lease lapsed (26 before the snapshot kept the
claim it read): the head, the next step number, the step, its done record, decision and two resume claims (the lapsed
one, the next missing), the step's request and decision events, the previous step's done record, the call's claim and
outcome.
"""


async def takeover_costs(s3_server: Any, s3_requests: Any, ledger: Path, prior: int) -> Costs:
    """
    Seed `prior` decided approvals, hold a step and decide it without resuming; a worker that claimed its resume died
    (its lease lapsed long ago). Measure `ChatService.resume` taking the step over.
    """
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options()
    )
    await root.warm_up_async()
    session = root.for_session("acme", "chat-1")
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    await seed(root, session, agent, prior)
    # A cache of its own: what other tests in this process leave in the shared one is not this test's cost.
    service = ChatService(agent, conversation_cache=ConversationCache())
    held = await service.send_message(
        session, plan(("send_invoice", {"customer": "acme", "amount": 10}, "taken-over")).text or ""
    )
    [request] = held.pending
    await decide_async(session, request.request_id, Decision.approve(by="alice"))
    at = now() - timedelta(minutes=10)
    dead = StepClaim(
        step_id=request.step_id,
        tenant="acme",
        session="chat-1",
        attempt=1,
        claimed_by="a-worker-that-died",
        claimed_at=at,
        lease_until=at + timedelta(minutes=2),
    )
    sequence = int(request.step_id[:8])
    await session.documents("approvals").create_async(
        f"resume.{sequence:08d}.001.json", dead.model_dump_json().encode()
    )
    ran = len(ledger_lines(ledger))
    s3_requests.clear()
    resumed = await service.resume(session)
    measured = costs(s3_requests.snapshot())
    assert resumed.status == "completed" and [o.outcome for o in resumed.approval_outcomes] == ["executed"]
    assert len(ledger_lines(ledger)) == ran + 1
    # The takeover is the step's second attempt: the lapsed claim was judged from the one read of it.
    claims = await session.documents("approvals").list_async()
    assert f"resume.{sequence:08d}.002.json" in claims
    return measured


def test_a_resume_that_takes_over_a_lapsed_claim_reads_each_document_once_after_10_and_after_200(
    s3_server: Any, s3_requests: Any, ledger: Path
) -> None:
    small, small_reads = asyncio.run(takeover_costs(s3_server, s3_requests, ledger, 10))
    large, large_reads = asyncio.run(takeover_costs(s3_server, s3_requests, ledger, 200))
    for kinds, reads in ((small, small_reads), (large, large_reads)):
        assert [name for name, count in reads.items() if count > 1] == [], reads
        assert approval_reads(reads) == TAKEOVER_READS, reads
        assert kinds["HEAD"] == kinds["LIST"] == 0, kinds
    assert small == large, (small_reads, large_reads)


class _ClaimOnTurnClaim(FaultPlan):
    """
    When the decide request claims its turn (after it read the held step), another worker's claim on the step lands
    first: written straight to the server, with a live lease, before the turn claim is passed on.
    """

    def __init__(self, direct: FsspecToolResultStore) -> None:
        super().__init__()
        self.direct = direct
        self.armed = False
        self.claimed: list[str] = []

    def decide(self, request: ProxiedRequest) -> Fault | None:
        if (
            self.armed
            and request.method == "PUT"
            and "/.history/" in request.target
            and ".start.json" in request.target
        ):
            self.armed = False
            approvals = self.direct.documents("approvals")
            [step] = [name for name in approvals.list() if name.startswith("step.")]
            sequence = int(step.split(".")[1])
            step_id = self._step_id(approvals, step)
            at = now()
            claim = StepClaim(
                step_id=step_id,
                tenant="acme",
                session="chat-1",
                attempt=1,
                claimed_by="another-worker",
                claimed_at=at,
                lease_until=at + timedelta(minutes=5),
            )
            name = f"resume.{sequence:08d}.001.json"
            approvals.create(name, claim.model_dump_json().encode())
            self.claimed.append(name)
        return super().decide(request)

    @staticmethod
    def _step_id(approvals: Any, name: str) -> str:
        import json

        return str(json.loads(approvals.get(name))["step_id"])


def test_a_claim_made_after_the_decision_read_the_step_is_refused_by_the_resume_claim(
    s3_server: Any, ledger: Path
) -> None:
    """
    The decide request reads the held step once, before it claims its turn; another worker's resume claim that lands
    between that read and the request's own claim is not missed: the claim's conditional create refuses this worker,
    nothing runs here, and the decision is reported as resumed elsewhere.
    """
    prefix = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    direct = FsspecToolResultStore(prefix, storage_options=s3_server.storage_options()).for_session("acme", "chat-1")
    plan_ = _ClaimOnTurnClaim(direct)
    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.plan = plan_
        options = {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        session = FsspecToolResultStore(prefix, storage_options=options).for_session("acme", "chat-1")
        service = ChatService(make_agent({"send_invoice": AlwaysAskPolicy()}))

        async def scenario() -> None:
            held = await service.send_message(
                session, plan(("send_invoice", {"customer": "acme", "amount": 10}, "c1")).text or ""
            )
            [request] = held.pending
            plan_.armed = True
            outcome = await service.decide(session, request.request_id, approved=True, actor="alice")
            assert plan_.claimed == ["resume.00000001.001.json"]
            assert outcome.resumed is None and outcome.resumed_elsewhere
            assert outcome.decision.approved

        asyncio.run(scenario())
    assert ledger_lines(ledger) == []  # the other worker holds the step: nothing ran here
