"""
What can only be a mistake is refused when it is made, with a message that says what was meant: URLs typed as local
paths, times to live and ages no date can hold. And expiry survives writers whose clocks are off, by the documented
rule (`Retention.expired`, docs/operations.md): up to `clock_skew` either way costs nothing, and no clock far ahead
keeps a result for ever.
"""

import http.server
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore, ResultExpiredError, Retention, StoragePermissionError
from haystack_integrations.offload.stores.names import new_object_name

if TYPE_CHECKING:
    from haystack_integrations.offload.testing.local_s3 import LocalS3Server

# Typed local paths and the URL each one meant.
TYPOS = [
    ("s3:/bucket/prod", "s3://bucket/prod"),
    ("s3//bucket/prod", "s3://bucket/prod"),
    ("s3:bucket/prod", "s3://bucket/prod"),
    ("S3:/bucket/prod", "s3://bucket/prod"),
    ("s3a:/bucket", "s3a://bucket"),
    ("gs:/bucket/prod", "gs://bucket/prod"),
    ("gcs//bucket", "gcs://bucket"),
    ("memory:/agent-results", "memory://agent-results"),
    ("az:container/x", "az://container/x"),
]


@pytest.mark.parametrize(("typed", "meant"), TYPOS)
def test_a_url_typed_as_a_local_path_is_refused_naming_what_was_meant(
    typed: str, meant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="no protocol") as caught:
        FsspecToolResultStore(typed)
    assert repr(meant) in str(caught.value)
    assert f"'./{typed}'" in str(caught.value)  # and how to say "a local directory" if that was really meant
    with pytest.raises(ValueError, match="Did you mean"):
        FsspecToolResultStore.from_dict(
            {
                "type": "haystack_integrations.offload.stores.fsspec_store.FsspecToolResultStore",
                "init_parameters": {"url": typed},
            }
        )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("path", ["./s3:/bucket", "results", "data/s3", "file:{tmp}/results", "{tmp}/s3:/x"])
