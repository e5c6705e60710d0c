"""The store suites' ``store``: a `FsspecToolResultStore` on the test's backend (memory, disk, moto, RGW)."""

from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore


@pytest.fixture
def store(backend: Any) -> FsspecToolResultStore:
    """An unscoped store on the test's backend; its sync methods wait for the async ones (test_sync_twins.py)."""
    url, storage_options = backend
    return FsspecToolResultStore(url, storage_options=storage_options, **backend.store_kwargs)
