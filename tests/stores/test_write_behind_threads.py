"""
Write-behind uploads are waited for from any thread and any event loop, not only from the loop that started them.

A web server ends a session from a sync endpoint (a thread-pool thread) or from another worker's loop while the
uploads of the session's last turn are still in flight on the loop that ran it. Every upload here is held back by a
gate until the test opens it: on S3 a proxy holds each PUT before it reaches the server, on memory and local disk the
store's upload waits for the gate. So "it waited" is shown by the caller still blocking while the gate is shut, with no
timing luck either way.
"""

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore, ResultNotFoundError, end_session, end_session_async
from haystack_integrations.offload.stores.io import SyncBackedIO
from haystack_integrations.offload.stores.pending import settle
from haystack_integrations.offload.testing.local_s3 import LocalS3Server
from haystack_integrations.offload.testing.relay import LatencyProxy, ProxiedRequest

pytestmark = pytest.mark.engines  # also on the obstore engine (tests/conftest.py)

# How long a caller must keep blocking while the gate is shut to count as waiting (the old code returned at once).
STILL_WAITING = 0.3
# A bound on anything that should finish, so a broken wait fails the test instead of hanging it.
DONE = 30.0


async def _until(gate: threading.Event) -> None:
    # Polled: the test's thread opens it, and an asyncio.Event belongs to one loop.
    while not gate.is_set():  # noqa: ASYNC110 - see above
        await asyncio.sleep(0.005)


class _HeldPuts(LatencyProxy):
    """A proxy that holds every PUT back, before it reaches the server, until `gate` is set."""

    def __init__(self, upstream: str, gate: threading.Event) -> None:
        super().__init__(upstream)
        self._gate = gate

    async def _on_request(self, request: ProxiedRequest) -> None:
        await super()._on_request(request)
        if request.method == "PUT":
            await _until(self._gate)


@pytest.fixture
def held(
    backend: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[FsspecToolResultStore, threading.Event]]:
    """A root store whose uploads cannot finish until the returned gate is set (it is set at the end in any case)."""
    url, storage_options = backend
    gate = threading.Event()
    try:
        if url.startswith("s3://"):
            server: LocalS3Server = request.getfixturevalue("s3_server")
            with _HeldPuts(server.endpoint_url, gate) as proxy:
                options = {**storage_options, "endpoint_url": proxy.endpoint_url}
                root = FsspecToolResultStore(url, storage_options=options, **backend.store_kwargs)
                root.warm_up()  # so a sync call that does not wait is over long before STILL_WAITING
                yield root, gate
                gate.set()
        else:
            put_async = SyncBackedIO.put_async

            async def held_put_async(self: SyncBackedIO, path: str, data: bytes) -> None:
                await _until(gate)
                await put_async(self, path, data)

            monkeypatch.setattr(SyncBackedIO, "put_async", held_put_async)
            yield FsspecToolResultStore(url, storage_options=storage_options), gate
    finally:
        gate.set()


