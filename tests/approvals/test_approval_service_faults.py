"""
The reference server's approval flow (message -> hold -> decide -> resume) under faults: a lost reply to a conditional
create, and a worker that dies while it resumes. Run through `ChatService`, the framework-free core of the server.
"""

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from approval_scenario import ledger_lines, plan
from test_approval_composition import (
    STOP_ONCE,
    Stop,
    agent_with,
    approvals,
    block_wipe,
    durable,
    flaky_invoice,
    ran,
    slow_invoice,
)

from haystack_integrations.offload import (
    Decision,
    FsspecToolResultStore,
    RetryPolicy,
    decide,
    pending_approvals,
    read_audit,
    resume,
)
from haystack_integrations.offload.approvals import ApprovalAlreadyDecidedError
from haystack_integrations.offload.approvals.approval_records import ApprovalRequest, AuditEvent, arguments_digest
from haystack_integrations.offload.approvals.audit import (
    append_audit,
    append_audit_async,
    new_event,
    read_audit_async,
    requested_event,
)
from haystack_integrations.offload.approvals.ledger import ApprovalLedger
from haystack_integrations.offload.approvals.resume import OUTCOMES_KEY
from haystack_integrations.offload.errors import StorageError, StorageUnavailableError
from haystack_integrations.offload.sessions.errors import ApprovalPendingConflict, RunFailedError, SessionBusyError
from haystack_integrations.offload.sessions.history import SessionHistory
from haystack_integrations.offload.sessions.service import ChatService
from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy, ProxiedRequest
from haystack_integrations.offload.testing.local_s3 import LocalS3Server
from support.isolation import RGW_LANE, isolation_kwargs

FAST_RETRY = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, attempt_timeout=2.0)


# The faults go between the store and moto, and, in the RGW lane, between the store and RGW with STS credentials and
# an SSE-C key per tenant (STS itself is asked directly: these faults are the object store's).
FAULTY_SERVERS = ["moto"]
if RGW_LANE:
    FAULTY_SERVERS.append(pytest.param("rgw-isolated", marks=pytest.mark.rgw))


@pytest.fixture(scope="module", params=FAULTY_SERVERS)
def faulty_server(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("s3_server" if request.param == "moto" else "real_s3_server")


@pytest.fixture(scope="module")
def fault_proxy(faulty_server: Any) -> Iterator[FaultProxy]:
    with FaultProxy(faulty_server.endpoint_url, slow_seconds=0.3, hold_seconds=5.0) as proxy:
        yield proxy


@pytest.fixture(params=["fsspec", "obstore"])
def faulty_session(
    faulty_server: Any, fault_proxy: FaultProxy, request: pytest.FixtureRequest
) -> FsspecToolResultStore:
    options = {
        **faulty_server.storage_options(),
        "endpoint_url": fault_proxy.endpoint_url,
        # No fault delays a connect: it may take an attempt's time on a loaded machine (see tests/operations).
        "config_kwargs": {"read_timeout": 0.5, "connect_timeout": 2},
    }
    isolation: dict[str, Any] = {}
    if not isinstance(faulty_server, LocalS3Server):
        role = request.getfixturevalue("real_s3_tenant_role")
        isolation = isolation_kwargs(role, sts_endpoint_url=faulty_server.endpoint_url)
    root = FsspecToolResultStore(
        f"{faulty_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options=options,
        retry=FAST_RETRY,
        engine=request.param,
        **isolation,
    )
    return root.for_session("acme", "chat-1")


class HeldInvoice(NamedTuple):
    """A chat whose Agent asks before every invoice, and the request its first message left waiting."""

    service: ChatService
    request: ApprovalRequest


@pytest.fixture
async def held_invoice(faulty_session: FsspecToolResultStore) -> HeldInvoice:
    """The setup of most tests through the fault proxy: one invoice call (``c1``: a, 5), held for approval."""
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook]))
    held = await service.send_message(
        faulty_session, plan(("send_invoice", {"customer": "a", "amount": 5}, "c1")).text or ""
    )
    [request] = held.pending
    return HeldInvoice(service, request)


@pytest.mark.s3
async def test_a_lost_reply_to_the_decision_does_not_lose_the_approved_call(
    faulty_session: FsspecToolResultStore, held_invoice: HeldInvoice, fault_proxy: FaultProxy, ledger: Path
) -> None:
    service, request = held_invoice
    # S3 stores the decision, the connection drops before its answer, aiohttp resends the PUT and gets 412.
    fault_proxy.inject(Fault.RESET_AFTER, method="PUT")
    outcome = await service.decide(faulty_session, request.request_id, approved=True)
    assert outcome.resumed is not None and not outcome.resumed_elsewhere
    assert ran(ledger) == [("invoice", "a:5")]
    assert [o.outcome for o in outcome.resumed.approval_outcomes] == ["executed"]