def test_local_paths_that_say_so_are_accepted(path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    session = FsspecToolResultStore(path.format(tmp=tmp_path)).for_session("acme", "chat-1")
    assert session.read(session.write(key="k.txt", content="ok")) == "ok"


def test_a_store_on_a_filesystem_object_takes_its_path_as_given() -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    session = FsspecToolResultStore("s3:/odd-but-explicit", filesystem=MemoryFileSystem()).for_session("a", "b")
    assert session.read(session.write(key="k.txt", content="ok")) == "ok"


@pytest.mark.parametrize(
    "make",
    [
        lambda: Retention(ttl=timedelta(days=999_999_999)),
        lambda: Retention(ttl=timedelta(days=3_000_000)),
        lambda: Retention(tenants={"acme": timedelta(days=999_999_999)}),
        lambda: Retention(ttl=timedelta(days=1), clock_skew=timedelta(days=999_999_999)),
    ],
)
def test_times_no_date_can_hold_are_refused_when_given(make: Any) -> None:
    with pytest.raises(ValueError, match=r"beyond what dates can hold|clock_skew must be"):
        make()


def test_the_clock_skew_allowance_is_configurable_and_never_negative() -> None:
    assert Retention(ttl=timedelta(days=1)).clock_skew == timedelta(minutes=5)
    assert Retention(ttl=timedelta(days=1), clock_skew=timedelta(0)).clock_skew == timedelta(0)
    with pytest.raises(ValueError, match="clock_skew must be between"):
        Retention(ttl=timedelta(days=1), clock_skew=timedelta(seconds=-1))


def test_the_longest_time_to_live_reads_lists_and_purges_without_overflow() -> None:
    store = FsspecToolResultStore("memory://longest", retention=Retention(ttl=timedelta(days=36_500)))
    session = store.for_session("acme", "chat-1")
    reference = session.write(key="k.txt", content="kept")
    assert session.read(reference) == "kept"
    assert [record.reference for record in session.list()] == [reference]
    assert store.purge(expired=True) == 0
    assert store.purge(older_than=timedelta(days=36_500)) == 0


async def test_a_purge_age_no_date_can_hold_is_refused_before_anything_is_listed() -> None:
    store = FsspecToolResultStore("memory://ages")
    for age in (timedelta(days=999_999_999), timedelta(days=800_000)):
        with pytest.raises(ValueError, match=r"older_than .* beyond what dates can hold"):
            store.purge(older_than=age)
        with pytest.raises(ValueError, match=r"older_than .* beyond what dates can hold"):
            await store.purge_async(older_than=age)


# Writers' clocks


def _written_by(store: FsspecToolResultStore, *, clock_off_by: timedelta, written_ago: timedelta = timedelta(0)) -> str:
    """A result as a writer whose clock is `clock_off_by` off (negative: slow) stored it `written_ago`."""
    stamp = datetime.now(UTC) - written_ago + clock_off_by
    name = new_object_name(key="k.txt", kind="text", tool_name="search", now=stamp)
    fs = store._handle.io().fs
    fs.makedirs(store._scope_path(), exist_ok=True)
    fs.pipe_file(f"{store._scope_path()}/{name}", b"written")
    return name


def _session(backend: tuple[str, dict[str, Any]], retention: Retention) -> FsspecToolResultStore:
    url, storage_options = backend
    return FsspecToolResultStore(
        url, storage_options=storage_options, retention=retention, **backend.store_kwargs
    ).for_session("acme", "c")


HOUR = Retention(ttl=timedelta(hours=1))


def test_a_writer_minutes_slow_loses_nothing(backend: tuple[str, dict[str, Any]]) -> None:
    session = _session(backend, HOUR)
    # Written 58 minutes ago by a writer 4 minutes slow: its name says 62 minutes.
    reference = _written_by(session, clock_off_by=-timedelta(minutes=4), written_ago=timedelta(minutes=58))
    assert session.read(reference) == "written"
    assert [record.reference for record in session.list()] == [reference]
    assert session.purge(expired=True) == 0  # purges judge by the same rule as reads
    assert session.read(reference) == "written"


@pytest.mark.parametrize("off_by", [-timedelta(hours=2), timedelta(hours=2), timedelta(days=365)])
def test_a_writer_hours_or_a_year_off_loses_no_fresh_result(
    backend: tuple[str, dict[str, Any]], off_by: timedelta
) -> None:
    # Its name says expired (or stamped far ahead); the storage's clock says written just now, and decides.
    url, storage_options = backend
    root = FsspecToolResultStore(url, storage_options=storage_options, retention=HOUR, **backend.store_kwargs)
    session = root.for_session("acme", "c")
    reference = _written_by(session, clock_off_by=off_by)
    assert session.read(reference) == "written"
    assert session.read_range_and_size(reference, 0, 4) == (b"writ", 7)
    assert root.purge(expired=True) == 0 and root.purge(older_than=timedelta(minutes=30)) == 0
    assert session.read(reference) == "written"


@pytest.mark.slow  # waits out a time to live
def test_a_writer_far_ahead_cannot_keep_its_results_for_ever(backend: tuple[str, dict[str, Any]]) -> None:
    url, storage_options = backend
    brief = Retention(ttl=timedelta(seconds=2), clock_skew=timedelta(seconds=1))
    root = FsspecToolResultStore(url, storage_options=storage_options, retention=brief, **backend.store_kwargs)
    session = root.for_session("acme", "c")
    far_ahead = _written_by(session, clock_off_by=timedelta(days=3650))
    time.sleep(3.2)  # past the time to live and skew, by the storage's clock
    fine = _written_by(session, clock_off_by=timedelta(0))
    with pytest.raises(ResultExpiredError, match="the storage says"):
        session.read(far_ahead)
    assert root.purge(expired=True) == 1
    assert session.read(fine) == "written"


def test_a_tenant_kept_for_ever_keeps_even_odd_clocks_results() -> None:
    store = FsspecToolResultStore("memory://kept", retention=Retention(ttl=timedelta(hours=1), tenants={"acme": None}))
    session = store.for_session("acme", "c")
    reference = _written_by(session, clock_off_by=timedelta(days=3650))
    assert session.read(reference) == "written"


_NO_URL = r"must be an http:// or https:// URL"
_NO_REGION = r"is not a region name \(such as eu-west-1\)"


@pytest.mark.parametrize(
    ("storage_options", "environment", "named", "refusal"),
    [
        ({"endpoint_url": "127.0.0.1:39975"}, {}, "storage_options['endpoint_url']", _NO_URL),
        (
            {"client_kwargs": {"endpoint_url": "localhost:9000"}},
            {},
            "storage_options['client_kwargs']['endpoint_url']",
            _NO_URL,
        ),
        ({"endpoint_url": "ftp://host"}, {}, "storage_options['endpoint_url']", _NO_URL),
        ({}, {"AWS_ENDPOINT_URL": "127.0.0.1:39975"}, "AWS_ENDPOINT_URL", _NO_URL),
        ({}, {"AWS_ENDPOINT_URL_S3": "minio:9000", "AWS_ENDPOINT_URL": "http://ok:1"}, "AWS_ENDPOINT_URL_S3", _NO_URL),
        (
            {"client_kwargs": {"region_name": "eu west 1"}},
            {},
            "storage_options['client_kwargs']['region_name']",
            _NO_REGION,
        ),
        ({}, {"AWS_REGION": "bad region"}, "AWS_REGION", _NO_REGION),
        ({}, {"AWS_DEFAULT_REGION": "eu_west_1"}, "AWS_DEFAULT_REGION", _NO_REGION),
    ],
)
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_a_bad_s3_endpoint_or_region_is_refused_in_one_line_at_construction(
    storage_options: dict[str, object],
    environment: dict[str, str],
    named: str,
    refusal: str,
    engine: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=refusal) as refused:
        FsspecToolResultStore("s3://bucket/prod", storage_options=storage_options, engine=engine)
    assert str(refused.value).startswith(named) and "\n" not in str(refused.value)


def test_a_region_in_the_options_wins_over_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_REGION", "not a region")  # not used: the options name the region
    FsspecToolResultStore("s3://bucket/prod", storage_options={"client_kwargs": {"region_name": "eu-west-1"}})


def test_an_endpoint_given_in_the_options_is_the_one_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "not-a-url")  # not used: the options name the endpoint
    FsspecToolResultStore("s3://bucket/prod", storage_options={"endpoint_url": "http://127.0.0.1:9000"})


