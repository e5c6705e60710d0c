"""
Writes to an S3 endpoint that accepts connections and never answers end at the client's read timeout, on both engines.

aiobotocore sent ``Expect: 100-continue`` with every PUT and aiohttp's read timeout only starts once the body is sent,
which it waits to send until "100 Continue" arrives: on a silent endpoint a write waited until the retry policy's
attempt limit (60 s by default) cancelled it, and ``doctor``'s first check with it (63 s on the s3fs engine).
Counted in attempts and connections, not in wall time (a busy machine makes any call slower): the policy's deadline
lies between the chosen read timeout and the attempt limit, so a read timeout that bounds the write leaves room for
every attempt, and one that does not leaves one.
"""

import asyncio

import pytest

from haystack_integrations.offload import FsspecToolResultStore, RetryPolicy, StorageUnavailableError
from haystack_integrations.offload.operations.conformance import run_conformance
from haystack_integrations.offload.stores.options import DEFAULT_READ_TIMEOUT, with_timeouts
from support.silent_endpoint import SilentEndpoint

ENGINES = ["fsspec", "obstore"]
CREDENTIALS = {"key": "k", "secret": "s", "client_kwargs": {"region_name": "us-east-1"}}
# Three attempts of 0.5 s fit well inside the deadline; one attempt cancelled at the attempt limit runs past it.
POLICY = RetryPolicy(
    attempts=3,
    base_delay=0,
    max_delay=0,
    deadline=DEFAULT_READ_TIMEOUT - 5,
    attempt_timeout=DEFAULT_READ_TIMEOUT + 5,
)
# The client's own read timeout (for s3fs, botocore's); a cancellation by the policy's attempt limit says "timeout".
READ_TIMEOUT_CAUSE = {"fsspec": "read timeout", "obstore": "timeout"}


def _store(silent: SilentEndpoint, engine: str) -> FsspecToolResultStore:
    options = with_timeouts(CREDENTIALS, read_timeout=0.5, connect_timeout=2)
    return FsspecToolResultStore(
        "s3://bucket/prod", storage_options={**options, "endpoint_url": silent.url}, engine=engine, retry=POLICY
    )


@pytest.mark.parametrize("size", [5, 256 * 1024])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_write_to_a_silent_endpoint_ends_at_the_read_timeout(engine: str, size: int) -> None:
    with SilentEndpoint() as silent:
        store = _store(silent, engine).for_session("acme", "chat-1")
        with pytest.raises(StorageUnavailableError, match="3 attempt") as raised:
            store.write(key="result.txt", content="x" * size)
        connections = silent.wait_for_connections(3)
    # One silent connection per attempt, each ended by the read timeout, dropped, none reused.
    assert raised.value.causes == (READ_TIMEOUT_CAUSE[engine],) * 3
    assert connections == 3


@pytest.mark.parametrize("engine", ENGINES)
def test_an_async_write_to_a_silent_endpoint_ends_at_the_read_timeout(engine: str) -> None:
    # The caller's own loop has a client of its own (s3fs: made per loop on the store's shared session).
    with SilentEndpoint() as silent:
        store = _store(silent, engine).for_session("acme", "chat-1")
        with pytest.raises(StorageUnavailableError, match="3 attempt") as raised:
            asyncio.run(store.write_async(key="result.txt", content="x"))
        connections = silent.wait_for_connections(3)
    assert raised.value.causes == (READ_TIMEOUT_CAUSE[engine],) * 3
    assert connections == 3


@pytest.mark.parametrize("engine", ENGINES)
def test_doctors_first_check_on_a_silent_endpoint_is_unreachable_after_each_attempts_read_timeout(engine: str) -> None:
    # The exclusive-create probe is a conditional PUT: each attempt ends at the read timeout, so all three are sent
    # before the deadline; the run stops there and says the store could not be reached.
    with SilentEndpoint() as silent:
        report = run_conformance(_store(silent, engine))
        connections = silent.wait_for_connections(3)
    first, *later = report.checks
    assert (first.name, first.verdict) == ("exclusive-create", "unknown"), first
    assert connections == 3
    assert later and all(check.verdict == "skipped" for check in later)
    unreachable = f"exclusive-create could not reach the store ({READ_TIMEOUT_CAUSE[engine]})"
    assert all(unreachable in check.detail for check in later), later
