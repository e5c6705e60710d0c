"""
The sync/async axis of the store suites: modules that ask for the ``api`` fixture (``usefixtures("api")``) run every
test twice, once through the store's sync methods and once through its async twins.

In ``async`` mode the test's ``store`` is an `AsyncDriven` view: the test still calls ``store.read(...)``, and the view
awaits ``read_async`` on an event loop of its own, in its own thread, as a server's handler would. So one suite checks
both halves of the API, and a drift between them fails it.
"""

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore

# Methods whose results are themselves stores (or documents) to drive the same way.
_DERIVING = {"for_session", "for_tenant", "documents"}


class LoopThread:
    """An event loop running in a thread of its own, for awaiting coroutines from sync test code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="async-api-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)

    def close(self) -> None:
        # Async generators guard the loop's S3 clients (stores/loop_local.py): finishing them closes the clients.
        asyncio.run_coroutine_threadsafe(self.loop.shutdown_asyncgens(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


class AsyncDriven:
    """A store (or its documents) whose every method with an ``*_async`` twin is served by that twin."""

    def __init__(self, target: Any, loop: LoopThread) -> None:
        self._target = target
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        twin = getattr(self._target, f"{name}_async", None)
        if callable(twin):
            return lambda *args, **kwargs: self._loop.run(twin(*args, **kwargs))
        if name in _DERIVING:
            return lambda *args, **kwargs: AsyncDriven(value(*args, **kwargs), self._loop)
        return value

    def __repr__(self) -> str:
        return f"AsyncDriven({self._target!r})"


@pytest.fixture
def async_api_loop() -> Iterator[LoopThread]:
    # One per test, as a server has one per worker: each test's store makes its S3 client on it, closed with it.
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> str:
    """Which half of the store's API the test's ``store`` calls."""
    return str(request.param)


@pytest.fixture
def store(backend: Any, request: pytest.FixtureRequest) -> Any:
    """An ``FsspecToolResultStore`` on the test's backend, driven through the API half ``api`` names (if asked)."""
    url, storage_options = backend
    real = FsspecToolResultStore(url, storage_options=storage_options, **backend.store_kwargs)
    if "api" in request.fixturenames and request.getfixturevalue("api") == "async":
        return AsyncDriven(real, request.getfixturevalue("async_api_loop"))
    return real