class _NoRole(http.server.BaseHTTPRequestHandler):
    """A metadata service with no role for this machine: every question is answered 404."""

    def _answer(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_PUT = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def no_credentials_anywhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No keys in the environment, no profile or config file, and a metadata service that has no role."""
    for name in list(os.environ):
        if name.startswith(("AWS_ACCESS", "AWS_SECRET", "AWS_SESSION", "AWS_PROFILE", "AWS_CONTAINER", "AWS_WEB")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # botocore (s3fs) asks no metadata service
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoRole)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")  # object_store's
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.s3
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_no_credentials_at_all_is_told_apart_from_refused_ones(
    engine: str, s3_server: "LocalS3Server", no_credentials_anywhere: None
) -> None:
    options = {"endpoint_url": s3_server.endpoint_url, "client_kwargs": {"region_name": "us-east-1"}}
    store = FsspecToolResultStore(f"{s3_server.bucket_url}/prod", storage_options=options, engine=engine)
    with pytest.raises(StoragePermissionError, match=r"no credentials found \(none in the storage options") as found:
        store.for_session("acme", "chat-1").list()
    assert "permission denied" not in str(found.value)


@pytest.mark.parametrize(
    ("url", "meant"),
    [("s3://bucket//prod", "bucket/prod"), ("s3://bucket/prod//acme", "bucket/prod/acme"), ("s3a://b//p", "b/p")],
)
def test_an_object_store_url_with_an_empty_path_segment_is_refused(url: str, meant: str) -> None:
    options = {"endpoint_url": "http://127.0.0.1:9"}  # never asked: the URL is refused before any client is made
    with pytest.raises(ValueError, match=r"has an empty path segment \('//'\); did you mean") as refused:
        FsspecToolResultStore(url, storage_options=options)
    assert repr(meant) in str(refused.value)


def test_a_trailing_slash_is_no_empty_segment() -> None:
    FsspecToolResultStore("s3://bucket/prod/", storage_options={"endpoint_url": "http://127.0.0.1:9"})
