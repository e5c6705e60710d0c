"""
Async S3 calls run on the caller's own loop with a client of that loop's own, closed when the loop shuts down.

`LoopLocal` is shown with plain values first (what is made, and when it is closed), then the store on moto's server:
every loop gets a working client, none leaks an unclosed aiohttp session, and sync calls keep using fsspec's loop.
"""

import asyncio
import gc
import threading
import uuid
import warnings

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores.loop_local import LoopLocal
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog


class Recorder:
    def __init__(self) -> None:
        self.made: list[asyncio.AbstractEventLoop] = []
        self.closed: list[tuple[str, asyncio.AbstractEventLoop]] = []

    def make(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        self.made.append(loop)
        return loop

    async def close(self, value: asyncio.AbstractEventLoop) -> None:
        assert value is asyncio.get_running_loop()  # closed on its own loop, while it still runs
        self.closed.append(("on its loop", value))

    def close_now(self, value: asyncio.AbstractEventLoop, loop: asyncio.AbstractEventLoop) -> None:
        self.closed.append(("now", value))


def test_one_value_per_loop_closed_as_the_loop_shuts_down() -> None:
    recorder = Recorder()
    per_loop = LoopLocal(recorder.make, recorder.close, recorder.close_now)

    async def use() -> asyncio.AbstractEventLoop:
        first, second = await per_loop.get(), await per_loop.get()
        assert first is second is asyncio.get_running_loop()
        return first

    loops = [asyncio.run(use()), asyncio.run(use())]
    assert recorder.made == loops
    assert recorder.closed == [("on its loop", loops[0]), ("on its loop", loops[1])]
    assert len(per_loop) == 0


def test_a_loop_closed_by_hand_is_cleaned_up_on_the_next_use() -> None:
    recorder = Recorder()
    per_loop = LoopLocal(recorder.make, recorder.close, recorder.close_now)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(per_loop.get())
    loop.close()  # no shutdown_asyncgens: the value is left behind
    assert recorder.closed == []

    asyncio.run(per_loop.get())
    assert recorder.closed[0] == ("now", loop)
    per_loop.close_all_now()
    assert len(per_loop) == 0


def test_threads_with_loops_of_their_own_each_get_their_own() -> None:
    recorder = Recorder()
    per_loop = LoopLocal(recorder.make, recorder.close, recorder.close_now)
    barrier = threading.Barrier(4)

    def worker() -> None:
        async def use() -> None:
            await per_loop.get()
            barrier.wait(timeout=10)  # all four loops alive at once

        asyncio.run(use())

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(set(map(id, recorder.made))) == 4
    assert sorted(kind for kind, _ in recorder.closed) == ["on its loop"] * 4


@pytest.mark.s3
@pytest.mark.slow
def test_each_run_writes_on_its_own_loop_and_leaves_no_session_open(
    s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options()
    )
    session = store.for_session("acme", "chat-1")

    async def write(text: str) -> str:
        return await session.write_async(key="page.txt", content=text)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unclosed aiohttp session warns when collected
        references = [asyncio.run(write(f"run {i}")) for i in range(3)]
        gc.collect()

    # Sync calls still go through fsspec's own loop, beside the runs' clients.
    assert [session.read(reference) for reference in references] == ["run 0", "run 1", "run 2"]
    assert s3_requests.count(method="PUT") == 3


@pytest.mark.s3
def test_concurrent_loops_in_threads_share_one_store(s3_server: LocalS3Server) -> None:
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options()
    )
    written: dict[int, list[str]] = {}

    def worker(number: int) -> None:
        async def run() -> list[str]:
            session = store.for_session("acme", f"chat-{number}")
            references = await asyncio.gather(
                *(session.write_async(key=f"{i}.txt", content=f"{number}/{i}") for i in range(5))
            )
            assert [await session.read_async(reference) for reference in references] == [
                f"{number}/{i}" for i in range(5)
            ]
            return list(references)

        written[number] = asyncio.run(run())

    threads = [threading.Thread(target=worker, args=(number,)) for number in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(written) == [0, 1, 2]
    for number, references in written.items():
        session = store.for_session("acme", f"chat-{number}")
        assert sorted(record.reference for record in session.list()) == sorted(references)