@pytest.mark.s3
async def test_a_lost_reply_to_the_resume_claim_still_runs_the_call_once(
    faulty_session: FsspecToolResultStore, held_invoice: HeldInvoice, fault_proxy: FaultProxy, ledger: Path
) -> None:
    service, request = held_invoice
    # Lose the reply to every conditional create of the flow once: decision, turn start, resume claim, call claim.
    documents = (".approvals/decision", ".history/turn.", ".approvals/resume", ".approvals/claim")
    earlier = len(fault_proxy.faults.snapshot())  # the proxy serves the whole module
    for document in documents:
        fault_proxy.inject(Fault.RESET_AFTER, method="PUT", path_contains=document)
    outcome = await service.decide(faulty_session, request.request_id, approved=True)
    hit = [fault.request.target for fault in fault_proxy.faults.snapshot()[earlier:]]  # each create lost its reply
    assert len(hit) == len(documents) and all(document in path for document, path in zip(documents, hit, strict=True))
    assert outcome.resumed is not None and not outcome.resumed_elsewhere
    assert ran(ledger) == [("invoice", "a:5")]
    transcript = await service.transcript(faulty_session)
    results = [m.tool_call_result for m in transcript.messages if m.tool_call_result is not None]
    assert [(r.origin.id, r.error) for r in results] == [("c1", False)]


async def test_a_worker_killed_while_resuming_leaves_a_step_that_is_resumed_not_dropped(
    store: FsspecToolResultStore, ledger: Path
) -> None:
    STOP_ONCE.clear()
    session = store.for_session("acme", "chat-9")
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook], invoice=flaky_invoice), turn_lease=0.3, resume_lease=0.3)
    held = await service.send_message(session, plan(("send_invoice", {"customer": "b", "amount": 7}, "c1")).text or "")
    [request] = held.pending
    with pytest.raises(Stop):  # the worker dies mid-call: its turn has no end, the step no done record
        await service.decide(session, request.request_id, approved=True)
    assert len(ran(ledger)) == 1
    await asyncio.sleep(0.4)

    # A new message must not drop the approved call: the conversation waits until the step is resolved.
    with pytest.raises(ApprovalPendingConflict):
        await service.send_message(session, "anything new?")
    # Resuming (any worker) does not run it again silently: it asks whether to retry the call that may have run.
    again = await service.resume(session)
    [uncertain] = again.pending
    assert uncertain.guard == "may-have-run"
    assert len(ran(ledger)) == 1
    retried = await service.decide(session, uncertain.request_id, approved=True)
    assert retried.resumed is not None and retried.resumed.status == "completed"
    keys = [json.loads(line)["key"] for line in ledger_lines(ledger)]
    assert len(keys) == 2 and keys[0] == keys[1]
    # The conversation has the call exactly once, with its result; the chat goes on.
    transcript = await service.transcript(session)
    assert [m.tool_call_result.origin.id for m in transcript.messages if m.tool_call_result] == ["c1"]
    reply = await service.send_message(session, "thanks")
    assert reply.status == "completed"


@pytest.mark.slow
async def test_an_approved_call_that_outlives_the_turn_lease_still_reaches_the_conversation(
    store: FsspecToolResultStore, ledger: Path
) -> None:
    session = store.for_session("acme", "chat-slow")
    invoice_hook, _ = approvals()
    # The call takes 3 s; both leases are 1 s: only renewal keeps the turn and the step from being taken over.
    service = ChatService(agent_with([invoice_hook], invoice=slow_invoice), turn_lease=1.0, resume_lease=1.0)
    held = await service.send_message(session, plan(("send_invoice", {"customer": "c", "amount": 9}, "c1")).text or "")
    [request] = held.pending
    deciding = asyncio.create_task(service.decide(session, request.request_id, approved=True))
    await asyncio.sleep(2.2)
    with pytest.raises((SessionBusyError, ApprovalPendingConflict)):
        await service.send_message(session, "are you done?")
    outcome = await deciding
    assert outcome.resumed is not None and outcome.resumed.status == "completed"
    transcript = await service.transcript(session)
    assert [m.tool_call_result.origin.id for m in transcript.messages if m.tool_call_result] == ["c1"]
    assert len(ran(ledger)) == 1


@pytest.mark.slow
async def test_a_long_turn_keeps_its_lease_and_its_result(store: FsspecToolResultStore, ledger: Path) -> None:
    session = store.for_session("acme", "chat-long")
    service = ChatService(agent_with([], invoice=slow_invoice), turn_lease=1.0)
    running = asyncio.create_task(
        service.send_message(session, plan(("send_invoice", {"customer": "d", "amount": 3}, "c1")).text or "")
    )
    await asyncio.sleep(2.2)  # over twice the lease: without renewal this message would end the running turn
    with pytest.raises(SessionBusyError):
        await service.send_message(session, "still there?")
    outcome = await running
    assert outcome.status == "completed"
    transcript = await service.transcript(session)
    assert [m.tool_call_result.origin.id for m in transcript.messages if m.tool_call_result] == ["c1"]


