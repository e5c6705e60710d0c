"""
A replica draining behind HAProxy (``app/deploy``'s configuration) keeps answering: HAProxy's health check sees it
answer 503 (``L7STS``), not refuse the connection (``L4CON``, "down"), and the new turns it refuses with 503
``draining`` are sent to the other replica (``retry-on 503``), while the turns it was running finish.
"""

import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_tenants import ACME_TOKEN, TOKENS, bearer

from support.replicas import HOSTS, LoadBalancer, Replica, replica_environment

pytestmark = [pytest.mark.s3, pytest.mark.slow]

RESEARCH = "Research heat pumps, dump the invoices table and chart revenue"
PATIENCE = 60.0  # seconds any wait may take before the test fails (never an assertion on speed)


@pytest.fixture
def replicas(s3_endpoint: Any, tmp_path: Path) -> Iterator[tuple[list[Replica], LoadBalancer]]:
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is not installed (.ci/run installs Debian's)")
    store = f"{s3_endpoint.bucket_url}/drain-haproxy-{uuid.uuid4().hex[:8]}"
    environment = replica_environment(store, s3_endpoint.storage_options(), TOKENS)
    # Each tool call waits 4 s: the draining replica's turns outlast HAProxy's two failed checks (inter 1s, fall 2).
    environment |= {"OFFLOAD_SERVER_SCRIPTED_TOOL_DELAY": "4.0", "OFFLOAD_SERVER_DRAIN_SECONDS": "60"}
    servers = [Replica(f"r{n}", host, environment, tmp_path / f"r{n}.log") for n, host in enumerate(HOSTS[:2], 1)]
    balancer = LoadBalancer(servers, tmp_path)
    try:
        for replica in servers:
            replica.start()
        for replica in servers:
            replica.wait_ready()
        balancer.start()
        yield servers, balancer
    finally:
        for replica in servers:
            replica.kill()
        balancer.stop()


def _send(url: str, session: str, answers: dict[str, httpx.Response]) -> None:
    with httpx.Client(base_url=url, headers=bearer(ACME_TOKEN), timeout=PATIENCE) as client:
        answers[session] = client.post(f"/api/sessions/{session}/messages", json={"text": RESEARCH})


def test_a_replica_draining_behind_haproxy_answers_503_and_its_running_turns_finish(
    replicas: tuple[list[Replica], LoadBalancer],
) -> None:
    (draining, _), balancer = replicas
    sessions = [f"drain-{uuid.uuid4().hex[:6]}" for _ in range(4)]
    answers: dict[str, httpx.Response] = {}
    senders = [threading.Thread(target=_send, args=(balancer.url, s, answers)) for s in sessions]
    for sender in senders:  # round robin: two turns on each replica
        sender.start()
    for _ in range(int(PATIENCE / 0.05)):
        if balancer.in_flight(draining.name) >= 2:
            break
        threading.Event().wait(0.05)
    assert balancer.in_flight(draining.name) >= 2, balancer.stats()
    assert draining.process is not None
    draining.process.terminate()  # SIGTERM, as an orchestrator stops a container
    late: list[httpx.Response] = []
    down: dict[str, str] = {}
    with httpx.Client(base_url=balancer.url, headers=bearer(ACME_TOKEN), timeout=PATIENCE) as client:
        # New turns for as long as the draining replica's turns run; HAProxy's view of it once it leaves the rotation.
        while any(sender.is_alive() for sender in senders):
            late.append(client.post(f"/api/sessions/late-{uuid.uuid4().hex[:6]}/messages", json={"text": "hello"}))
            row = balancer.stats()[draining.name]
            if not down and row["status"].startswith("DOWN"):
                down = row
            threading.Event().wait(0.2)
    code = draining.process.wait(timeout=PATIENCE)
    stats = balancer.stats()[draining.name]
    logs = "\n".join(replica.log.read_text()[-3000:] for replica in replicas[0])
    assert down, "the draining replica never left HAProxy's rotation while its turns ran"
    # The check saw an answer (503 draining), not a refused connection: "retry elsewhere", not "down".
    assert (down["check_status"], down["check_code"]) == ("L7STS", "503"), down
    # Turns refused by the draining replica (503) went to the other one: every late turn was answered.
    assert len(late) >= 2 and {r.status_code for r in late} == {200}, [(r.status_code, r.text[:80]) for r in late]
    # HAProxy's counts: its 503s were sent to the other replica (redispatched), and no connection to it failed.
    assert int(stats["wredis"] or 0) >= 1 and int(stats["econ"] or 0) == 0, stats
    statuses = [(answers[s].status_code, answers[s].json()["status"]) for s in sessions]
    assert statuses == [(200, "completed")] * 4, logs
    assert code == -15, logs  # uvicorn run directly re-raises SIGTERM after its clean shutdown
