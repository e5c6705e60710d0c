"""
The deployment files in ``app/deploy``, linted where no container runtime runs: the Dockerfile's entry is the app
factory and its health check the server's readiness, it runs as a non-root user; HAProxy accepts its configuration;
the compose file runs replicas behind HAProxy with what every replica must share. (The replicas test runs the same
command and configuration as processes.)
"""

import importlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "app" / "deploy"


def _instructions() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(" ", 1)[0], line.split(" ", 1)[1]) for line in lines]


def test_the_container_runs_the_app_factory_as_a_non_root_user_with_a_readiness_check() -> None:
    instructions = _instructions()
    command = json.loads(next(value for name, value in reversed(instructions) if name == "CMD"))
    assert command[:2] == ["uvicorn", "--factory"]
    module, _, factory = command[2].partition(":")
    assert callable(getattr(importlib.import_module(module), factory))
    assert "--timeout-graceful-shutdown" in command
    user = next(value for name, value in reversed(instructions) if name == "USER")
    assert user not in ("root", "0")
    health = next(value for name, value in instructions if name == "HEALTHCHECK")
    assert "/api/health" in health and "status != 200" in health  # 503 while draining or unchecked
    assert instructions[0][1].startswith("python:3.11-slim")


def test_haproxy_accepts_its_configuration() -> None:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)("haproxy is not installed (.ci/run installs Debian's)")
    checked = subprocess.run([haproxy, "-c", "-f", str(DEPLOY / "haproxy.cfg")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "[WARNING]" not in checked.stdout + checked.stderr


def test_the_compose_file_runs_replicas_behind_haproxy_with_shared_settings() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"s3", "app", "haproxy", "prometheus"} <= set(services)
    app = services["app"]
    assert app["deploy"]["replicas"] >= 2
    environment = app["environment"]
    for shared in ("OFFLOAD_SERVER_STORE", "OFFLOAD_SERVER_TOKENS", "OFFLOAD_SERVER_DRAIN_SECONDS"):
        assert shared in environment
    # A drain holds the stop signal until the running turns end, then uvicorn's graceful shutdown runs: the
    # orchestrator must wait for both before it kills the container.
    grace = int(app["stop_grace_period"].removesuffix("s"))
    command = json.loads(next(value for name, value in reversed(_instructions()) if name == "CMD"))
    graceful = float(command[command.index("--timeout-graceful-shutdown") + 1])
    assert grace > float(environment["OFFLOAD_SERVER_DRAIN_SECONDS"]) + graceful
    assert "haproxy.cfg" in services["haproxy"]["volumes"][0]
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = prometheus["scrape_configs"]
    assert job["dns_sd_configs"][0]["port"] == int(environment["OFFLOAD_SERVER_METRICS_PORT"])
