"""
The store's sync API is its async API waited for (`stores.sync_api.synced`), so the suites call one half only.

What is checked here instead of running every store test twice: each sync method is derived from its ``*_async``
twin (same signature, the twin's docstring), it waits for the instance's own twin, and the two halves meet on one
store: what an async caller on its own loop (a server's handler) writes, a sync caller reads, and back, on every
backend and engine.
"""

import asyncio
import inspect
from typing import Any

import pytest

from haystack_integrations.offload import (
    DocumentExistsError,
    FsspecToolResultStore,
    ResultNotFoundError,
    end_session,
    end_session_async,
)
from haystack_integrations.offload.stores.documents import SessionDocuments

pytestmark = [pytest.mark.real_s3, pytest.mark.engines]

# Written out on purpose: a derived `write` would take the narrower signature of Haystack's `ToolResultStore.write`
# for type checkers (no `tool_name`). `begin_write_async` has no sync form: its upload goes on in a task.
HAND_WRITTEN = {(FsspecToolResultStore, "write")}
ASYNC_ONLY = {(FsspecToolResultStore, "begin_write_async")}


def _pairs(cls: type) -> list[tuple[str, str]]:
    public = {name for name in dir(cls) if not name.startswith("_")}
    return sorted((name.removesuffix("_async"), name) for name in public if name.endswith("_async"))


@pytest.mark.parametrize("cls", [FsspecToolResultStore, SessionDocuments])
def test_every_sync_method_is_its_async_twin_waited_for(cls: type) -> None:
    checked = 0
    for sync_name, async_name in _pairs(cls):
        if (cls, async_name) in ASYNC_ONLY:
            assert not hasattr(cls, sync_name)
            continue
        sync_method, async_method = getattr(cls, sync_name), getattr(cls, async_name)
        assert inspect.iscoroutinefunction(async_method) and not inspect.iscoroutinefunction(sync_method)
        assert inspect.signature(sync_method) == inspect.signature(async_method), sync_name
        if (cls, sync_name) not in HAND_WRITTEN:
            assert sync_method.__wrapped__ is async_method, f"{cls.__name__}.{sync_name} is written by hand"
            assert sync_method.__name__ == sync_name
            assert sync_method.__doc__.startswith(f"The sync form of `{async_name}`")
            assert async_method.__doc__ and inspect.cleandoc(async_method.__doc__) in inspect.cleandoc(
                sync_method.__doc__
            )
        checked += 1
    assert checked >= (12 if cls is FsspecToolResultStore else 5)


def test_end_session_is_end_session_async_waited_for() -> None:
    assert end_session.__wrapped__ is end_session_async  # type: ignore[attr-defined]
    assert inspect.signature(end_session) == inspect.signature(end_session_async)


def test_a_sync_method_waits_for_the_instances_own_twin(tmp_path: Any) -> None:
    reads: list[str] = []

    class Audited(FsspecToolResultStore):
        async def read_async(self, reference: str) -> str | bytes:
            reads.append(reference)
            return await super().read_async(reference)

    session = Audited(f"file://{tmp_path}").for_session("acme", "chat-1")
    reference = session.write(key="a.txt", content="hello")
    assert session.read(reference) == "hello"
    assert reads == [reference]


@pytest.fixture
def session(backend: Any) -> FsspecToolResultStore:
    url, storage_options = backend
    return FsspecToolResultStore(url, storage_options=storage_options, **backend.store_kwargs).for_session("acme", "c")


async def test_an_async_caller_and_a_sync_caller_share_one_store(session: FsspecToolResultStore) -> None:
    # This test's event loop is not fsspec's I/O loop: the async half runs here, the sync half (from a thread, as a
    # sync tool would) on the loop the store picks for it.
    written = await session.write_async(key="1_search_a.txt", content="from async")
    assert await asyncio.to_thread(session.read, written) == "from async"
    other = await asyncio.to_thread(session.write, key="2_search_b.bin", content=b"from sync")
    assert await session.read_async(other) == b"from sync"
    assert await session.read_range_async(other, 5, 9) == b"sync"
    listed_async = sorted(result.reference for result in await session.list_async())
    assert listed_async == sorted(result.reference for result in await asyncio.to_thread(session.list))
    assert listed_async == sorted([written, other])

    documents = session.documents("notes")
    await documents.create_async("first.json", b'{"writer": "async"}')
    with pytest.raises(DocumentExistsError):
        await asyncio.to_thread(documents.create, "first.json", b'{"writer": "sync"}')
    assert await asyncio.to_thread(documents.list) == ["first.json"]

    assert await asyncio.to_thread(end_session, session, documents=True) >= 3
    with pytest.raises(ResultNotFoundError):
        await session.read_async(written)
    assert await documents.list_async() == []
