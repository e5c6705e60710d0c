"""
A worker started before its S3 (a container beside S3 in compose): it does not exit, it answers 503 ``not_ready`` and
refuses new work while S3 is down, checks again with backoff (one log line per check), and serves once S3 is up.
Run with the Dockerfile's own CMD.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from fastapi.testclient import TestClient
from server_processes import free_port
from server_tenants import ACME_TOKEN, TOKENS, bearer

from haystack_integrations.offload.testing.local_s3 import LocalS3Server
from offload_haystack_app.server import ServerSettings, create_app

DOCKERFILE = Path(__file__).resolve().parents[3] / "app" / "deploy" / "Dockerfile"
PATIENCE = 60.0  # a bound on every wait below, never what the test measures


def _dockerfile_command(port: int) -> list[str]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    [cmd] = [line.strip()[4:] for line in text.splitlines() if line.startswith("CMD ")]
    command: list[str] = json.loads(cmd)
    assert command[0] == "uvicorn"
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = str(port)
    return [sys.executable, "-m", *command]  # this interpreter's uvicorn, as the image's PATH gives its own


def _health(base_url: str, process: subprocess.Popen[str], log: Path) -> httpx.Response:
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the server exited with code {process.returncode}:\n{log.read_text()}"
        try:
            return httpx.get(f"{base_url}/api/health", timeout=5)
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"no answer within {PATIENCE} s:\n{log.read_text()}")


def _until_ready(base_url: str, process: subprocess.Popen[str], log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        health = _health(base_url, process, log)
        if health.status_code == 200:
            return dict(health.json())
        time.sleep(0.2)
    raise AssertionError(f"not ready within {PATIENCE} s:\n{log.read_text()}")


@pytest.mark.s3
@pytest.mark.slow
def test_the_container_command_waits_for_s3_then_serves(tmp_path: Path) -> None:
    s3_port, port = free_port(), free_port()
    environment = {name: value for name, value in os.environ.items() if not name.startswith(("OFFLOAD_", "AWS_"))}
    environment |= {
        "OFFLOAD_SERVER_STORE": "s3://offload-results/prod",
        "OFFLOAD_SERVER_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}",
        "OFFLOAD_SERVER_S3_REGION": "us-east-1",
        "OFFLOAD_SERVER_S3_ACCESS_KEY_ID": "testing",
        "OFFLOAD_SERVER_S3_SECRET_ACCESS_KEY": "testing",
        "OFFLOAD_SERVER_TOKENS": json.dumps(TOKENS),
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "server.log"
    base_url = f"http://127.0.0.1:{port}"
    with log.open("w") as output:
        process = subprocess.Popen(
            _dockerfile_command(port), stdout=output, stderr=subprocess.STDOUT, text=True, env=environment
        )
    try:
        waiting = _health(base_url, process, log)
        assert waiting.status_code == 503, waiting.text
        assert waiting.json()["status"] == "not_ready"
        assert waiting.json()["exclusive_creates"] == {"verdict": "unknown"}
        refused = httpx.post(
            f"{base_url}/api/sessions/chat-1/messages", json={"text": "hello"}, headers=bearer(ACME_TOKEN), timeout=30
        )
        assert refused.status_code == 503 and refused.json()["error"] == "not_ready", refused.text
        assert refused.headers["retry-after"] == "1"

        with LocalS3Server(port=s3_port, bucket="offload-results") as s3:
            health = _until_ready(base_url, process, log)
            assert health["exclusive_creates"] == {"verdict": "enforced"}
            sent = httpx.post(
                f"{base_url}/api/sessions/chat-1/messages",
                json={"text": "hello"},
                headers=bearer(ACME_TOKEN),
                timeout=60,
            )
            assert sent.status_code == 200, sent.text
            assert sent.json()["status"] == "completed"
            assert s3.requests.count(method="PUT", path_contains="/prod/acme/chat-1/") > 0  # the turn is in this S3
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    lines = log.read_text().splitlines()
    waits = [line for line in lines if "Store check" in line and "unknown" in line]
    assert waits, log.read_text()
    # One line per check, numbered in order, and the one that found S3 up says so.
    numbers = [int(line.split("Store check ", 1)[1].split(":", 1)[0]) for line in waits]
    assert numbers == list(range(1, len(numbers) + 1)), waits
    assert any(f"Store check {len(numbers) + 1}: exclusive creates enforced" in line for line in lines), lines
    assert "Traceback" not in log.read_text()
    # Only the factory's check, before the worker exists, adds the store's own give-up lines; not each wait's check.
    after_first = lines[lines.index(waits[0]) :]
    assert not [line for line in after_first if "Storage gave up" in line], lines


@pytest.mark.s3
def test_a_worker_whose_bucket_is_not_there_yet_waits_for_it(
    s3_server: LocalS3Server, caplog: pytest.LogCaptureFixture
) -> None:
    # S3 answers, its bucket is not made yet (moto's start in compose, a provisioning step): the check raises, which
    # counts as "not known yet", not as a reason to exit.
    bucket = f"later-{uuid.uuid4().hex[:8]}"
    settings = ServerSettings(store=f"s3://{bucket}/prod", storage_options=s3_server.storage_options(), tokens=TOKENS)
    with (
        caplog.at_level(logging.WARNING, logger="offload_haystack_app.server"),
        TestClient(create_app(settings)) as client,
    ):
        waiting = client.get("/api/health")
        assert waiting.status_code == 503 and waiting.json()["exclusive_creates"] == {"verdict": "unknown"}
        refused = client.post("/api/sessions/chat-1/messages", json={"text": "hello"}, headers=bearer(ACME_TOKEN))
        assert refused.status_code == 503 and refused.json()["error"] == "not_ready"
        assert s3_server.requests.count(path_contains=f"/{bucket}/prod/acme/") == 0  # refused before the store

        options = s3_server.storage_options()
        boto3.client(
            "s3",
            endpoint_url=options["endpoint_url"],
            aws_access_key_id=options["key"],
            aws_secret_access_key=options["secret"],
            region_name="us-east-1",
        ).create_bucket(Bucket=bucket)
        deadline = time.monotonic() + PATIENCE
        while client.get("/api/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.get("/api/health").json()["exclusive_creates"] == {"verdict": "enforced"}
        sent = client.post("/api/sessions/chat-1/messages", json={"text": "hello"}, headers=bearer(ACME_TOKEN))
        assert sent.status_code == 200 and sent.json()["status"] == "completed", sent.text
    checks = [record.getMessage() for record in caplog.records if record.getMessage().startswith("Store check")]
    assert checks[0].startswith("Store check 1: exclusive creates on") and "the check failed" in checks[0], checks
    assert checks[-1] == f"Store check {len(checks)}: exclusive creates enforced; the worker is ready.", checks
