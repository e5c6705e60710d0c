"""
The obstore engine's own edges: choosing it, serializing it, its settings, its error mapping, and what it cannot do.

Its behaviour, hostile-reference, document and request-count suites are the shared ones (``s3-obstore`` in
tests/conftest.py, and test_s3_requests.py); its fault handling is in tests/operations/test_obstore_faults.py.
"""

import asyncio
import json
import re
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from haystack_integrations.offload import (
    FsspecToolResultStore,
    StorageError,
    StoragePermissionError,
)
from haystack_integrations.offload.stores.obstore_io import obstore_settings
from haystack_integrations.offload.testing.local_s3 import LocalS3Server

A_NAME = "20261129T213400123456Z-5f3a9c1e.t.search.k.txt"


# Choosing the engine, and serializing the choice


def test_the_default_engine_is_auto_and_the_choice_round_trips() -> None:
    memory = FsspecToolResultStore("memory://engines")
    assert (memory.engine, memory.resolved_engine) == ("auto", "fsspec")
    store = FsspecToolResultStore("s3://bucket/prefix", engine="obstore").for_session("acme", "chat-1")
    data = json.loads(json.dumps(store.to_dict()))
    assert data["init_parameters"]["engine"] == "obstore"
    restored = FsspecToolResultStore.from_dict(data)
    assert (restored.engine, restored.scope, restored.url) == ("obstore", ("acme", "chat-1"), "s3://bucket/prefix")
    # A store serialized without an engine comes back on the default engine.
    del data["init_parameters"]["engine"]
    assert FsspecToolResultStore.from_dict(data).resolved_engine == "obstore"


def test_an_engine_that_cannot_serve_the_store_is_refused_before_any_io() -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    with pytest.raises(ValueError, match="Unknown engine 'boto'"):
        FsspecToolResultStore("s3://bucket/x", engine="boto")
    with pytest.raises(ValueError, match="s3:// URLs only"):
        FsspecToolResultStore("memory://x", engine="obstore")
    with pytest.raises(ValueError, match="s3:// URLs only"):
        FsspecToolResultStore("/x", filesystem=MemoryFileSystem(), engine="obstore")


def test_storage_options_it_cannot_honour_are_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match=r"version_aware, config_kwargs\['proxies'\] not supported by the obstore"):
        FsspecToolResultStore(
            "s3://bucket/x", storage_options={"version_aware": True, "config_kwargs": {"proxies": {}}}, engine="obstore"
        )
    # s3fs's own caching options mean nothing here and are accepted, so one set of options serves both engines.
    FsspecToolResultStore("s3://bucket/x", storage_options={"use_listings_cache": False}, engine="obstore")


def test_a_missing_obstore_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "obstore", None)  # `import obstore` now fails as if it were not installed
    monkeypatch.delitem(sys.modules, "haystack_integrations.offload.stores.obstore_io")
    with pytest.raises(ImportError, match=r'pip install "offload-haystack\[s3\]"'):
        FsspecToolResultStore("s3://bucket/x", engine="obstore")
    default = FsspecToolResultStore("s3://bucket/x")  # the default engine falls back to s3fs, and says why
    assert (default.engine, default.resolved_engine) == ("auto", "fsspec")
    assert "obstore is not installed" in default.engine_choice.reason


# Settings: the storage_options s3fs takes, translated


def test_s3fs_storage_options_become_obstore_settings() -> None:
    settings = obstore_settings(
        {
            "key": "AKIA",
            "secret": "shh",
            "token": "session",
            "endpoint_url": "http://127.0.0.1:5000",
            "client_kwargs": {"region_name": "eu-west-1"},
            "config_kwargs": {"connect_timeout": 2, "read_timeout": 0.5, "s3": {"addressing_style": "virtual"}},
            "s3_additional_kwargs": {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "key-1"},
        },
        retrying=True,
        attempt_timeout=60.0,
    )
    assert settings.config == {
        "access_key_id": "AKIA",
        "secret_access_key": "shh",
        "session_token": "session",
        "endpoint": "http://127.0.0.1:5000",
        "region": "eu-west-1",
        "virtual_hosted_style_request": True,
        "server_side_encryption": "aws:kms",
        "sse_kms_key_id": "key-1",
    }
    assert settings.client_options == {
        "allow_http": True,
        "connect_timeout": timedelta(seconds=2),
        "read_timeout": timedelta(seconds=0.5),
        "timeout": timedelta(seconds=60),
    }
    assert settings.retry_config == {"max_retries": 0}  # the store's RetryPolicy is the only one retrying


