"""A store that worked, whose server then stopped: what its next write meets (the cloud emulators' tests share it)."""

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore, RetryPolicy, StorageError


def write_after_the_server_stopped(
    server: AbstractContextManager[Any], make_store: Callable[..., FsspecToolResultStore], policy: RetryPolicy
) -> tuple[StorageError, dict[str, Any], str]:
    """
    Write once while `server` runs, stop it, and write again.

    :param server: The emulator, not started yet; it stops when its block ends.
    :param make_store: Builds a store on the running server (given it and ``retry=``).
    :param policy: The store's retry policy.
    :returns: The second write's error, the store's retry stats, and the server's endpoint.
    """
    with server as running:
        store = make_store(running, retry=policy)
        session = store.for_session("acme", "chat-1")
        session.write(key="before.txt", content="up")
    with pytest.raises(StorageError) as caught:
        session.write(key="k.txt", content="x")
    return caught.value, store.retry_stats.as_dict(), running.endpoint
