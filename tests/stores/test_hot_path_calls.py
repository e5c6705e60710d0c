"""
How much of the library's own Python a write and a page run on the default engine: counted, not timed.

The client's CPU per request is timed in benchmarks/client_cpu.py; this counts the library's function calls (and
coroutine resumptions) a write plus a ranged read make, which is exact on any machine, so a change that adds layers to
the hot path shows here first.
"""

import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import haystack_integrations.offload as package
from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.testing.local_s3 import LocalS3Server

PACKAGE = str(Path(package.__file__).parent)
# 62 now. 78 before: a lease counted on the root's client (never let go), a write without a quota asking for an
# allowance, a reference's name parsed into metadata only to be checked, a request's metric record and attributes
# made anew, the scope's directory joined on every call. 94 before that: generator context managers around every
# request, the store's location worked out for every call, retry bookkeeping made before the first attempt, a client
# check on a loop without a time limit.
MOST_CALLS = 62

pytestmark = pytest.mark.s3


async def calls_of_the_library(step: Callable[[], Awaitable[Any]]) -> int:
    """The library's function calls and coroutine resumptions while `step` runs on this thread."""
    counted = 0

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        nonlocal counted
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            counted += 1

    sys.setprofile(profile)
    try:
        await step()
    finally:
        sys.setprofile(None)
    return counted


async def test_a_write_and_a_page_run_few_calls_of_the_library(s3_server: LocalS3Server) -> None:
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options()
    )
    assert root.resolved_engine == "obstore"
    store = root.for_session("acme", "chat-1")
    data = bytes(range(256)) * 200
    await store.read_range_and_size_async(await store.write_async(key="warm-up.bin", content=data), 0, 10)

    async def write_and_page() -> None:
        reference = await store.write_async(key="1_fetch_call.bin", content=data)
        page, size = await store.read_range_and_size_async(reference, 20_000, 30_000)
        assert (page, size) == (data[20_000:30_000], len(data))

    assert await calls_of_the_library(write_and_page) <= MOST_CALLS