def test_retries_stay_the_backends_without_a_policy_or_when_given() -> None:
    assert obstore_settings({}, retrying=False, attempt_timeout=None).retry_config == {}
    given = {"config_kwargs": {"retries": {"total_max_attempts": 3}}}
    assert obstore_settings(given, retrying=True, attempt_timeout=None).retry_config == {"max_retries": 2}
    legacy = {"config_kwargs": {"retries": {"max_attempts": 1}}}
    assert obstore_settings(legacy, retrying=True, attempt_timeout=None).retry_config == {"max_retries": 1}
    anonymous = obstore_settings({"anon": True, "client_kwargs": {"verify": False}}, retrying=False, attempt_timeout=1)
    assert anonymous.config == {"skip_signature": True}
    assert anonymous.client_options == {"allow_invalid_certificates": True, "timeout": timedelta(seconds=1)}


@pytest.mark.s3
def test_credentials_endpoint_and_region_come_from_the_environment(
    s3_server: LocalS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    store = FsspecToolResultStore(f"{s3_server.bucket_url}/{uuid.uuid4().hex}", engine="obstore")
    session = store.for_session("acme", "chat-1")
    reference = session.write(key="k.txt", content="from the environment")
    direct = FsspecToolResultStore(store.url, storage_options=s3_server.storage_options())  # s3fs sees the same key
    assert direct.for_session("acme", "chat-1").read(reference) == "from the environment"


# Engines interoperate: the same keys, so a deployment can switch engines and keep its data.


@pytest.mark.s3
async def test_both_engines_read_each_others_results_and_documents(s3_server: LocalS3Server) -> None:
    url, options = f"{s3_server.bucket_url}/{uuid.uuid4().hex}", s3_server.storage_options()
    fast = FsspecToolResultStore(url, storage_options=options, engine="obstore").for_session("acme", "chat-1")
    slow = FsspecToolResultStore(url, storage_options=options).for_session("acme", "chat-1")
    by_fast = await fast.write_async(key="a.txt", content="written by obstore")
    by_slow = slow.write(key="b.bin", content=b"\x00written by s3fs")
    assert await slow.read_async(by_fast) == "written by obstore"
    assert fast.read(by_slow) == b"\x00written by s3fs"
    assert {record.reference for record in fast.list()} == {record.reference for record in slow.list()}
    await fast.documents("claims").create_async("call_1", b"worker-a")
    assert slow.documents("claims").get("call_1") == b"worker-a"
    assert await fast.purge_async() == 2
    assert slow.list() == []


@pytest.mark.s3
def test_one_store_serves_many_event_loops_at_once(s3_server: LocalS3Server) -> None:
    # No client per loop is needed: obstore's coroutines complete on whichever loop awaits them.
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options(), engine="obstore"
    )
    failures: list[BaseException] = []

    async def worker(number: int) -> None:
        session = root.for_session("acme", f"chat-{number}")
        references = await asyncio.gather(*(session.write_async(key=f"{i}.txt", content=str(i)) for i in range(8)))
        assert [await session.read_async(reference) for reference in references] == [str(i) for i in range(8)]

    def in_its_own_loop(number: int) -> None:
        try:
            asyncio.run(worker(number))
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=in_its_own_loop, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(root.list()) == 32


# Errors: refusals map to built-in exceptions, per-key delete errors are not swallowed


class _RefusingS3(BaseHTTPRequestHandler):
    """An S3 endpoint that refuses everything with 403, and whose DeleteObjects refuses each key it is sent."""

    # Set to name a key that was never sent instead (an S3-compatible server answering wrongly).
    wrong_key = False
    # The paths of the single-object DELETEs it was sent.
    single_deletes: ClassVar[list[str]] = []

    def _answer(self) -> None:
        request = self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.command == "DELETE":
            self.single_deletes.append(self.path)
        status, body = 403, b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
        if self.command == "POST":
            keys = re.findall(rb"<Key>(.*?)</Key>", request)
            if self.wrong_key:
                keys = [b"not-asked-for"]
            errors = b"".join(
                b"<Error><Key>%s</Key><Code>AccessDenied</Code><Message>no</Message></Error>" % key for key in keys
            )
            status, body = 200, b"<DeleteResult>" + errors + b"</DeleteResult>"
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

    def log_message(self, *args: Any) -> None:
        pass


class _WrongKeyS3(_RefusingS3):
    wrong_key = True