async def test_what_a_lost_resume_turn_ran_reaches_the_next_turn(store: FsspecToolResultStore, ledger: Path) -> None:
    session = store.for_session("acme", "chat-lost")
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook]), turn_lease=0.3)
    held = await service.send_message(session, plan(("send_invoice", {"customer": "e", "amount": 4}, "c1")).text or "")
    [request] = held.pending
    decided = await service.decide(session, request.request_id, approved=True)
    assert decided.resumed is not None
    # The resuming worker died after the step was done but before its turn's end was written.
    history = session.documents("history")
    [end] = [name for name in history.list() if name.startswith(f"turn.{decided.resumed.turn:08d}.end")]
    history.delete(end)
    await asyncio.sleep(0.4)
    await service.send_message(session, "and now?")
    transcript = await service.transcript(session)
    assert [m.tool_call_result.origin.id for m in transcript.messages if m.tool_call_result] == ["c1"]
    assert len(ran(ledger)) == 1


@contextlib.contextmanager
def _turn_end_lost(monkeypatch: pytest.MonkeyPatch, status: str) -> Iterator[None]:
    """The worker dies as it writes the end of a turn that ends with `status`: that turn is left without one."""
    real = SessionHistory.finish

    async def dies(self: SessionHistory, turn: Any, **kwargs: Any) -> Any:
        if kwargs.get("status") == status:
            raise RuntimeError("worker killed")
        return await real(self, turn, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(SessionHistory, "finish", dies)
        yield


async def _held_again_unrecorded(
    store: FsspecToolResultStore, name: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[ChatService, FsspecToolResultStore, str]:
    """
    Four calls under two approval hooks and a guardrail. The resume after the last invoice decision answers inv-2
    (denied) and wipe-1 (blocked), then the delete guard holds the step again; the worker dies before it records what
    it added.

    :returns: The service, the session, and the id of the delete request that now waits.
    """
    session = store.for_session("acme", name)
    invoice_hook, delete_hook = approvals()
    service = ChatService(agent_with([invoice_hook, delete_hook, block_wipe]), turn_lease=0.3)
    calls = plan(
        ("send_invoice", {"customer": "a", "amount": 1}, "inv-1"),
        ("send_invoice", {"customer": "b", "amount": 2}, "inv-2"),
        ("delete_file", {"path": "a.txt"}, "del-1"),
        ("wipe", {"path": "/"}, "wipe-1"),
    )
    inv1, inv2 = (await service.send_message(session, calls.text or "")).pending
    await service.decide(session, inv1.request_id, approved=True)

    async def dies(self: ApprovalLedger, *args: Any) -> None:
        raise RuntimeError("worker killed")

    with monkeypatch.context() as patch, pytest.raises(RunFailedError):
        patch.setattr(ApprovalLedger, "finish_step_async", dies)
        await service.decide(session, inv2.request_id, approved=False)
    [delete] = await service.pending(session)
    return service, session, delete.request_id


async def _every_answer_kept(service: ChatService, session: FsspecToolResultStore, ledger: Path) -> None:
    transcript = await service.transcript(session)
    answered = {m.tool_call_result.origin.id: m.tool_call_result for m in transcript.messages if m.tool_call_result}
    assert sorted(answered) == ["del-1", "inv-1", "inv-2", "wipe-1"]
    assert answered["inv-2"].error and answered["wipe-1"].error and not answered["inv-1"].error
    assert sorted(ran(ledger)) == [("delete", "a.txt"), ("invoice", "a:1")]


async def test_a_resume_that_holds_again_keeps_its_answers_when_its_turn_is_lost(
    store: FsspecToolResultStore, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, session, delete = await _held_again_unrecorded(store, "chat-again", monkeypatch)
    await service.decide(session, delete, approved=True)
    await _every_answer_kept(service, session, ledger)


async def test_a_step_held_again_whose_resume_turn_is_lost_keeps_the_answers_from_before_it(
    store: FsspecToolResultStore, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As above, and then the resume of the step held again also loses its turn: its recorded messages, which `resume`
    # puts back, must carry what the first resume answered before holding (inv-2 denied, wipe-1 blocked).
    service, session, delete = await _held_again_unrecorded(store, "chat-again-lost", monkeypatch)
    with _turn_end_lost(monkeypatch, "completed"), pytest.raises(RuntimeError, match="worker killed"):
        await service.decide(session, delete, approved=True)
    await asyncio.sleep(0.4)

    assert (await service.transcript(session)).resumable
    assert (await service.resume(session)).status == "completed"
    await _every_answer_kept(service, session, ledger)


async def test_a_decided_step_whose_holding_turn_never_ended_offers_continue(
    store: FsspecToolResultStore, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first message holds a step, but its turn's end is never written (the worker dies); the decision is recorded,
    # and the resume it starts fails before it claims a turn. Nothing is pending and no turn ever ended: the
    # transcript must still offer Continue (it said status None, not resumable), and resume must run the call once.
    session = store.for_session("acme", "chat-unended")
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook]), turn_lease=0.3)
    with _turn_end_lost(monkeypatch, "approval_required"), pytest.raises(RuntimeError, match="worker killed"):
        await service.send_message(session, plan(("send_invoice", {"customer": "u", "amount": 7}, "c1")).text or "")
    await asyncio.sleep(0.4)  # the turn's lease passes: it was abandoned
    [request] = await service.pending(session)

    async def unavailable(self: SessionHistory, *args: Any, **kwargs: Any) -> Any:
        raise StorageUnavailableError("the turn's claim gave up")

    with monkeypatch.context() as patch, pytest.raises(StorageUnavailableError):
        patch.setattr(SessionHistory, "begin", unavailable)
        await service.decide(session, request.request_id, approved=True)

    assert await service.pending(session) == []
    transcript = await service.transcript(session)
    assert transcript.resumable and transcript.status == "abandoned" and not transcript.busy
    assert (await service.resume(session)).status == "completed"
    finished = await service.transcript(session)
    assert [m.tool_call_result.origin.id for m in finished.messages if m.tool_call_result] == ["c1"]
    assert len(ran(ledger)) == 1


async def test_a_lost_final_resume_turn_is_finished_by_resume(
    store: FsspecToolResultStore, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = store.for_session("acme", "chat-final")
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook]), turn_lease=0.3)
    held = await service.send_message(session, plan(("send_invoice", {"customer": "f", "amount": 6}, "c1")).text or "")
    [request] = held.pending

    # The calls ran and the step is done, but the worker dies before the turn's end is written.
    with _turn_end_lost(monkeypatch, "completed"), pytest.raises(RuntimeError, match="worker killed"):
        await service.decide(session, request.request_id, approved=True)
    await asyncio.sleep(0.4)
    assert await service.pending(session) == []

    # Nothing waits for a person, yet the client is not stuck: the page offers Continue, and resume puts the step back
    # and the model answers it.
    assert (await service.transcript(session)).resumable
    finished = await service.resume(session)
    assert finished.status == "completed" and finished.reply is not None
    transcript = await service.transcript(session)
    assert [m.tool_call_result.origin.id for m in transcript.messages if m.tool_call_result] == ["c1"]
    assert transcript.status == "completed"
    assert len(ran(ledger)) == 1


