"""
Three replicas of the reference server (the container's command, on 127.0.0.2-4) behind HAProxy (``app/deploy``'s
configuration), sharing one bucket, under concurrent tenants' messages and decisions: a rolling restart of every
replica and a SIGKILL of one, each while it holds requests (HAProxy's own count says so), lose no answered turn,
answer none twice, run no approved call twice or never and no denied call, and leave every session usable.
"""

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_tenants import TOKENS

from support.replicas import Load, LoadBalancer, Replica, check_sessions, deployment

pytestmark = [pytest.mark.s3, pytest.mark.slow]


@pytest.fixture
def replicas(s3_endpoint: Any, tmp_path: Path) -> Iterator[tuple[list[Replica], LoadBalancer]]:
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is not installed (.ci/run installs Debian's)")
    store = f"{s3_endpoint.bucket_url}/replicas-{uuid.uuid4().hex[:8]}"
    with deployment(3, store, s3_endpoint.storage_options(), TOKENS, tmp_path) as started:
        yield started


def test_rolling_restart_and_a_kill_under_load_lose_nothing(replicas: tuple[list[Replica], LoadBalancer]) -> None:
    servers, balancer = replicas
    load = Load(balancer.url, TOKENS, sessions_per_tenant=3)
    sessions = load.run()
    time.sleep(2)
    open_at_signal: dict[str, int] = {}
    # Rolling restart: one at a time, each seen down by HAProxy and back before the next goes. Restarting before the
    # checks notice (a short drain, a quick start) would leave no failover to test.
    for replica in servers:
        open_at_signal[f"stop {replica.name}"] = balancer.wait_busy(replica.name)
        taken_out = balancer.times_down(replica.name)
        replica.stop()
        balancer.wait_down(replica.name, since=taken_out)
        replica.start()
        replica.wait_ready()
        balancer.wait_up(replica.name)
    victim = servers[1]
    open_at_signal[f"kill {victim.name}"] = balancer.wait_busy(victim.name)
    taken_out = balancer.times_down(victim.name)
    victim.kill()
    balancer.wait_down(victim.name, since=taken_out)
    victim.start()
    victim.wait_ready()
    time.sleep(2)
    load.finish()
    stats = balancer.stats()
    counts = check_sessions(balancer.url, TOKENS, load, sessions)
    logs = "\n".join(replica.log.read_text()[-1500:] for replica in servers)
    # The signals came while requests were open on the replica, and HAProxy saw each replica go down.
    assert sum(open_at_signal.values()) >= 3 and open_at_signal[f"kill {victim.name}"] > 0, open_at_signal
    # (At least: a check that timed out on a loaded machine also counts.)
    taken_out = [int(stats[replica.name]["chkdown"]) for replica in servers]
    assert all(count >= least for count, least in zip(taken_out, [1, 2, 1], strict=True)), stats
    # A drained stop is uvicorn re-raising SIGTERM after the lifespan ended (-15); the kill is -9.
    assert [replica.exits for replica in servers] == [[-15], [-15, -9], [-15]], logs
    assert all(replica.log.read_text().count("Application shutdown complete.") == 1 for replica in servers), logs
    assert counts["turns"] > 20 and counts["calls"] > 0, counts
    must_be_zero = {name: value for name, value in counts.items() if name not in ("turns", "calls", "asked_again")}
    refused = [(s.session, s.text, s.status) for s in load.sent if s.status != 200]
    # A string, which pytest prints whole (a tuple's repr is cut short), with the replicas' logs.
    assert not any(must_be_zero.values()), "\n".join([str(counts), *load.details, str(refused), logs])
