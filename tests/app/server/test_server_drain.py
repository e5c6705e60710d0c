"""
A worker that gets SIGTERM drains: it answers not-ready, refuses new work with 503 ``draining``, lets running turns
finish within its drain time, and exits 0. Before its store's exclusive creates are checked it is not ready either.
"""

import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from server_processes import serve
from server_tenants import ACME_TOKEN, TOKENS, bearer

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores.pending import PendingWrite
from haystack_integrations.offload.testing.local_s3 import LocalS3Server
from haystack_integrations.offload.testing.relay import LatencyProxy
from offload_haystack_app.server import ServerSettings, create_app

RESEARCH = "Research heat pumps, dump the invoices table and chart revenue"


def test_a_draining_worker_is_not_ready_and_refuses_new_work_but_still_reads(client: TestClient) -> None:
    session = f"drain-{uuid.uuid4().hex[:6]}"
    sent = client.post(f"/api/sessions/{session}/messages", json={"text": "hello"}, headers=bearer(ACME_TOKEN))
    assert sent.status_code == 200 and client.get("/api/health").status_code == 200
    client.app.state.readiness.drain()  # type: ignore[attr-defined]
    health = client.get("/api/health")
    assert health.status_code == 503 and health.json()["status"] == "draining"
    refused = client.post(f"/api/sessions/{session}/messages", json={"text": "again"}, headers=bearer(ACME_TOKEN))
    assert refused.status_code == 503 and refused.json()["error"] == "draining"
    assert refused.headers["retry-after"] == "1"
    transcript = client.get(f"/api/sessions/{session}/messages", headers=bearer(ACME_TOKEN)).json()
    assert [m["text"] for m in transcript["messages"] if m["role"] == "user"] == ["hello"]  # nothing of "again"


def test_a_worker_is_not_ready_until_its_store_is_checked(store_url: str) -> None:
    app = create_app(ServerSettings(store=store_url, tokens=TOKENS))
    unstarted = TestClient(app)  # no lifespan: the start-up check has not run
    health = unstarted.get("/api/health")
    assert health.status_code == 503 and health.json()["status"] == "not_ready"
    assert health.json()["exclusive_creates"] == {"verdict": "unchecked"}
    with TestClient(app) as started:
        assert started.get("/api/health").json()["status"] == "ok"


def _send(base_url: str, session: str, answers: list[Any]) -> None:
    with httpx.Client(base_url=base_url, headers=bearer(ACME_TOKEN), timeout=60) as client:
        answers.append(client.post(f"/api/sessions/{session}/messages", json={"text": RESEARCH}))


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.parametrize(("tool_delay", "finishes"), [(0.5, True), (8.0, False)])
def test_sigterm_lets_a_running_turn_finish_within_the_drain_time_and_exits_0(
    s3_server: LocalS3Server, tmp_path: Path, tool_delay: float, finishes: bool
) -> None:
    url = f"{s3_server.bucket_url}/drain-{uuid.uuid4().hex[:8]}"
    environment = {"OFFLOAD_SERVER_SCRIPTED_TOOL_DELAY": str(tool_delay), "OFFLOAD_SERVER_DRAIN_SECONDS": "3"}
    session = f"drain-{uuid.uuid4().hex[:6]}"
    answers: list[Any] = []
    with serve(
        store=url,
        storage_options=s3_server.storage_options(),
        tokens=TOKENS,
        log=tmp_path / "serve.log",
        environment=environment,
    ) as server:
        sender = threading.Thread(target=_send, args=(server.base_url, session, answers))
        sender.start()
        time.sleep(0.6)  # the turn is running its tools
        stopped_at = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(timeout=30)
        took = time.monotonic() - stopped_at
        sender.join(timeout=30)
    log = (tmp_path / "serve.log").read_text()
    assert code == 0, log
    assert took < 3 + 5, took  # the drain time, and the process's own teardown
    if finishes:
        assert answers and answers[0].status_code == 200, (answers, log)
        assert answers[0].json()["status"] == "completed"
    else:
        # Cut at the drain time: the client hears nothing (or an error), and the turn's lease lapses as after a crash.
        assert not answers or answers[0].status_code != 200, log


@pytest.mark.s3
@pytest.mark.slow
def test_shutdown_waits_for_a_write_behind_upload_in_flight(s3_server: LocalS3Server) -> None:
    url = f"{s3_server.bucket_url}/drain-{uuid.uuid4().hex[:8]}"
    with LatencyProxy(s3_server.endpoint_url, latency=1.0) as proxy:
        options = {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        app = create_app(ServerSettings(store=url, storage_options=options, tokens=TOKENS))
        with TestClient(app) as client:

            async def begin() -> PendingWrite:
                session = client.app.state.root.for_session("acme", "chat-1")  # type: ignore[attr-defined]
                return await session.begin_write_async(key="call-1", content="still travelling")

            pending = client.portal.call(begin)
            assert not pending.done()
        # The lifespan's shutdown waited for the upload to finish (behind 1 s of latency) before the loop closed, which
        # would have cancelled it.
        assert pending.done() and pending.error() is None, pending.error()
    reader = FsspecToolResultStore(url, storage_options=s3_server.storage_options()).for_session("acme", "chat-1")
    assert reader.read(pending.reference) == "still travelling"
