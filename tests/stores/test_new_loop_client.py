"""
Every event loop's S3 client shares one aiobotocore session: a new loop builds only its client, not botocore's model
and credentials again.

Shown on moto's server: the second loop's store works and its client is another client on the same session, every
client is closed with its loop (no "Unclosed client session"), concurrent loops in threads build their clients on
the shared session, and `CrossLoopLock` (what the shared session locks with) serves several loops at once.
"""

import asyncio
import gc
import threading
import uuid
import warnings
from datetime import datetime, timedelta
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores.loop_local import CrossLoopLock
from haystack_integrations.offload.stores.s3fs_io import S3IO
from haystack_integrations.offload.testing.local_s3 import LocalS3Server


def _clients(store: FsspecToolResultStore) -> Any:
    io = store._handle.io()
    assert isinstance(io, S3IO)
    return io.loop_clients


@pytest.mark.s3
def test_a_second_loop_gets_its_own_client_on_the_shared_session(s3_server: LocalS3Server) -> None:
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options(), engine="fsspec"
    )
    session = store.for_session("acme", "chat-1")
    seen: list[tuple[Any, Any]] = []

    async def run(text: str) -> str:
        reference = await session.write_async(key="page.txt", content=text)
        assert await session.read_async(reference) == text
        client = await _clients(store).get()
        seen.append((client.session, client._s3))
        return reference

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unclosed aiohttp session warns when collected
        references = [asyncio.run(run(f"loop {i}")) for i in range(3)]
        gc.collect()

    sessions = {id(botocore_session) for botocore_session, _ in seen}
    clients = {id(client) for _, client in seen}
    assert len(sessions) == 1, "each loop made a botocore session of its own"
    assert len(clients) == 3
    assert all(client._endpoint.http_session._sessions is None for _, client in seen), "a client was left open"
    assert len(_clients(store)) == 0  # every loop's twin closed with its loop
    assert [session.read(reference) for reference in references] == ["loop 0", "loop 1", "loop 2"]


@pytest.mark.s3
def test_concurrent_new_loops_build_their_clients_on_one_session(s3_server: LocalS3Server) -> None:
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options(), engine="fsspec"
    )
    start = threading.Barrier(4)
    sessions: list[Any] = []
    failures: list[BaseException] = []

    def worker(number: int) -> None:
        async def run() -> None:
            start.wait(timeout=30)  # all four loops make their first client at once
            session = store.for_session("acme", f"chat-{number}")
            reference = await session.write_async(key="p.txt", content=str(number))
            assert await session.read_async(reference) == str(number)
            sessions.append((await _clients(store).get()).session)

        try:
            asyncio.run(run())
        except BaseException as error:
            failures.append(error)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        threads = [threading.Thread(target=worker, args=(number,)) for number in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        gc.collect()
    assert failures == []
    assert len(sessions) == 4 and len({id(session) for session in sessions}) == 1


@pytest.mark.s3
@pytest.mark.parametrize("tenant_credentials", [False, True])
def test_skip_instance_cache_in_the_storage_options_is_taken_on_every_loop(
    s3_server: LocalS3Server, tenant_credentials: bool
) -> None:
    # The store asks fsspec for uncached instances itself (a loop's client; a tenant's): an option saying the same
    # must not collide with its own.
    from haystack_integrations.offload.stores import AssumeRoleCredentials

    credentials = AssumeRoleCredentials("arn:aws:iam::123456789012:role/t") if tenant_credentials else None
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options={**s3_server.storage_options(), "skip_instance_cache": True},
        engine="fsspec",
        credentials=credentials,
    ).for_session("acme", "chat-1")
    reference = store.write(key="sync", content="on fsspec's loop")  # the sync client
    assert asyncio.run(store.read_async(reference)) == "on fsspec's loop"  # a new loop's client


@pytest.mark.s3
def test_a_session_given_in_storage_options_is_used_as_given(s3_server: LocalS3Server) -> None:
    from aiobotocore.session import AioSession

    mine = AioSession()
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options={**s3_server.storage_options(), "session": mine},
        engine="fsspec",
    )

    async def run() -> Any:
        await store.for_session("acme", "chat-1").write_async(key="p.txt", content="x")
        return (await _clients(store).get()).session

    assert asyncio.run(run()) is mine


def test_cross_loop_lock_serves_loops_in_several_threads() -> None:
    lock = CrossLoopLock()
    inside = 0
    most = 0
    counter = threading.Lock()

    async def critical() -> None:
        nonlocal inside, most
        async with lock:
            with counter:
                inside += 1
                most = max(most, inside)
            await asyncio.sleep(0.005)
            with counter:
                inside -= 1

    def worker() -> None:
        async def run() -> None:
            await asyncio.gather(*(critical() for _ in range(5)))

        asyncio.run(run())

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert most == 1
    assert not lock.locked()


def test_shared_refreshable_credentials_refresh_from_any_loop() -> None:
    from aiobotocore.credentials import AioRefreshableCredentials

    from haystack_integrations.offload.stores.s3fs_io import _shared_session_class

    refreshes = 0

    async def refresh() -> dict[str, str]:
        nonlocal refreshes
        refreshes += 1
        await asyncio.sleep(0.05)  # holders on other loops wait meanwhile
        return _metadata(timedelta(hours=1))

    session = _shared_session_class()()
    session._credentials = AioRefreshableCredentials.create_from_metadata(_metadata(timedelta(0)), refresh, "test")
    go = threading.Barrier(3)
    keys: list[str] = []
    failures: list[BaseException] = []

    def worker() -> None:
        async def run() -> None:
            credentials = await session.get_credentials()
            go.wait(timeout=10)
            # Two refreshes wanted at once on one loop: with an asyncio.Lock, the loser binds the lock to this loop,
            # and a waiter on any other loop then fails.
            frozen = await asyncio.gather(credentials.get_frozen_credentials(), credentials.get_frozen_credentials())
            keys.extend(item.access_key for item in frozen)

        try:
            asyncio.run(run())
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert failures == []
    assert keys == ["refreshed"] * 6
    assert refreshes == 1


def _metadata(lifetime: timedelta) -> dict[str, str]:
    expiry = datetime.now().astimezone() + lifetime
    key = "refreshed" if lifetime else "expired"
    return {"access_key": key, "secret_key": "s", "token": "t", "expiry_time": expiry.isoformat()}
