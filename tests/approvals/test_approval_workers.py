"""
Across real worker processes: decisions made in one process, resumes racing in three, on shared storage.

The workers are separate Python processes (``approval_worker.py``) that talk to the same store: moto's S3 server over
HTTP (and Ceph RGW in the real-S3 lane), or a local directory. ``send_invoice`` appends to a ledger file, so its
executions are counted across processes.
"""

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from approval_scenario import LEDGER_ENV, ledger_lines, make_agent, plan, structured_error
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy

from haystack_integrations.offload import (
    APPROVAL_REQUIRED,
    Decision,
    DurableApprovals,
    FsspecToolResultStore,
    decide,
    offload_context,
    pending_approvals,
    read_audit,
    resume,
)
from support.isolation import isolation_kwargs

HERE = Path(__file__).parent
SRC = HERE.parent.parent / "src"
ROUNDS = 4


class Worker:
    """One worker process, spoken to one JSON line at a time."""

    def __init__(self, ledger: Path) -> None:
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(SRC), str(HERE), str(HERE.parent)]),
            LEDGER_ENV: str(ledger),
            "HAYSTACK_TELEMETRY_ENABLED": "False",
        }
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "approval_worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=environment,
        )

    def send(self, **command: Any) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"worker exited with {self.process.wait(timeout=30)}"
        return json.loads(line)

    def close(self) -> None:
        if self.process.poll() is None:
            self.send(op="quit")
        self.process.wait(timeout=60)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def workers(ledger: Path) -> Iterator[list[Worker]]:
    started = [Worker(ledger) for _ in range(3)]
    yield started
    for worker in started:
        worker.close()


def _held(store: FsspecToolResultStore, customer: str) -> list[Any]:
    """Run until the durable channel stops; return the conversation the run returned."""
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    reply = agent.run(
        [plan(("send_invoice", {"customer": customer, "amount": 10}, "call_1"))],
        hook_context=offload_context(store, approval_channel=DurableApprovals()),
    )
    assert reply["exit_reason"] == APPROVAL_REQUIRED
    return [message.to_dict() for message in reply["messages"]]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_three_workers_racing_to_resume_run_the_call_exactly_once(
    s3_endpoint: Any, workers: list[Worker], ledger: Path, engine: str
) -> None:
    # On moto and, in the real-S3 lane, on Ceph RGW: the claim's exclusive create is the real server's.
    _race(s3_endpoint, workers, ledger, engine, role_arn=None)


@pytest.mark.slow
@pytest.mark.rgw
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_three_workers_racing_with_isolation_per_tenant_run_the_call_exactly_once(
    real_s3_server: Any, real_s3_tenant_role: str, workers: list[Worker], ledger: Path, engine: str
) -> None:
    # Every process signs as the tenant (STS) and sends its SSE-C key: claims and decisions included.
    _race(real_s3_server, workers, ledger, engine, role_arn=real_s3_tenant_role)


def _race(server: Any, workers: list[Worker], ledger: Path, engine: str, *, role_arn: str | None) -> None:
    url, options = f"{server.bucket_url}/{uuid.uuid4().hex}", server.storage_options()
    isolation = isolation_kwargs(role_arn) if role_arn else {}
    root = FsspecToolResultStore(url, storage_options=options, engine=engine, **isolation)
    for round_ in range(ROUNDS):
        session = root.for_session("acme", f"chat-{round_}")
        messages = _held(session, customer=f"customer-{round_}")
        [request] = pending_approvals(session)
        decide(session, request.request_id, Decision.approve(by="alice"))

        for index, worker in enumerate(workers):
            worker.send(
                op="prepare",
                url=url,
                storage_options=options,
                engine=engine,
                role_arn=role_arn,
                tenant="acme",
                session=f"chat-{round_}",
                messages=messages,
                worker=f"worker-{index}",
                # One worker resumes with the sync API, the other with the async one.
                **{"async": (index + round_) % 2 == 0},
            )
        assert [worker.receive() for worker in workers] == [{"status": "ready"}] * len(workers)
        for worker in workers:
            worker.send(op="go")
        answers = [worker.receive() for worker in workers]

        assert sorted(answer["status"] for answer in answers) == ["claimed", "claimed", "resumed"]
        [winner] = [answer for answer in answers if answer["status"] == "resumed"]
        assert winner["final"] == f"final: invoice sent to customer-{round_} for 10"
        executed = [line for line in ledger_lines(ledger) if line.startswith(f"customer-{round_}:")]
        assert len(executed) == 1
        events = [event.event for event in read_audit(session)]
        assert events.count("approval.executed") == 1
        assert events.count("approval.resumed") == 1
    assert len(ledger_lines(ledger)) == ROUNDS
    # Both processes won some rounds or one won them all; either way, the executions came from those processes only.
    assert {line.rsplit(":", 1)[1] for line in ledger_lines(ledger)} <= {str(w.process.pid) for w in workers}


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def shared_root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A root that another process can reach: a directory, or a prefix on moto's S3 server."""
    if request.param == "local":
        return str(tmp_path / "results"), {}
    server = request.getfixturevalue("s3_server")
    return f"{server.bucket_url}/{uuid.uuid4().hex}", server.storage_options()


@pytest.mark.slow
def test_full_flow_request_stop_decide_elsewhere_resume_answer(
    shared_root: tuple[str, dict[str, Any]], ledger: Path
) -> None:
    url, options = shared_root
    session = FsspecToolResultStore(url, storage_options=options).for_session("acme", "chat-42")
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})

    # 1. The user's message: the model wants two invoices; the run stops with two requests.
    reply = agent.run(
        [
            plan(
                ("send_invoice", {"customer": "acme", "amount": 40}, "call_a"),
                ("send_invoice", {"customer": "globex", "amount": 900}, "call_b"),
            )
        ],
        hook_context=offload_context(session, approval_channel=DurableApprovals(actor="user-7")),
    )
    assert reply["exit_reason"] == APPROVAL_REQUIRED
    assert [request.tool_call_id for request in pending_approvals(session)] == ["call_a", "call_b"]
    assert ledger_lines(ledger) == []

    # 2. A person decides, through another process.
    decider = Worker(ledger)
    try:
        decider.send(
            op="decide",
            url=url,
            storage_options=options,
            tenant="acme",
            session="chat-42",
            decisions={
                "call_a": Decision.approve({"customer": "acme", "amount": 45}, by="alice").model_dump(mode="json"),
                "call_b": Decision.deny("Too large for this account.", by="alice").model_dump(mode="json"),
            },
        )
        assert decider.receive() == {"status": "decided", "calls": ["call_a", "call_b"]}
    finally:
        decider.close()
    assert pending_approvals(session) == []

    # 3. This process (any worker) resumes: the approved, edited call runs once; the denial reaches the model.
    final = resume(agent, reply["messages"], session)

    assert [line.rsplit(":", 1)[0] for line in ledger_lines(ledger)] == ["acme:45"]
    results = [m.tool_call_result for m in final["messages"] if m.tool_call_result is not None]
    # Haystack's ConfirmationHook shape: the denied call is answered before the message with the calls that run.
    assert [(r.origin.id, r.error) for r in results] == [("call_b", True), ("call_a", False)]
    denial = structured_error(str(results[0].result))
    assert denial["error"] == "approval-denied" and "Too large for this account." in denial["message"]
    assert final["exit_reason"] == "text"
    assert final["last_message"].text == "final: invoice sent to acme for 45"
    assert [(e.event, e.actor) for e in read_audit(session)][:3] == [
        ("approval.requested", "user-7"),
        ("approval.requested", "user-7"),
        ("approval.decided", "alice"),
    ]
