"""Every read-back suite asks for ``session``: a session store on each backend (memory, local, S3 over HTTP)."""

import pytest

from haystack_integrations.offload import FsspecToolResultStore


@pytest.fixture
def session(store: FsspecToolResultStore) -> FsspecToolResultStore:
    """A session store (tenant "acme", session "chat-1") on the test's backend."""
    return store.for_session("acme", "chat-1")
