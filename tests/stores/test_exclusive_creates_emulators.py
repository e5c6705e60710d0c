"""
Exclusive creates on the cloud emulators' lane (Azurite on both engines, fake-gcs-server): what
test_exclusive_creates.py checks on S3 with boto3, seen here through each cloud's own fsspec filesystem; and
references naming another container, bucket or cloud refused. Deselected unless ``OFFLOAD_TEST_EMULATORS`` names them.
"""

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import fsspec
import pytest

from haystack_integrations.offload import (
    DocumentExistsError,
    FsspecToolResultStore,
    InvalidReferenceError,
    end_session,
)
from haystack_integrations.offload.stores.names import new_temporary_name
from support.emulators import BACKENDS

pytestmark = pytest.mark.parametrize(
    "backend",
    [pytest.param(backend, marks=pytest.mark.emulators) for ids in BACKENDS.values() for backend in ids],
    indirect=True,
)


@pytest.fixture
def root(backend: Any) -> FsspecToolResultStore:
    url, storage_options = backend
    return FsspecToolResultStore(url, storage_options=storage_options, **backend.store_kwargs)


def _filesystem(root: FsspecToolResultStore) -> Any:
    """The cloud's own fsspec filesystem (adlfs, gcsfs), uncached: it sees what the store wrote, whatever its engine."""
    protocol = root.url.split("://", 1)[0]
    return fsspec.filesystem(protocol, skip_instance_cache=True, **root.storage_options)


def _keys(root: FsspecToolResultStore) -> list[str]:
    return sorted(_filesystem(root).find(root._handle.root_path()))


def test_the_probe_says_enforced_leaves_no_key_and_the_second_create_is_refused(root: FsspecToolResultStore) -> None:
    session = root.for_session("acme", "chat-1")
    check = session.check_exclusive_creates()
    assert (check.verdict, check.enforced) == ("enforced", True)
    assert _keys(root) == []  # the probe's key is gone
    claims = session.documents("claims")
    claims.create("call_1", b"mine")
    with pytest.raises(DocumentExistsError):
        claims.create("call_1", b"theirs")
    assert claims.get("call_1") == b"mine"
    assert session.list() == [] and claims.list() == ["call_1"]


def test_a_killed_probes_key_goes_with_the_next_purge_and_a_running_ones_stays(root: FsspecToolResultStore) -> None:
    session = root.for_session("acme", "chat-1")
    session.write(key="k.txt", content="kept")
    prefix = root._handle.root_path()
    twenty_minutes_ago = datetime.now(UTC) - timedelta(minutes=20)
    left = [f"{prefix}/{new_temporary_name(now=twenty_minutes_ago)}"]
    left.append(f"{prefix}/acme/chat-1/{new_temporary_name(now=twenty_minutes_ago)}")
    running = f"{prefix}/acme/chat-1/{new_temporary_name()}"
    filesystem = _filesystem(root)
    for key in [*left, running]:
        filesystem.pipe_file(key, b"probe")

    assert root.purge(older_than=timedelta(days=1)) == 0  # no result goes; the probes' keys are not counted
    keys = _keys(root)
    assert not set(left) & set(keys)
    assert running in keys and len(session.list()) == 1
    end_session(session)  # ending a session takes its results, never a key a probe may be using now
    assert running in _keys(root)


def test_references_naming_another_container_bucket_or_cloud_are_refused(root: FsspecToolResultStore) -> None:
    victim = root.for_session("globex", "chat-1")
    reference = victim.write(key="1_search_call_1.txt", content="globex's secret")
    own = root._handle.root_path()
    other = f"c{uuid.uuid4().hex[:16]}"
    attacker = root.for_session("acme", "chat-1")
    for protocol in ("az", "abfs", "abfss", "gs", "gcs"):
        for path in (f"{own}/globex/chat-1/{reference}", f"{other}/acme/chat-1/{reference}"):
            with pytest.raises(InvalidReferenceError):
                attacker.read(f"{protocol}://{path}")
    assert victim.read(reference) == "globex's secret"
