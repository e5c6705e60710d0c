"""to_dict / from_dict round trips, with credentials never serialized in clear."""

import json
from typing import Any

import pytest
from haystack.core.errors import SerializationError
from haystack.utils import Secret

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores.options import redacted_url
from haystack_integrations.offload.testing.local_s3 import LocalS3Server

pytestmark = pytest.mark.engines  # also on the obstore engine (tests/conftest.py)


def test_round_trip_keeps_url_options_and_scope(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url, storage_options = backend
    options = dict(storage_options)
    for name in ("key", "secret"):
        if name in options:  # S3: move the credentials into the environment, as a deployment would
            monkeypatch.setenv(f"OFFLOAD_TEST_{name.upper()}", options[name])
            options[name] = Secret.from_env_var(f"OFFLOAD_TEST_{name.upper()}")
    store = FsspecToolResultStore(url, storage_options=options, **backend.store_kwargs)
    session = store.for_session("acme", "chat-1")
    reference = session.write(key="k.txt", content="survives serialization")
    serialized = json.dumps(session.to_dict())
    restored = FsspecToolResultStore.from_dict(json.loads(serialized))
    assert restored.scope == ("acme", "chat-1")
    assert json.loads(json.dumps(restored.to_dict())) == json.loads(serialized)  # the engine included
    assert restored.read(reference) == "survives serialization"
    assert FsspecToolResultStore.from_dict(store.to_dict()).scope == ()


def test_plain_text_credentials_refuse_to_serialize() -> None:
    store = FsspecToolResultStore("s3://bucket/x", storage_options={"key": "AKIA...", "secret": "shh"})
    with pytest.raises(SerializationError, match=r"Secret\.from_env_var"):
        store.to_dict()
    nested = FsspecToolResultStore("s3://bucket/x", storage_options={"client_kwargs": {"aws_secret_access_key": "shh"}})
    with pytest.raises(SerializationError, match="aws_secret_access_key"):
        nested.to_dict()


@pytest.mark.s3
def test_secrets_serialize_as_env_references_and_resolve_on_use(
    s3_server: LocalS3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OFFLOAD_TEST_KEY", "testing")
    monkeypatch.setenv("OFFLOAD_TEST_SECRET", "testing")
    options = {
        **s3_server.storage_options(),
        "key": Secret.from_env_var("OFFLOAD_TEST_KEY"),
        "secret": Secret.from_env_var("OFFLOAD_TEST_SECRET"),
    }
    store = FsspecToolResultStore(f"{s3_server.bucket_url}/secrets", storage_options=options)
    serialized = json.dumps(store.for_session("acme", "chat-1").to_dict())
    assert "testing" not in serialized.replace("OFFLOAD_TEST", "")
    restored = FsspecToolResultStore.from_dict(json.loads(serialized))
    assert isinstance(restored.storage_options["secret"], Secret)
    reference = restored.write(key="k.txt", content="through resolved secrets")
    assert store.for_session("acme", "chat-1").read(reference) == "through resolved secrets"


def test_a_store_built_on_a_filesystem_object_does_not_serialize() -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    store = FsspecToolResultStore("/x", filesystem=MemoryFileSystem())
    with pytest.raises(SerializationError, match="filesystem object"):
        store.to_dict()


def test_repr_shows_url_and_scope_but_no_options() -> None:
    store = FsspecToolResultStore("s3://bucket/x", storage_options={"secret": "shh"}).for_session("acme", "c")
    assert repr(store) == "FsspecToolResultStore('s3://bucket/x', scope='acme/c')"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("s3://AKID:SECRET@bucket/prod", "s3://***:***@bucket/prod"),
        ("s3://TOKEN@bucket/prod", "s3://***@bucket/prod"),
        ("s3://bucket/prod?secret=SECRET&region=eu", "s3://bucket/prod?secret=***&region=eu"),
        (
            "s3://b/p?X-Amz-Signature=SECRET&X-Amz-Credential=AKID%2F1",
            "s3://b/p?X-Amz-Signature=***&X-Amz-Credential=***",
        ),
        ("s3://bucket/prod", "s3://bucket/prod"),
        ("/srv/results", "/srv/results"),
    ],
)
def test_a_store_url_is_shown_without_its_credentials(url: str, shown: str) -> None:
    assert redacted_url(url) == shown
    if url.startswith("s3://AKID"):
        assert "SECRET" not in repr(FsspecToolResultStore(url.replace("s3://", "memory://")))
