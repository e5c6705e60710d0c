"""
A store's S3 timeouts and the store its errors name: a silent endpoint answers within the default read timeout (not
botocore's minute), the timeouts are settings, and every storage error says which bucket at which endpoint.
"""

import socket
import time
import uuid

import pytest

from haystack_integrations.offload import FsspecToolResultStore, RetryPolicy, StorageError, StorageUnavailableError
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.stores.options import DEFAULT_READ_TIMEOUT, with_timeouts
from haystack_integrations.offload.testing.local_s3 import LocalS3Server
from support.silent_endpoint import SilentEndpoint

ENGINES = ["fsspec", "obstore"]
CREDENTIALS = {"key": "k", "secret": "s", "client_kwargs": {"region_name": "us-east-1"}}


def _refused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # bound, never listening: a connection there is refused


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_a_silent_endpoint_gives_up_within_the_default_read_timeout(engine: str) -> None:
    # One attempt: what it costs is the client's own timeout (botocore's and obstore's were 60 s, the same as
    # the retry policy's attempt limit).
    with SilentEndpoint() as silent:
        store = FsspecToolResultStore(
            "s3://bucket/prod",
            storage_options={**CREDENTIALS, "endpoint_url": silent.url},
            engine=engine,
            retry=RetryPolicy(attempts=1),
        )
        started = time.monotonic()
        with pytest.raises(StorageUnavailableError) as raised:
            store.list()
        elapsed = time.monotonic() - started
    assert silent.accepted, "the client connected, and got no answer"
    # The client's own timeout ended the attempt, not the policy's 60 s attempt limit (which says "timeout"; obstore's
    # are both "timeout"). A busy machine only adds time: a floor is exact, and the ceiling lies between the default
    # and the old minute, 20 s above the default, where load does not reach.
    assert raised.value.causes == ({"fsspec": "read timeout", "obstore": "timeout"}[engine],)
    assert DEFAULT_READ_TIMEOUT - 1 < elapsed < 2 * DEFAULT_READ_TIMEOUT + 5, elapsed
    assert raised.value.location == f"s3://bucket at {silent.url}"


@pytest.mark.parametrize("engine", ENGINES)
def test_the_read_timeout_is_a_setting(engine: str) -> None:
    # Counted in attempts, not in wall time (a busy machine makes any call slower): the retry policy starts no new
    # attempt past its deadline, which lies between the chosen read timeout and the default one. Honoured, the 0.5 s
    # setting leaves room for all three attempts; ignored, the first attempt alone waits out the default (15 s, or the
    # policy's attempt limit above it) and the policy gives up after one.
    options = with_timeouts(CREDENTIALS, read_timeout=0.5, connect_timeout=2)
    policy = RetryPolicy(
        attempts=3,
        base_delay=0,
        max_delay=0,
        deadline=DEFAULT_READ_TIMEOUT - 5,
        attempt_timeout=DEFAULT_READ_TIMEOUT + 5,
    )
    with SilentEndpoint() as silent:
        store = FsspecToolResultStore(
            "s3://bucket/prod", storage_options={**options, "endpoint_url": silent.url}, engine=engine, retry=policy
        )
        with pytest.raises(StorageUnavailableError, match="3 attempt") as raised:
            store.list()
        connections = silent.wait_for_connections(3)
    # The client's own read timeout ended each attempt (for s3fs, botocore's; a cancellation by the policy's attempt
    # limit would say "timeout"): one silent connection per attempt, dropped, none reused.
    cause = {"fsspec": "read timeout", "obstore": "timeout"}[engine]
    assert raised.value.causes == (cause,) * 3
    assert store.retry_stats.as_dict() == {"retries": 2, "recovered": 0, "gave_up": 1, "causes": {cause: 3}}
    assert connections == 3


@pytest.mark.parametrize("engine", ENGINES)
def test_an_unanswered_exclusive_create_check_sends_no_clean_up(engine: str) -> None:
    # Doctor's and serve's first check on a store that never answers: the probe's one attempt, and no delete after it
    # to wait out a second timeout (counted in connections: each timed-out one is dropped, none reused).
    options = with_timeouts(CREDENTIALS, read_timeout=0.5, connect_timeout=2)
    with SilentEndpoint() as silent:
        store = FsspecToolResultStore(
            "s3://bucket/prod",
            storage_options={**options, "endpoint_url": silent.url},
            engine=engine,
            # s3fs's PUT waits for "100 Continue" past the read timeout: the attempt limit ends it there.
            retry=RetryPolicy(attempts=1, attempt_timeout=3),
        )
        check = store.check_exclusive_creates()
        connections = silent.wait_for_connections(2, patience=3)
    assert check.verdict == "unknown" and not check.reached
    assert connections == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_refused_connection_names_the_bucket_and_endpoint_without_credentials(engine: str) -> None:
    port = _refused_port()
    store = FsspecToolResultStore(
        "s3://bucket/prod",
        storage_options={**CREDENTIALS, "endpoint_url": f"http://user:password@127.0.0.1:{port}"},
        engine=engine,
        retry=RetryPolicy(attempts=2, base_delay=0, max_delay=0),
    )
    with pytest.raises(StorageUnavailableError) as raised:
        store.for_session("acme", "s1").list()
    assert raised.value.location == f"s3://bucket at http://***:***@127.0.0.1:{port}"
    assert "127.0.0.1" not in str(raised.value), "the message a model may see names no endpoint"


@pytest.mark.s3
@pytest.mark.parametrize("engine", ENGINES)
def test_a_missing_bucket_names_itself_and_the_endpoint(s3_server: LocalS3Server, engine: str) -> None:
    bucket = f"missing-{uuid.uuid4().hex[:8]}"
    store = FsspecToolResultStore(f"s3://{bucket}/prod", storage_options=s3_server.storage_options(), engine=engine)
    with pytest.raises(StorageError) as raised:
        store.for_session("acme", "s1").write(key="call-1", content="text")
    assert raised.value.location == f"s3://{bucket} at {s3_server.endpoint_url}"


def test_the_commands_name_the_store_a_storage_error_came_from(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    port = _refused_port()
    code = main(["ls", "s3://bucket/prod", "--endpoint-url", f"http://127.0.0.1:{port}", "--region", "us-east-1"])
    error = capsys.readouterr().err
    assert code == 2
    assert error.strip().endswith(f"Store: s3://bucket at http://127.0.0.1:{port}."), error
