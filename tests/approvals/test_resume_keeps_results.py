"""
A resume that fails after some calls ran (a later call's claim, the step's end) loses none of their results.

The approvals fault run on Azurite (obstore) and fake-gcs-server (gcsfs) found calls that ran once with
``approval.not_run`` in the audit and no result in the transcript: the resume of the step that continued them failed
after the first call ran, and the client gave up at its deadline. These tests make that state with scripted faults on
moto, then show what a later resume makes of it.
"""

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from approval_scenario import plan
from test_approval_composition import agent_with, approvals, block_wipe, ran

from haystack_integrations.offload import FsspecToolResultStore, RetryPolicy, read_audit_async
from haystack_integrations.offload.approvals.ledger import call_key
from haystack_integrations.offload.sessions.errors import RunFailedError
from haystack_integrations.offload.sessions.service import ChatService
from haystack_integrations.offload.testing.faults import Fault, FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server

FAST_RETRY = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, attempt_timeout=2.0)
GIVE_UP = [Fault.SLOW_DOWN] * FAST_RETRY.attempts
"""Enough 503s in a row for the store to give up on one operation."""


@pytest.fixture(scope="module")
def proxy(s3_server: LocalS3Server) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint_url, hold_seconds=5.0) as faults:
        yield faults


@pytest.fixture(params=["fsspec", "obstore"])
def session(s3_server: LocalS3Server, proxy: FaultProxy, request: pytest.FixtureRequest) -> FsspecToolResultStore:
    options = {
        **s3_server.storage_options(),
        "endpoint_url": proxy.endpoint_url,
        "config_kwargs": {"read_timeout": 0.5, "connect_timeout": 2},
    }
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=options, retry=FAST_RETRY, engine=request.param
    )
    return root.for_session("acme", "chat-1")


def _invoice(number: int) -> tuple[str, dict[str, Any], str]:
    return ("send_invoice", {"customer": f"c{number}", "amount": number}, f"inv-{number}")


def _path_of(first_step_id: str, call_id: str, position: int, kind: str) -> str:
    """The part of a call's claim or outcome document's path that names it (kind: ``claim`` or ``outcome``)."""
    return f"/.approvals/{kind}.{call_key(first_step_id, call_id, position)}."


def _puts(proxy: FaultProxy, since: int, part: str) -> int:
    return sum(1 for r in proxy.requests.snapshot()[since:] if r.method == "PUT" and part in r.target)


def _executed(events: list[Any], call_id: str) -> int:
    return sum(1 for e in events if e.event == "approval.executed" and e.tool_call_id == call_id)


@pytest.mark.s3
async def test_a_continued_step_whose_resume_fails_after_a_call_ran_is_finished_by_the_next_resume(
    session: FsspecToolResultStore, proxy: FaultProxy, ledger: Path
) -> None:
    # The benchmark's chain: the invoices' guard, a guardrail, the delete guard (which holds the step again).
    invoice_hook, delete_hook = approvals()
    service = ChatService(agent_with([invoice_hook, block_wipe, delete_hook]))
    held = await service.send_message(
        session,
        plan(_invoice(1), _invoice(2), ("delete_file", {"path": "a"}, "del-1"), ("wipe", {"path": "/"}, "w")).text
        or "",
    )
    first_step = held.pending[0].step_id
    for request in held.pending:
        outcome = await service.decide(session, request.request_id, approved=True)
    assert outcome.resumed is not None
    [delete] = outcome.resumed.pending  # held again by the second guard: the invoices did not run in step 1
    not_run = [(e.tool_call_id, e.step_id) for e in await read_audit_async(session) if e.event == "approval.not_run"]
    assert ("inv-1", first_step) in not_run and ("inv-2", first_step) in not_run

    # Step 2's resume runs inv-1, then gives up on inv-2's claim: the state the fault run's checker found.
    since = len(proxy.requests.snapshot())
    proxy.inject(*GIVE_UP, method="PUT", path_contains=_path_of(first_step, "inv-2", 1, "claim"))
    with pytest.raises(RunFailedError):
        await service.decide(session, delete.request_id, approved=True)
    assert _puts(proxy, since, "/.approvals/claim.") == 1 + FAST_RETRY.attempts
    assert ran(ledger) == [("invoice", "c1:1")]
    transcript = await service.transcript(session)
    assert "inv-1" not in {m.tool_call_result.origin.id for m in transcript.messages if m.tool_call_result}
    assert _executed(await read_audit_async(session), "inv-1") == 0
    assert transcript.resumable  # nothing is lost: the step waits for a resume

    # The next resume reuses inv-1's recorded result and runs the rest once.
    finished = await service.resume(session)
    assert finished.status == "completed"
    assert {o.tool_call_id: o.outcome for o in finished.approval_outcomes if o.tool_call_id != "w"} == {
        "inv-1": "recorded",
        "inv-2": "executed",
        "del-1": "executed",
    }
    assert sorted(ran(ledger)) == [("delete", "a"), ("invoice", "c1:1"), ("invoice", "c2:2")]
    answers = {m.tool_call_result.origin.id for m in (await service.transcript(session)).messages if m.tool_call_result}
    assert {"inv-1", "inv-2", "del-1", "w"} <= answers
    events = await read_audit_async(session)
    assert [_executed(events, call) for call in ("inv-1", "inv-2", "del-1")] == [1, 1, 1]


@pytest.mark.s3
@pytest.mark.parametrize("ran_first", [1, 2])
async def test_results_whose_records_failed_are_recorded_before_a_failed_resume_gives_up(
    session: FsspecToolResultStore, proxy: FaultProxy, ledger: Path, ran_first: int
) -> None:
    invoice_hook, _ = approvals()
    service = ChatService(agent_with([invoice_hook]))
    calls = [_invoice(number) for number in range(1, ran_first + 2)]
    held = await service.send_message(session, plan(*calls).text or "")
    first_step = held.pending[0].step_id
    for request in held.pending[:-1]:
        await service.decide(session, request.request_id, approved=True)
    # The first `ran_first` calls run but the store gives up on recording each result; then the next call's claim
    # fails, so the resume gives up with those results in hand.
    since = len(proxy.requests.snapshot())
    for position in range(ran_first):
        proxy.inject(
            *GIVE_UP, method="PUT", path_contains=_path_of(first_step, f"inv-{position + 1}", position, "outcome")
        )
    proxy.inject(*GIVE_UP, method="PUT", path_contains=_path_of(first_step, f"inv-{ran_first + 1}", ran_first, "claim"))
    with pytest.raises(RunFailedError):
        await service.decide(session, held.pending[-1].request_id, approved=True)
    assert ran(ledger) == [("invoice", f"c{n}:{n}") for n in range(1, ran_first + 1)]
    # Each result is written once more before the resume gives up, and lands: one PUT per result that ran.
    assert _puts(proxy, since, "/.approvals/outcome.") == ran_first * (FAST_RETRY.attempts + 1)

    # So the next resume reuses them: nobody is asked whether those calls may have run, and none runs again.
    finished = await service.resume(session)
    assert finished.status == "completed" and finished.pending == []
    assert [o.outcome for o in finished.approval_outcomes] == ["recorded"] * ran_first + ["executed"]
    assert ran(ledger) == [("invoice", f"c{n}:{n}") for n in range(1, ran_first + 2)]
    events = await read_audit_async(session)
    assert [_executed(events, f"inv-{n}") for n in range(1, ran_first + 2)] == [1] * (ran_first + 1)