class _FailWhileArmed(FaultPlan):
    """
    Answer 503 to the PUTs whose path holds one of `spared`'s fragments while armed, once that fragment's first
    ``spared[fragment]`` PUTs went through: a resume that fails at chosen writes.
    """

    def __init__(self, spared: dict[str, int]) -> None:
        super().__init__()
        self.spared = dict(spared)
        self.armed = True
        self.failed = dict.fromkeys(spared, 0)

    def decide(self, request: ProxiedRequest) -> Fault | None:
        for fragment in self.spared:
            if self.armed and request.method == "PUT" and fragment in request.target:
                if self.spared[fragment] > 0:
                    self.spared[fragment] -= 1
                    break
                self.failed[fragment] += 1
                return Fault.SLOW_DOWN
        return super().decide(request)


@pytest.mark.s3
@pytest.mark.parametrize(
    "spared",
    [
        pytest.param({"/.approvals/resume.": 0}, id="the-step-claim-fails"),
        # The step's claim landed (its lease is live), then the call's claim failed: the claim must not block a retry.
        pytest.param({"/.approvals/claim.": 0}, id="the-call-claim-fails"),
        # ... and the release of the step's claim failed too: its lease stays live in the store.
        pytest.param({"/.approvals/claim.": 0, "/.approvals/resume.": 1}, id="the-release-fails-too"),
    ],
)
async def test_the_same_decision_again_continues_a_step_whose_resume_failed(
    faulty_session: FsspecToolResultStore, fault_proxy: FaultProxy, ledger: Path, spared: dict[str, int]
) -> None:
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook]))  # the default resume lease: far longer than this test
    held = await service.send_message(
        faulty_session, plan(("send_invoice", {"customer": "a", "amount": 5}, "c1")).text or ""
    )
    [request] = held.pending
    edited = {"customer": "a", "amount": 4}
    failing = _FailWhileArmed(spared)
    fault_proxy.plan = failing
    try:
        with pytest.raises(RunFailedError):
            await service.decide(faulty_session, request.request_id, approved=True, arguments=edited)
        assert all(failing.failed.values()) and ran(ledger) == []
        assert (await service.transcript(faulty_session)).resumable
    finally:
        failing.armed = False
    # Once the store answers again, the claim is released for every worker, not only in this one's memory.
    assert (await service.transcript(faulty_session)).resumable
    documents = ApprovalLedger(faulty_session).documents
    for name in [name for name in await documents.list_async() if name.startswith("resume.")]:
        claim = json.loads(await documents.get_async(name))
        assert claim["lease_until"] == claim["claimed_at"]
    # Another verdict, or other arguments, is a conflict: the decision stands, and nothing runs.
    with pytest.raises(ApprovalAlreadyDecidedError):
        await service.decide(faulty_session, request.request_id, approved=False)
    with pytest.raises(ApprovalAlreadyDecidedError):
        await service.decide(faulty_session, request.request_id, approved=True)  # the unedited arguments
    assert ran(ledger) == []
    # The same decision again continues the held step: the approved call runs, once, with the edited arguments.
    again = await service.decide(faulty_session, request.request_id, approved=True, arguments=edited, reason="again")
    assert again.resumed is not None and again.resumed.status == "completed"
    assert [o.outcome for o in again.resumed.approval_outcomes] == ["executed"]
    assert ran(ledger) == [("invoice", "a:4")]
    assert not (await service.transcript(faulty_session)).resumable
    # Once the step is finished, even the same decision is a conflict: nothing runs twice.
    with pytest.raises(ApprovalAlreadyDecidedError):
        await service.decide(faulty_session, request.request_id, approved=True, arguments=edited)
    assert ran(ledger) == [("invoice", "a:4")]


