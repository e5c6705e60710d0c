"""Fixtures for the server tests: two tenants with their tokens, and the app on a memory or local store."""

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from server_tenants import TOKENS

from haystack_integrations.offload import FsspecToolResultStore
from offload_haystack_app.server import ServerSettings, create_app


@pytest.fixture(params=["memory", "local"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh root for one test, in memory and on local disk (S3 is covered by the two-process tests)."""
    if request.param == "memory":
        return f"memory://server-test-{uuid.uuid4().hex}"
    return str(tmp_path / "results")


@pytest.fixture
def root(store_url: str) -> FsspecToolResultStore:
    """The root store the app serves (for checks from outside the HTTP API)."""
    return FsspecToolResultStore(store_url)


@pytest.fixture
def client(store_url: str) -> Iterator[TestClient]:
    """The app, started (lifespan included), with two tenants' tokens."""
    app = create_app(ServerSettings(store=store_url, tokens=TOKENS))
    with TestClient(app) as test_client:
        yield test_client
