"""
A draining server keeps its socket: a new request during the drain gets 503 ``draining`` with ``Retry-After`` (not a
refused connection), which tells a client or a load balancer "send it elsewhere" rather than "down"; the turns running
when SIGTERM came finish, and the process exits 0 once they have.
"""

import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_processes import serve
from server_tenants import ACME_TOKEN, TOKENS, bearer

from haystack_integrations.offload.testing.local_s3 import LocalS3Server

RESEARCH = "Research heat pumps, dump the invoices table and chart revenue"
PATIENCE = 60.0  # seconds any wait in this test may take before it fails (never an assertion on speed)


def _send(base_url: str, session: str, answers: dict[str, httpx.Response]) -> None:
    with httpx.Client(base_url=base_url, headers=bearer(ACME_TOKEN), timeout=PATIENCE) as client:
        answers[session] = client.post(f"/api/sessions/{session}/messages", json={"text": RESEARCH})


def _until_running(s3_server: LocalS3Server, sessions: list[str]) -> None:
    """Wait until every session's turn has written to the store: the turn is claimed, and runs its tools."""
    for _ in range(int(PATIENCE / 0.05)):
        if all(s3_server.requests.count(method="PUT", path_contains=f"/{s}/") for s in sessions):
            return
        threading.Event().wait(0.05)
    raise AssertionError(f"the turns of {sessions} did not start")


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.parametrize("running", [1, 4])
def test_a_request_during_the_drain_gets_503_draining_and_running_turns_finish(
    s3_server: LocalS3Server, tmp_path: Path, running: int
) -> None:
    url = f"{s3_server.bucket_url}/drain-{uuid.uuid4().hex[:8]}"
    # Each tool call waits 4 s: the turns are still running while the server drains.
    environment = {"OFFLOAD_SERVER_SCRIPTED_TOOL_DELAY": "4.0", "OFFLOAD_SERVER_DRAIN_SECONDS": "60"}
    sessions = [f"drain-{uuid.uuid4().hex[:6]}" for _ in range(running)]
    answers: dict[str, httpx.Response] = {}
    log = tmp_path / "serve.log"
    refused: list[httpx.Response] = []
    health: list[httpx.Response] = []
    with serve(
        store=url, storage_options=s3_server.storage_options(), tokens=TOKENS, log=log, environment=environment
    ) as server:
        senders = [threading.Thread(target=_send, args=(server.base_url, s, answers)) for s in sessions]
        for sender in senders:
            sender.start()
        _until_running(s3_server, sessions)
        server.process.send_signal(signal.SIGTERM)
        # New connections for as long as the turns run: each is answered (503 draining), none refused at the socket.
        with httpx.Client(base_url=server.base_url, headers=bearer(ACME_TOKEN), timeout=PATIENCE) as late:
            while any(sender.is_alive() for sender in senders):
                refused.append(late.post(f"/api/sessions/late-{len(refused)}/messages", json={"text": "hello"}))
                health.append(late.get("/api/health"))
                threading.Event().wait(0.2)
        code = server.process.wait(timeout=PATIENCE)
        for sender in senders:
            sender.join(timeout=PATIENCE)
    text = log.read_text()
    assert len(refused) >= 2, "the turns ended before the late requests: nothing was in flight"
    assert {r.status_code for r in refused} == {503}, text
    assert {r.json()["error"] for r in refused} == {"draining"}
    assert {r.headers["retry-after"] for r in refused} == {"1"}
    assert {(h.status_code, h.json()["status"]) for h in health} == {(503, "draining")}
    # Refused before touching the store: not one S3 request for any of the late sessions, whatever ran beside them.
    assert s3_server.requests.count(path_contains="/late-") == 0
    assert code == 0, text
    statuses: list[Any] = [(answers[s].status_code, answers[s].json()["status"]) for s in sessions]
    assert statuses == [(200, "completed")] * running, text