class _ClaimUnreadable(FaultPlan):
    """
    Answer 503 to every GET of a call's claim made after its create was sent, while armed: a create that found
    "exists" cannot tell whose it is. (Reads before the create, which find that no try was claimed yet, pass.)
    """

    def __init__(self) -> None:
        super().__init__()
        self.armed = True
        self.failed = 0
        self.created = False

    def decide(self, request: ProxiedRequest) -> Fault | None:
        if request.method == "PUT" and "/.approvals/claim." in request.target:
            self.created = True
        if self.armed and self.created and request.method == "GET" and "/.approvals/claim." in request.target:
            self.failed += 1
            return Fault.SLOW_DOWN
        return super().decide(request)


@pytest.mark.s3
@pytest.mark.parametrize("note", ["names-the-claim", "names-another-claim"])
async def test_a_call_whose_claim_failed_ambiguously_runs_on_retry_without_asking_whether_it_ran(
    faulty_session: FsspecToolResultStore, held_invoice: HeldInvoice, fault_proxy: FaultProxy, ledger: Path, note: str
) -> None:
    service, request = held_invoice
    # The call's claim lands but its answer is lost; the retried create finds it, and reading it back fails.
    unreadable = _ClaimUnreadable()
    fault_proxy.plan = unreadable
    earlier = len(fault_proxy.faults.snapshot())  # the proxy serves the whole module
    fault_proxy.inject(Fault.RESET_AFTER, method="PUT", path_contains="/.approvals/claim.")
    try:
        with pytest.raises(RunFailedError):
            await service.decide(faulty_session, request.request_id, approved=True)
    finally:
        unreadable.armed = False
    injected = [(f.kind, f.request.method) for f in fault_proxy.faults.snapshot()[earlier:]]
    assert injected.count((Fault.RESET_AFTER, "PUT")) == 1 and injected.count((Fault.SLOW_DOWN, "GET")) > 0
    listing = await ApprovalLedger(faulty_session).listing_async()
    assert [name for name in listing.names if name.startswith("claim.")]  # the claim landed
    assert ran(ledger) == []
    [noted] = [name for name in listing.names if name.startswith("unrun.")]
    if note == "names-another-claim":  # as if that create never landed and another worker's claim took the try
        documents = ApprovalLedger(faulty_session).documents
        other = {**json.loads(await documents.get_async(noted)), "token": uuid.uuid4().hex}
        await documents.put_async(noted, json.dumps(other).encode())
        again = await service.decide(faulty_session, request.request_id, approved=True)
        assert again.resumed is not None and [r.guard for r in again.pending] == ["may-have-run"]
        assert ran(ledger) == []
        return
    # The call never ran: the same decision again runs it, and nobody is asked whether it may have run.
    again = await service.decide(faulty_session, request.request_id, approved=True)
    assert again.resumed is not None and again.resumed.status == "completed" and again.pending == []
    assert [o.outcome for o in again.resumed.approval_outcomes] == ["executed"]
    assert ran(ledger) == [("invoice", "a:5")]


async def test_the_same_denial_again_continues_the_step_without_running_the_call(
    store: FsspecToolResultStore, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = store.for_session("acme", "chat-deny")
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook]))
    held = await service.send_message(session, plan(("send_invoice", {"customer": "b", "amount": 2}, "c1")).text or "")
    [request] = held.pending
    real_claim = ApprovalLedger.claim_step_async

    async def unavailable(self: ApprovalLedger, claim: Any) -> None:
        raise StorageUnavailableError("injected: the store is unavailable")

    monkeypatch.setattr(ApprovalLedger, "claim_step_async", unavailable)
    with pytest.raises(RunFailedError):
        await service.decide(session, request.request_id, approved=False, reason="No.")
    monkeypatch.setattr(ApprovalLedger, "claim_step_async", real_claim)
    with pytest.raises(ApprovalAlreadyDecidedError):
        await service.decide(session, request.request_id, approved=True)
    again = await service.decide(session, request.request_id, approved=False, reason="Still no.")
    assert again.resumed is not None and [o.outcome for o in again.resumed.approval_outcomes] == ["denied"]
    assert again.decision.reason == "No."  # the recorded decision stands
    assert ran(ledger) == []