class _Uploads:
    """
    Thread A: starts write-behind uploads on an event loop of its own and keeps that loop running until they finish.

    Entering returns the references at once, while the uploads are still held; leaving opens the gate and waits for
    thread A (its loop, and the S3 client made on it, are closed by `asyncio.run`).
    """

    def __init__(self, session: FsspecToolResultStore, gate: threading.Event, count: int = 3) -> None:
        self._session = session
        self._gate = gate
        self._count = count
        self._references: concurrent.futures.Future[list[str]] = concurrent.futures.Future()
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(),), name="uploads")
        self.errors: list[BaseException | None] = []

    async def _run(self) -> None:
        try:
            pending = [
                await self._session.begin_write_async(key=f"result-{number}.txt", content=f"content {number}")
                for number in range(self._count)
            ]
        except BaseException as error:
            self._references.set_exception(error)
            raise
        self._references.set_result([write.reference for write in pending])
        await settle(pending)
        self.errors = [write.error() for write in pending]

    def __enter__(self) -> list[str]:
        self._thread.start()
        return self._references.result(timeout=DONE)

    def __exit__(self, *exc_info: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._gate.set()
        self._thread.join(timeout=DONE)
        assert not self._thread.is_alive()
        assert self.errors == [None] * self._count


def _waits_then_finishes(call: Callable[[], Any], gate: threading.Event) -> Any:
    """Run `call` in thread B: it must still be blocked while the gate is shut, and finish once it opens."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="caller") as thread_b:
        outcome = thread_b.submit(call)
        done, _ = concurrent.futures.wait([outcome], timeout=STILL_WAITING)
        assert not done, f"returned without waiting for the uploads: {outcome.result()!r}"
        gate.set()
        return outcome.result(timeout=DONE)


@pytest.mark.parametrize("end", ["purge", "end_session"])
def test_a_sync_purge_from_another_thread_waits_for_uploads_in_flight(
    held: tuple[FsspecToolResultStore, threading.Event], end: str
) -> None:
    root, gate = held
    # A sync endpoint builds its own session store from the shared root: the in-flight table is the root's.
    ending = root.for_session("acme", "chat-1")
    call = ending.purge if end == "purge" else lambda: end_session(ending)
    with _Uploads(root.for_session("acme", "chat-1"), gate):
        purged = _waits_then_finishes(call, gate)

    assert purged == 3
    assert ending.list() == []


@pytest.mark.parametrize("end", ["purge_async", "end_session_async"])
def test_an_async_purge_on_another_loop_waits_for_uploads_in_flight(
    held: tuple[FsspecToolResultStore, threading.Event], end: str
) -> None:
    root, gate = held
    ending = root.for_session("acme", "chat-1")
    with _Uploads(root.for_session("acme", "chat-1"), gate):
        # Thread B runs a loop of its own: the uploads' tasks belong to thread A's.
        purged = _waits_then_finishes(
            lambda: asyncio.run(ending.purge_async() if end == "purge_async" else end_session_async(ending)), gate
        )

    assert purged == 3
    assert ending.list() == []


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        pytest.param(lambda store, reference: store.read(reference), "content 0", id="read"),
        pytest.param(lambda store, reference: store.read_range(reference, 0, 7), b"content", id="read_range"),
        pytest.param(
            lambda store, reference: store.read_range_and_size(reference, 8, 9), (b"0", 9), id="read_range_and_size"
        ),
        pytest.param(lambda store, reference: store.info(reference).size, 9, id="info"),
        pytest.param(lambda store, reference: reference in {r.reference for r in store.list()}, True, id="list"),
    ],
)
def test_a_sync_read_from_another_thread_waits_for_the_upload(
    held: tuple[FsspecToolResultStore, threading.Event],
    method: Callable[[FsspecToolResultStore, str], Any],
    expected: Any,
) -> None:
    root, gate = held
    reader = root.for_session("acme", "chat-1")
    with _Uploads(root.for_session("acme", "chat-1"), gate, count=1) as (reference,):
        assert _waits_then_finishes(lambda: method(reader, reference), gate) == expected


def test_a_sync_delete_from_another_thread_waits_so_the_upload_cannot_land_after_it(
    held: tuple[FsspecToolResultStore, threading.Event],
) -> None:
    root, gate = held
    reader = root.for_session("acme", "chat-1")
    with _Uploads(root.for_session("acme", "chat-1"), gate) as references:
        _waits_then_finishes(lambda: reader.delete(references[0]), gate)

    with pytest.raises(ResultNotFoundError):
        reader.read(references[0])
    assert {record.reference for record in reader.list()} == set(references[1:])


def test_a_cancelled_waiter_on_another_loop_leaves_other_waiters_waiting(
    held: tuple[FsspecToolResultStore, threading.Event],
) -> None:
    root, gate = held
    reader = root.for_session("acme", "chat-1")
    with _Uploads(root.for_session("acme", "chat-1"), gate, count=1) as (reference,):
        with pytest.raises(TimeoutError):
            asyncio.run(asyncio.wait_for(reader.read_async(reference), 0.05))
        assert _waits_then_finishes(lambda: reader.read(reference), gate) == "content 0"


async def test_a_sync_call_on_the_uploading_loop_refuses_instead_of_deadlocking(
    held: tuple[FsspecToolResultStore, threading.Event],
) -> None:
    root, gate = held
    session = root.for_session("acme", "chat-1")
    pending = await session.begin_write_async(key="page.txt", content="kept")

    # Blocking here would stop the very loop the upload needs; not waiting would purge too little.
    with pytest.raises(RuntimeError, match="async twin"):
        session.read(pending.reference)
    with pytest.raises(RuntimeError, match="async twin"):
        session.purge()
    # Other sessions have nothing in flight, so nothing to refuse.
    assert root.for_session("acme", "chat-2").list() == []

    gate.set()
    await pending.wait()
    assert session.read(pending.reference) == "kept"