def _serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[dict[str, Any]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {
            "endpoint_url": f"http://127.0.0.1:{server.server_port}",
            "key": "k",
            "secret": "s",
            "client_kwargs": {"region_name": "us-east-1"},
        }
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def refusing_endpoint() -> Iterator[dict[str, Any]]:
    """Storage options pointing at an endpoint that refuses everything."""
    yield from _serve(_RefusingS3)


@pytest.fixture
def wrong_key_endpoint() -> Iterator[dict[str, Any]]:
    """Storage options pointing at an endpoint whose DeleteObjects answers name a key that was never sent."""
    yield from _serve(_WrongKeyS3)


async def test_refusals_are_permission_errors_everywhere(refusing_endpoint: dict[str, Any]) -> None:
    store = FsspecToolResultStore("s3://bucket/p", storage_options=refusing_endpoint, engine="obstore")
    session = store.for_session("acme", "chat-1")
    for call in (
        lambda: session.write(key="k.txt", content="x"),
        lambda: session.read(A_NAME),
        lambda: session.read_range_and_size(A_NAME, 0, 10),
        lambda: session.info(A_NAME),
        session.list,
        lambda: session.documents("claims").create("call_1", b"x"),
        lambda: session.delete(A_NAME),  # a 200 whose DeleteObjects answer refuses the key
    ):
        with pytest.raises(StoragePermissionError) as caught:
            call()
        assert isinstance(caught.value.__cause__, PermissionError)
        assert "bucket" not in str(caught.value)
    with pytest.raises(StoragePermissionError):
        await session.write_async(key="k.txt", content="x")
    with pytest.raises(StoragePermissionError):
        await session.purge_async()
    assert store.retry_stats.as_dict()["retries"] == 0  # refusals are not retried


async def test_an_answer_the_client_cannot_handle_is_a_storage_error(wrong_key_endpoint: dict[str, Any]) -> None:
    # object_store panics on it; the panic must not cross the store as a BaseException.
    session = FsspecToolResultStore(
        "s3://bucket/p", storage_options=wrong_key_endpoint, engine="obstore", retry=None
    ).for_session("acme", "chat-1")
    with pytest.raises(StorageError) as caught:
        session.delete(A_NAME)
    cause = caught.value.__cause__  # our OSError, itself chained to the panic
    assert isinstance(cause, OSError) and type(cause.__cause__).__name__ in {"PanicException", "RustPanic"}
    with pytest.raises(StorageError) as caught:
        await session.delete_async(A_NAME)
    assert isinstance(caught.value.__cause__, OSError)


@pytest.mark.parametrize("engine", ["obstore", "fsspec"])
def test_a_refused_batch_delete_is_tried_key_by_key_and_never_for_a_key_not_asked(
    refusing_endpoint: dict[str, Any], wrong_key_endpoint: dict[str, Any], engine: str
) -> None:
    # RGW and moto refuse DeleteObjects to a principal allowed only below its prefix: each key gets its own DELETE.
    _RefusingS3.single_deletes.clear()
    session = FsspecToolResultStore("s3://bucket/p", storage_options=refusing_endpoint, engine=engine, retry=None)
    with pytest.raises(StoragePermissionError):
        session.for_session("acme", "chat-1").delete(A_NAME)
    assert [path.rsplit("/", 1)[-1] for path in _RefusingS3.single_deletes] == [A_NAME]
    # A refusal naming a key that was never asked for is a wrong answer: nothing is deleted one by one.
    _RefusingS3.single_deletes.clear()
    wrong = FsspecToolResultStore("s3://bucket/p", storage_options=wrong_key_endpoint, engine="fsspec", retry=None)
    with pytest.raises(StoragePermissionError):
        wrong.for_session("acme", "chat-1").delete(A_NAME)
    assert _RefusingS3.single_deletes == []


# What obstore cannot do


@pytest.mark.s3
@pytest.mark.parametrize("segment", [".", ""])
async def test_a_key_object_store_cannot_parse_does_not_block_listing_or_purge(
    s3_server: LocalS3Server, segment: str
) -> None:
    # object_store fails a whole listing on a key with a "." or empty segment; s3fs lists and deletes it for obstore.
    prefix = uuid.uuid4().hex
    root = FsspecToolResultStore(f"{s3_server.bucket_url}/{prefix}", storage_options=s3_server.storage_options())
    assert root.resolved_engine == "obstore"  # the default
    session = root.for_session("acme", "chat-1")
    reference = session.write(key="k.txt", content="x")
    old = session.write(key="old.txt", content="x")
    planted = f"{prefix}/acme/chat-1/{segment}/{old}"  # a result's name, below a segment object_store refuses
    s3_server.client().put_object(Bucket=s3_server.bucket, Key=planted, Body=b"x")
    assert {record.reference for record in await session.list_async()} == {reference, old}
    assert await session.purge_async() == 2
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=prefix)
    assert [entry["Key"] for entry in listed.get("Contents", [])] == [planted]  # not a result of this scope: kept