@pytest.mark.s3
@pytest.mark.parametrize("failing", ["the-hold", "the-decision"])
async def test_a_call_that_runs_has_its_request_and_decision_in_the_audit_though_their_appends_failed(
    faulty_session: FsspecToolResultStore, fault_proxy: FaultProxy, ledger: Path, failing: str
) -> None:
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook]))
    audit_down = _FailWhileArmed({"/.audit/": 0})
    audit_down.armed = failing == "the-hold"
    fault_proxy.plan = audit_down
    text = plan(("send_invoice", {"customer": "a", "amount": 5}, "c1")).text or ""
    if failing == "the-hold":
        with pytest.raises(RunFailedError):  # the step is held; its audit append gave up
            await service.send_message(faulty_session, text)
    else:
        await service.send_message(faulty_session, text)
    [request] = await service.pending(faulty_session)
    audit_down.armed = failing == "the-decision"
    if failing == "the-decision":
        with pytest.raises(StorageUnavailableError):  # the decision is recorded; its audit append gave up
            await service.decide(faulty_session, request.request_id, approved=True, actor="alice")
    else:
        await service.decide(faulty_session, request.request_id, approved=True, actor="alice")
    assert audit_down.failed["/.audit/"] > 0
    audit_down.armed = False
    if failing == "the-decision":
        # Nothing waits for a decision, and the page offers Continue.
        assert await service.pending(faulty_session) == []
        assert (await service.transcript(faulty_session)).resumable
        await service.resume(faulty_session)
    assert ran(ledger) == [("invoice", "a:5")]
    events = [(e.event, e.actor) for e in await service.audit(faulty_session) if e.tool_call_id == "c1"]
    assert events.count(("approval.requested", None)) == 1
    assert events.count(("approval.decided", "alice")) == 1
    assert [name for name, _ in events if name == "approval.executed"] == ["approval.executed"]


class _ExecutedAuditDown(FaultPlan):
    """Answer 500 to every PUT of an audit event of one kind (``.executed.json``) while armed; note audit requests."""

    def __init__(self, kind: str = "executed") -> None:
        super().__init__()
        self.suffix = f".{kind}.json"
        self.armed = True
        self.failed = 0
        self.audit_requests: list[tuple[str, str]] = []

    def decide(self, request: ProxiedRequest) -> Fault | None:
        if "/.audit/" in request.target:
            self.audit_requests.append((request.method, request.target))
        if self.armed and request.method == "PUT" and request.target.split("?")[0].endswith(self.suffix):
            self.failed += 1
            return Fault.INTERNAL_ERROR
        return super().decide(request)

    def puts(self) -> set[str]:
        """The audit documents written since `audit_requests` was last emptied (a PUT sent again counts once)."""
        return {target.split("?")[0] for method, target in self.audit_requests if method == "PUT"}


@pytest.mark.s3
@pytest.mark.parametrize("calls", [1, 3])
async def test_an_approved_call_whose_executed_audit_append_failed_is_reported_as_run_and_audited_once(
    faulty_session: FsspecToolResultStore, fault_proxy: FaultProxy, ledger: Path, calls: int
) -> None:
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook]))
    asked = [("send_invoice", {"customer": f"c{n}", "amount": n + 1}, f"c{n}") for n in range(calls)]
    held = await service.send_message(faulty_session, plan(*asked).text or "")
    assert len(held.pending) == calls
    audit_down = _ExecutedAuditDown()
    fault_proxy.plan = audit_down
    for request in held.pending:
        outcome = await service.decide(faulty_session, request.request_id, approved=True, actor="alice")
    # The calls ran once each, and the answer says so: no "run failed" because the audit append gave up.
    assert audit_down.failed >= calls
    assert outcome.resumed is not None and not outcome.resumed_elsewhere
    assert [o.outcome for o in outcome.resumed.approval_outcomes] == ["executed"] * calls
    assert outcome.resumed.status == "completed"
    assert sorted(ran(ledger)) == sorted(("invoice", f"c{n}:{n + 1}") for n in range(calls))

    def executed(events: list[Any]) -> list[str | None]:
        return sorted(e.tool_call_id for e in events if e.event == "approval.executed")

    assert executed(await service.audit(faulty_session)) == []
    audit_down.armed = False

    # The next request that reads the (finished) step repairs the audit from the calls' records: one write per call.
    del audit_down.audit_requests[:]
    assert await service.pending(faulty_session) == []
    # (Documents, not requests: a PUT whose answer came later than the read timeout on a loaded machine is sent again.)
    puts = {target.split("?")[0] for method, target in audit_down.audit_requests if method == "PUT"}
    assert len(puts) == calls and all(target.endswith(".executed.json") for target in puts)
    assert executed(await service.audit(faulty_session)) == [f"c{n}" for n in range(calls)]

    # A further request adds none, and (checked once per worker) sends nothing to the audit.
    del audit_down.audit_requests[:]
    assert await service.pending(faulty_session) == []
    assert (await service.transcript(faulty_session)).status == "completed"
    assert audit_down.audit_requests == []
    events = await service.audit(faulty_session)
    assert executed(events) == [f"c{n}" for n in range(calls)]
    assert [e.actor for e in events if e.event == "approval.decided"] == ["alice"] * calls


