"""
Durable approvals on what real object stores answer: AWS's 409 conflict on every key's first conditional create, and
a store that ignores If-None-Match; on moto and, in the real-S3 lane, on Ceph RGW, with both engines.
"""

import uuid
from pathlib import Path
from typing import Any

import pytest
from approval_scenario import ledger_lines, make_agent, plan
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy, NeverAskPolicy

from haystack_integrations.offload import (
    APPROVAL_REQUIRED,
    Decision,
    DurableApprovals,
    ExclusiveCreatesUnsupportedError,
    FsspecToolResultStore,
    decide,
    offload_context,
    pending_approvals,
    read_audit,
    resume,
)
from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy

ENGINES = pytest.mark.parametrize("engine", ["fsspec", "obstore"])
INVOICE = ("send_invoice", {"customer": "acme", "amount": 120}, "call_inv")
DENIED = ("send_invoice", {"customer": "mallory", "amount": 999}, "call_bad")


def _session(server: Any, engine: str, endpoint: str) -> FsspecToolResultStore:
    options = {**server.storage_options(), "endpoint_url": endpoint}
    root = FsspecToolResultStore(f"{server.bucket_url}/{uuid.uuid4().hex}", storage_options=options, engine=engine)
    return root.for_session("acme", "chat-1")


@ENGINES
def test_with_409_on_every_keys_first_create_the_durable_flow_runs_each_call_exactly_once(
    s3_endpoint: Any, engine: str, ledger: Path
) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy(), "*": NeverAskPolicy()})
    with FaultProxy(s3_endpoint.endpoint_url, plan=FaultPlan(conflict_first_conditional_put=True)) as proxy:
        session = _session(s3_endpoint, engine, proxy.endpoint_url)
        reply = agent.run(
            [plan(INVOICE, DENIED)], hook_context=offload_context(session, approval_channel=DurableApprovals())
        )
        assert reply["exit_reason"] == APPROVAL_REQUIRED
        requests = {request.tool_call_id: request for request in pending_approvals(session)}
        decide(session, requests["call_inv"].request_id, Decision.approve(by="alice"))
        decide(session, requests["call_bad"].request_id, Decision.deny(by="alice", reason="no"))
        final = resume(agent, reply["messages"], session)
        conflicts = proxy.faults.counts()[Fault.CONFLICT]
        events = [event.event for event in read_audit(session)]
    assert [line.split(":")[:2] for line in ledger_lines(ledger)] == [["acme", "120"]]  # approved once, denied never
    assert sorted(outcome.outcome for outcome in final["approval_outcomes"]) == ["denied", "executed"]
    assert events.count("approval.executed") == 1
    # Every coordinated create met the conflict first: the probe, the held step, both decisions, the claims.
    assert conflicts >= 5
    assert session.retry_stats.as_dict()["gave_up"] == 0


@pytest.mark.s3
@ENGINES
def test_on_a_store_that_ignores_if_none_match_nothing_is_held_and_nothing_runs(
    s3_server: Any, engine: str, ledger: Path
) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy(), "*": NeverAskPolicy()})
    with FaultProxy(s3_server.endpoint_url, ignore_conditional_writes=True) as proxy:
        session = _session(s3_server, engine, proxy.endpoint_url)
        with pytest.raises(ExclusiveCreatesUnsupportedError, match="ignores If-None-Match"):
            agent.run([plan(INVOICE)], hook_context=offload_context(session, approval_channel=DurableApprovals()))
        assert pending_approvals(session) == []
        assert proxy.stripped.snapshot()  # the probe's creates really went without their condition
    assert ledger_lines(ledger) == []
