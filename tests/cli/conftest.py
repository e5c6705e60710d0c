"""
Fixtures for the operator-command tests: a store with real conversations in it, and an S3 server enforcing IAM.

The store is filled by the reference server's own `ChatService` (the real Agent, hooks and scripted model), so the
commands meet exactly what a deployment leaves behind: results, history turns, approval records and audit events.
"""

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cli_stores import FilledStore, IamEndpoint

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.sessions.service import ChatService
from haystack_integrations.offload.testing.local_s3 import local_s3_process
from offload_haystack_app.demo.scripted_model import scripted_generator
from offload_haystack_app.server.agent import build_agent


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
    root = FsspecToolResultStore(url, storage_options=storage_options, **backend.store_kwargs)
    asyncio.run(_fill(root))
    return FilledStore(url=url, storage_options=dict(storage_options), root=root)


@pytest.fixture(scope="module")
def iam_endpoint() -> Iterator[IamEndpoint]:
    """
    ``python -m haystack_integrations.offload.testing.local_s3 --enforce-iam`` in a subprocess.

    A process of its own because moto's IAM switch is process-global: here it would lock out the shared S3 server.
    """
    if sys.platform == "win32":
        pytest.skip("stops the server with SIGINT")
    with local_s3_process(enforce_iam=True) as server:
        yield IamEndpoint(server.bucket_url, server.storage_options)
