"""
Fixtures for the operator-command tests: a store with real conversations in it, and an S3 server enforcing IAM.

The store is filled by the reference server's own `ChatService` (the real Agent, hooks and scripted model), so the
commands meet exactly what a deployment leaves behind: results, history turns, approval records and audit events.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cli_stores import FilledStore, IamEndpoint

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.demo.model import scripted_generator
from haystack_integrations.offload.server.agent import build_agent
from haystack_integrations.offload.server.service import ChatService


async def _fill(root: FsspecToolResultStore) -> None:
    service = ChatService(build_agent(scripted_generator()), worker="cli-test")
    chat = root.for_session("acme", "chat-1")
    await service.send_message(chat, "Research solar panels, dump the invoices table and chart revenue")
    turn = await service.send_message(chat, "Send an invoice to Initech for 250 EUR", actor="acme/alice")
    await service.decide(chat, turn.pending[0].request_id, approved=True, actor="acme/alice")
    await service.send_message(root.for_session("acme", "chat-2"), "Chart revenue")
    await service.send_message(root.for_session("globex", "chat-1"), "Research wind farms")


@pytest.fixture
def filled(backend: Any) -> FilledStore:
    """A store on each backend (memory, local, S3) with three conversations in it."""
    url, storage_options = backend
    root = FsspecToolResultStore(url, storage_options=storage_options)
    asyncio.run(_fill(root))
    return FilledStore(url=url, storage_options=dict(storage_options), root=root)


@pytest.fixture(scope="module")
def iam_endpoint() -> Iterator[IamEndpoint]:
    """
    ``python -m haystack_integrations.offload.local_s3 --enforce-iam`` in a subprocess.

    A process of its own because moto's IAM switch is process-global: here it would lock out the shared S3 server.
    """
    if sys.platform == "win32":
        pytest.skip("stops the server with SIGINT")
    process = subprocess.Popen(
        [sys.executable, "-m", "haystack_integrations.offload.local_s3", "--port", "0", "--quiet", "--enforce-iam"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        settings: dict[str, str] = {}
        for line in process.stdout:
            name, _, value = line.partition(":")
            settings[name.strip()] = value.strip()
            if line.startswith("Press Ctrl-C"):
                break
        else:
            pytest.fail(f"the local S3 server exited early with code {process.wait()}")
        yield IamEndpoint(settings["Bucket URL"], json.loads(settings["storage_options"]))
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