class _OneAuditWriteFails(FaultPlan):
    """Answer 500 to every PUT of an ``.requested.json`` audit event, and the other audit PUTs late."""

    def decide(self, request: ProxiedRequest) -> Fault | None:
        if request.method == "PUT" and "/.audit/" in request.target:
            return Fault.INTERNAL_ERROR if request.target.split("?")[0].endswith(".requested.json") else Fault.SLOW
        return super().decide(request)


def _audited_request() -> ApprovalRequest:
    return ApprovalRequest(
        request_id=f"{uuid.uuid4().hex}-1",
        tenant="acme",
        session="chat-1",
        step_id="step-1",
        guard="invoices",
        position=0,
        tool_name="send_invoice",
        tool_call_id="c1",
        arguments={"customer": "a"},
        arguments_digest=arguments_digest({"customer": "a"}),
        parameters={},
        rule="test",
        created=datetime.now(UTC),
        expires=datetime.now(UTC) + timedelta(hours=1),
    )


def _notes() -> list[AuditEvent]:
    return [new_event(event="approval.note", actor="test", tenant="acme", session="chat-1") for _ in range(2)]


@pytest.mark.s3
async def test_an_audit_append_that_fails_leaves_no_write_running_behind_it(
    faulty_session: FsspecToolResultStore, fault_proxy: FaultProxy
) -> None:
    # A write still running when the append has failed lands later, beside whatever the caller does next (the repair
    # of a finished step's audit counted one PUT too many in CI): every write ends before the error is raised.
    fault_proxy.plan = _OneAuditWriteFails()
    try:
        with pytest.raises(StorageError):
            await append_audit_async(faulty_session, requested_event(_audited_request()), *_notes())
        running = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    finally:
        fault_proxy.plan = FaultPlan()
    assert running == []
    assert sorted(event.event for event in await read_audit_async(faulty_session)) == ["approval.note"] * 2


@pytest.mark.s3
def test_a_sync_audit_append_that_fails_still_writes_its_other_events(
    faulty_session: FsspecToolResultStore, fault_proxy: FaultProxy
) -> None:
    # The sync twin, written by hand, stopped at the first failed write and never wrote the events after it; the
    # async one writes them all, then raises. Derived from the async one, the sync one does the same.
    fault_proxy.plan = _OneAuditWriteFails()
    try:
        with pytest.raises(StorageError):
            append_audit(faulty_session, requested_event(_audited_request()), *_notes())
    finally:
        fault_proxy.plan = FaultPlan()
    assert sorted(event.event for event in read_audit(faulty_session)) == ["approval.note"] * 2


@pytest.mark.s3
def test_the_sync_pending_approvals_repairs_a_finished_steps_audit_too(
    faulty_session: FsspecToolResultStore, fault_proxy: FaultProxy, ledger: Path
) -> None:
    invoice_hook, _ = approvals()
    agent = agent_with([invoice_hook])
    reply = agent.run(
        [plan(("send_invoice", {"customer": "a", "amount": 5}, "c1"))], hook_context=durable(faulty_session)
    )
    [request] = pending_approvals(faulty_session)
    decide(faulty_session, request.request_id, Decision.approve(by="alice"))
    audit_down = _ExecutedAuditDown()
    fault_proxy.plan = audit_down
    try:
        resumed = resume(agent, reply["messages"], faulty_session)
    finally:
        fault_proxy.plan = FaultPlan()
    assert audit_down.failed >= 1 and [o.outcome for o in resumed[OUTCOMES_KEY]] == ["executed"]
    assert ran(ledger) == [("invoice", "a:5")]
    assert [e.event for e in read_audit(faulty_session)].count("approval.executed") == 0

    assert pending_approvals(faulty_session) == []
    executed = [e for e in read_audit(faulty_session) if e.event == "approval.executed"]
    assert [(e.tool_call_id, e.request_id) for e in executed] == [("c1", request.request_id)]


def _events(events: list[Any], kind: str) -> list[tuple[str | None, str | None]]:
    return [(event.tool_call_id, event.actor) for event in events if event.event == kind]


