"""The S3 traffic of each approval operation, from moto's request log: few requests, conditional where it counts."""

import uuid
from pathlib import Path
from typing import Any

import pytest
from approval_scenario import make_agent, plan
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy

from haystack_integrations.offload import (
    Decision,
    DurableApprovals,
    FsspecToolResultStore,
    decide,
    offload_context,
    pending_approvals,
    resume,
)

pytestmark = pytest.mark.s3


def traffic(requests: Any) -> list[tuple[str, str, str | None]]:
    """(method, what, If-None-Match) per request, with the object reduced to its kind."""
    seen = []
    for request in requests.snapshot():
        if "list-type=2" in request.query:
            kind = "LIST"
        else:
            name = request.path.rsplit("/", 2)
            kind = f"{name[-2]}/{name[-1].split('.')[0]}" if name[-2] == ".approvals" else name[-2]
        seen.append((request.method, kind, request.header("if-none-match")))
    requests.clear()
    return seen


@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_each_operation_costs_a_handful_of_requests(
    s3_server: Any, s3_requests: Any, ledger: Path, engine: str
) -> None:
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options(), engine=engine
    )
    root.warm_up()
    # The once-per-process probe of exclusive creates is not an operation's cost (whichever test ran it first).
    assert root.check_exclusive_creates().enforced
    session = root.for_session("acme", "chat-1")
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    s3_requests.clear()

    reply = agent.run(
        [plan(("send_invoice", {"customer": "a", "amount": 1}, "c1"))],
        hook_context=offload_context(session, approval_channel=DurableApprovals()),
    )
    # The head names the newest step; a session without one (here: new) is listed once to find it, on both engines
    # (s3fs's own find added a HEAD and a second LIST on a session with no documents yet). The step's conditional create
    # claims the number, and the head moves on to it.
    assert traffic(s3_requests) == [
        ("GET", ".approvals/head", None),
        ("GET", "LIST", None),
        ("PUT", ".approvals/step", "*"),
        ("PUT", ".approvals/head", None),
        ("PUT", ".audit", None),
    ]

    # From then on nothing lists: the head, the next number (missing), the step, what is recorded about it by name.
    # The sync call is the async one waited for: its reads run concurrently where they can, so their order varies.
    [request] = pending_approvals(session)
    assert sorted(traffic(s3_requests)) == sorted(
        [
            ("GET", ".approvals/head", None),
            ("GET", ".approvals/step", None),  # step 2: none, so step 1 is the newest
            ("GET", ".approvals/step", None),
            ("GET", ".approvals/done", None),
            ("GET", ".approvals/resume", None),
            ("GET", ".approvals/decision", None),
        ]
    )

    decide(session, request.request_id, Decision.approve())
    assert traffic(s3_requests) == [
        ("GET", ".approvals/step", None),
        ("PUT", ".approvals/decision", "*"),
        ("PUT", ".audit", None),
    ]

    resume(agent, reply["messages"], session)
    sent = traffic(s3_requests)
    # Reads run concurrently where they can, so their order varies; the writes keep theirs.
    assert sorted(request for request in sent if request[0] == "GET") == sorted(
        [
            ("GET", ".approvals/head", None),
            ("GET", ".approvals/step", None),  # the next number: missing
            ("GET", ".approvals/step", None),
            ("GET", ".approvals/done", None),
            ("GET", ".approvals/resume", None),  # no claim on the step yet
            ("GET", ".approvals/decision", None),
            ("GET", ".approvals/claim", None),  # no try of the call yet
            ("GET", ".approvals/outcome", None),  # nor a recorded result
            ("GET", ".audit", None),  # the audit holds the step's request ...
            ("GET", ".audit", None),  # ... and its decision before any call runs
        ]
    )
    assert [request for request in sent if request[0] != "GET"] == [
        ("PUT", ".approvals/resume", "*"),
        ("PUT", ".approvals/claim", "*"),
        ("PUT", ".approvals/outcome", None),  # the call's result, recorded before anything else
        ("PUT", ".approvals/done", None),  # what the step added to the conversation
        ("PUT", ".audit", None),  # approval.resumed
        ("PUT", ".audit", None),  # approval.executed
    ]
    assert not [request for request in sent if request[1] == "LIST"]
