"""
The compose file's start-up order: the app replicas wait for S3 to be healthy (moto answers and the store's bucket
exists), S3's health check really tells that, and every service restarts unless stopped. Linted here, where no
container runtime runs; its check command is run against moto's server.
"""

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from haystack_integrations.offload.testing.local_s3 import LocalS3Server

COMPOSE = Path(__file__).resolve().parents[2] / "app" / "deploy" / "compose.yaml"


def _services() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text())["services"])


def test_the_replicas_start_once_s3_is_healthy_and_everything_restarts() -> None:
    services = _services()
    assert services["app"]["depends_on"] == {"s3": {"condition": "service_healthy"}}
    assert {name: service.get("restart") for name, service in services.items()} == dict.fromkeys(
        services, "unless-stopped"
    )


def test_the_s3_check_asks_for_the_stores_bucket_on_the_port_s3_serves() -> None:
    services = _services()
    check = services["s3"]["healthcheck"]
    assert not check.get("disable") and check["test"][:3] == ["CMD", "python", "-c"]
    command = services["s3"]["command"]
    port = command[command.index("--port") + 1]
    bucket = services["app"]["environment"]["OFFLOAD_SERVER_STORE"].removeprefix("s3://").split("/")[0]
    assert f"http://127.0.0.1:{port}/{bucket}'" in check["test"][3]


def _run_check(endpoint_url: str, bucket: str) -> int:
    script = _services()["s3"]["healthcheck"]["test"][3]
    script = script.replace("http://127.0.0.1:5000/offload-results", f"{endpoint_url}/{bucket}")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30, check=False).returncode


@pytest.mark.s3
def test_the_s3_check_is_healthy_only_once_the_bucket_exists(s3_server: LocalS3Server) -> None:
    assert _run_check(s3_server.endpoint_url, s3_server.bucket) == 0
    assert _run_check(s3_server.endpoint_url, f"missing-{uuid.uuid4().hex[:8]}") != 0
    with LocalS3Server() as stopped:
        endpoint_url = stopped.endpoint_url
    assert _run_check(endpoint_url, stopped.bucket) != 0  # nothing listens