@pytest.mark.s3
@pytest.mark.parametrize("written_before_names_were_fixed", [False, True])
async def test_a_denial_whose_audit_append_failed_is_audited_once_at_the_next_request(
    faulty_session: FsspecToolResultStore,
    held_invoice: HeldInvoice,
    fault_proxy: FaultProxy,
    written_before_names_were_fixed: bool,
) -> None:
    service, request = held_invoice
    audit_down = _ExecutedAuditDown("denied")
    fault_proxy.plan = audit_down
    try:
        outcome = await service.decide(faulty_session, request.request_id, approved=False, reason="No.", actor="alice")
    finally:
        audit_down.armed = False
    assert audit_down.failed >= 1
    assert outcome.resumed is not None and [o.outcome for o in outcome.resumed.approval_outcomes] == ["denied"]
    assert _events(await service.audit(faulty_session), "approval.denied") == []
    if written_before_names_were_fixed:
        # A step finished by the code before: its denial is in the audit under a random name, which a repair must see.
        worker = next(e.actor for e in await service.audit(faulty_session) if e.event == "approval.resumed")
        old = new_event(
            event="approval.denied",
            actor=worker,
            tenant="acme",
            session="chat-1",
            step_id=request.step_id,
            request_id=request.request_id,
            tool_call_id="c1",
            tool_name="send_invoice",
            detail={"reason": "written by the code before"},
        )
        await append_audit_async(faulty_session, old)

    del audit_down.audit_requests[:]
    assert await service.pending(faulty_session) == []
    assert len(audit_down.puts()) == (0 if written_before_names_were_fixed else 1)
    [(call, actor)] = _events(await service.audit(faulty_session), "approval.denied")
    assert call == "c1" and actor is not None and actor != "alice"  # the worker that finished the step
    # Checked once per worker: the next request sends nothing to the audit.
    del audit_down.audit_requests[:]
    assert await service.pending(faulty_session) == []
    assert audit_down.audit_requests == []
    assert len(_events(await service.audit(faulty_session), "approval.denied")) == 1


@pytest.mark.s3
async def test_a_may_have_run_hold_whose_audit_append_failed_is_audited_once_at_the_next_request(
    faulty_session: FsspecToolResultStore, fault_proxy: FaultProxy, ledger: Path
) -> None:
    STOP_ONCE.clear()
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook], invoice=flaky_invoice), turn_lease=0.3, resume_lease=0.3)
    held = await service.send_message(
        faulty_session, plan(("send_invoice", {"customer": "b", "amount": 7}, "c1")).text or ""
    )
    [request] = held.pending
    with pytest.raises(Stop):  # the worker dies mid-call
        await service.decide(faulty_session, request.request_id, approved=True)
    await asyncio.sleep(0.4)
    audit_down = _ExecutedAuditDown("may_have_run")
    fault_proxy.plan = audit_down
    try:
        again = await service.resume(faulty_session)
    finally:
        audit_down.armed = False
    assert audit_down.failed >= 1 and [r.guard for r in again.pending] == ["may-have-run"]
    assert _events(await service.audit(faulty_session), "approval.may_have_run") == []

    del audit_down.audit_requests[:]
    [uncertain] = await service.pending(faulty_session)
    assert len(audit_down.puts()) == 1
    [event] = [e for e in await service.audit(faulty_session) if e.event == "approval.may_have_run"]
    assert (event.tool_call_id, event.request_id, event.detail["held_as"]) == (
        "c1",
        uncertain.request_id,
        uncertain.request_id,
    )
    del audit_down.audit_requests[:]
    assert await service.pending(faulty_session) == [uncertain]
    assert audit_down.audit_requests == []
    assert len(ran(ledger)) == 1


@pytest.mark.s3
async def test_a_hold_whose_requested_audit_append_failed_is_audited_at_the_next_request(
    faulty_session: FsspecToolResultStore, fault_proxy: FaultProxy
) -> None:
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook]))
    audit_down = _ExecutedAuditDown("requested")
    fault_proxy.plan = audit_down
    try:
        with contextlib.suppress(RunFailedError):  # the hold is stored; its audit append gave up
            await service.send_message(
                faulty_session, plan(("send_invoice", {"customer": "a", "amount": 5}, "c1")).text or ""
            )
    finally:
        audit_down.armed = False
    assert audit_down.failed >= 1
    assert _events(await service.audit(faulty_session), "approval.requested") == []

    del audit_down.audit_requests[:]
    [request] = await service.pending(faulty_session)
    assert len(audit_down.puts()) == 1
    [event] = [e for e in await service.audit(faulty_session) if e.event == "approval.requested"]
    assert (event.request_id, event.tool_call_id) == (request.request_id, "c1")
    del audit_down.audit_requests[:]
    assert await service.pending(faulty_session) == [request]
    assert audit_down.audit_requests == []


@pytest.mark.s3
async def test_a_decision_whose_audit_append_failed_is_audited_at_the_next_request(
    faulty_session: FsspecToolResultStore, fault_proxy: FaultProxy
) -> None:
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook]))
    asked = [("send_invoice", {"customer": f"c{n}", "amount": n + 1}, f"c{n}") for n in range(2)]
    held = await service.send_message(faulty_session, plan(*asked).text or "")
    first, second = held.pending
    audit_down = _ExecutedAuditDown("decided")
    fault_proxy.plan = audit_down
    try:
        with pytest.raises(StorageError):  # the decision is stored; its audit append gave up
            await service.decide(faulty_session, first.request_id, approved=True, actor="alice")
    finally:
        audit_down.armed = False
    assert audit_down.failed >= 1
    assert _events(await service.audit(faulty_session), "approval.decided") == []

    del audit_down.audit_requests[:]
    assert await service.pending(faulty_session) == [second]
    assert len(audit_down.puts()) == 1
    assert _events(await service.audit(faulty_session), "approval.decided") == [("c0", "alice")]
    del audit_down.audit_requests[:]
    assert await service.pending(faulty_session) == [second]
    assert audit_down.audit_requests == []
