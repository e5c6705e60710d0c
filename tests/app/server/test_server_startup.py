"""The server's start-up check of its store: it does not serve on a store that ignores exclusive creates."""

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_tenants import TOKENS

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores.exclusive_creates import ExclusiveCreateCheck
from haystack_integrations.offload.testing.faults import FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server
from offload_haystack_app.server import ServerSettings, create_app
from offload_haystack_app.server.startup import ServerStartupError, require_exclusive_creates


@pytest.fixture
def ignoring_proxy(s3_server: LocalS3Server) -> Iterator[FaultProxy]:
    """moto behind a proxy that strips If-None-Match: a store that ignores conditional writes."""
    with FaultProxy(s3_server.endpoint_url, ignore_conditional_writes=True) as proxy:
        yield proxy


def _ignoring_settings(s3_server: LocalS3Server, proxy: FaultProxy) -> ServerSettings:
    options = {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url}
    return ServerSettings(store=f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=options, tokens=TOKENS)


def test_health_shows_the_verdict_and_no_store(client: TestClient, store_url: str) -> None:
    health = client.get("/api/health").json()
    assert health["exclusive_creates"] == {"verdict": "enforced"}
    assert store_url not in str(health) and "endpoint" not in str(health)


@pytest.mark.s3
def test_the_app_does_not_start_on_a_store_that_ignores_conditional_writes(
    s3_server: LocalS3Server, ignoring_proxy: FaultProxy
) -> None:
    app = create_app(_ignoring_settings(s3_server, ignoring_proxy))
    with pytest.raises(ServerStartupError, match="If-None-Match") as refused, TestClient(app):
        pass
    assert "\n" not in str(refused.value) and ignoring_proxy.endpoint_url in str(refused.value)
    assert len(ignoring_proxy.stripped.snapshot()) > 0  # the proxy really removed the conditions


def test_an_unknown_verdict_is_checked_again_then_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = FsspecToolResultStore(str(tmp_path))
    verdicts = iter(["unknown", "unknown", "enforced"])
    asked: list[bool] = []

    def check(*, refresh: bool = False) -> ExclusiveCreateCheck:
        asked.append(refresh)
        return ExclusiveCreateCheck(next(verdicts), "The object store 'x'", "the probe failed: 503")

    monkeypatch.setattr(root, "check_exclusive_creates", check)
    assert require_exclusive_creates(root, attempts=3, delay=0).verdict == "enforced"
    assert len(asked) == 3
    verdicts = iter(["unknown"] * 5)
    asked.clear()
    with pytest.raises(ServerStartupError, match="unknown, retry"):
        require_exclusive_creates(root, attempts=2, delay=0)
    assert len(asked) == 2


@pytest.mark.s3
@pytest.mark.slow
def test_serve_exits_2_with_one_line_on_a_store_that_ignores_conditional_writes(
    s3_server: LocalS3Server, ignoring_proxy: FaultProxy, tmp_path: Path
) -> None:
    settings = _ignoring_settings(s3_server, ignoring_proxy)
    environment = {name: value for name, value in os.environ.items() if not name.startswith(("OFFLOAD_", "AWS_"))}
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(TOKENS))
    command = [
        sys.executable,
        "-m",
        "haystack_integrations.offload.cli",
        "serve",
        "--store",
        settings.store,
        "--storage-options",
        json.dumps(settings.storage_options),
        "--tokens-file",
        str(tokens),
        "--port",
        "1",  # never bound: the check stops serve before uvicorn listens
    ]
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert settings.store in lines[0] and "If-None-Match" in lines[0]
