"""
SSE-C keys per tenant on Ceph RGW, which enforces them (moto ignores SSE-C): a tenant's results and documents are
unreadable without its key, even with the worker's bucket-wide credentials and even by a store that skips its own
scope check, and readable with it, from the tenant's stores and from the root's operator requests, on both engines.
Runs in the real-S3 lane (``OFFLOAD_TEST_REAL_S3=rgw``).
"""

import copy
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError
from haystack.utils import Secret

from haystack_integrations.offload import FsspecToolResultStore, StoragePermissionError
from haystack_integrations.offload.stores import TenantKeys
from haystack_integrations.offload.stores.retention import activity_document_name

pytestmark = [pytest.mark.s3, pytest.mark.rgw]

ENGINES = ("obstore", "fsspec")
MASTER = "the master secret of these tests, 48 characters"
FORGOTTEN = "another master secret: the first one, forgotten"
# RGW answers a wrong SSE-C key with 400 (the store says "encryption key"); a service answering 403 is a refusal too.
KEY_REFUSED = "encryption key|permission denied"


def _root(server: Any, engine: str, master: str | None, url: str | None = None) -> FsspecToolResultStore:
    return FsspecToolResultStore(
        url or f"{server.bucket_url}/{uuid.uuid4().hex[:8]}",
        storage_options=server.storage_options(),
        engine=engine,
        encryption=TenantKeys(Secret.from_token(master)) if master is not None else None,
    )


def _check_reads_refused(store: FsspecToolResultStore, reference: str, document: str) -> None:
    """Check that every read of a result and of a document is refused for its SSE-C key, naming the store."""
    reads = {
        "read": lambda: store.read(reference),
        "read a range": lambda: store.read_range(reference, 0, 5),
        "describe": lambda: store.info(reference),
        "read a document": lambda: store.documents("approvals").get(document),
    }
    for name, read in reads.items():
        with pytest.raises(StoragePermissionError, match=KEY_REFUSED) as raised:
            read()
        assert "s3://" in str(raised.value.location), name


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tenants_objects_are_unreadable_without_its_key_and_readable_with_it(
    real_s3_server: Any, engine: str
) -> None:
    root = _root(real_s3_server, engine, MASTER)
    session = root.for_session("acme", "chat-1")
    reference = session.write(key="call-1", content="acme's invoice total: 1200")
    big = session.write(key="call-2", content="y" * (17 * 1024 * 1024))  # multipart: every part encrypted
    session.documents("approvals").create("call-1.json", b'{"decided": "approve"}')
    assert session.read(reference) == "acme's invoice total: 1200"
    assert session.read_range(big, 17 * 1024 * 1024 - 3, 17 * 1024 * 1024) == b"yyy"
    assert session.documents("approvals").get("call-1.json") == b'{"decided": "approve"}'

    # The worker's own credentials reach the whole bucket, but not the plaintext.
    s3 = real_s3_server.client()
    bucket, _, prefix = root.url.removeprefix("s3://").partition("/")
    keys = [item["Key"] for item in s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/acme/")["Contents"]]
    assert len(keys) == 3  # listing needs no key
    for key in keys:
        with pytest.raises(ClientError) as refused:
            s3.get_object(Bucket=bucket, Key=key)
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] in (400, 403)

    # A store without keys cannot read them, nor one with another master secret (a key forgotten): both are told so.
    plain = _root(real_s3_server, engine, None, url=root.url).for_session("acme", "chat-1")
    with pytest.raises(StoragePermissionError, match="without an encryption key"):
        plain.read(reference)
    forgotten = _root(real_s3_server, engine, FORGOTTEN, url=root.url).for_session("acme", "chat-1")
    _check_reads_refused(forgotten, reference, "call-1.json")
    with pytest.raises(StoragePermissionError, match=KEY_REFUSED):
        forgotten.read_range(big, 0, 10)  # a multipart object's parts too
    assert session.read(reference) == "acme's invoice total: 1200"  # and nothing was changed


@pytest.mark.parametrize("engine", ENGINES)
def test_a_store_that_skips_its_scope_check_still_cannot_read_another_tenants_results(
    real_s3_server: Any, engine: str
) -> None:
    root = _root(real_s3_server, engine, MASTER)
    globex = root.for_session("globex", "chat-1")
    theirs = globex.write(key="call-1", content="globex's secret")
    globex.documents("approvals").create("call-1.json", b"{}")
    # Acme's session store with globex's scope (the test seam): acme's client, acme's key, globex's objects.
    misbuilt = copy.copy(root.for_session("acme", "chat-1"))
    misbuilt._scope = ("globex", "chat-1")
    _check_reads_refused(misbuilt, theirs, "call-1.json")
    assert globex.read(theirs) == "globex's secret"


@pytest.mark.parametrize("engine", ENGINES)
def test_the_roots_operator_requests_use_each_tenants_key(real_s3_server: Any, engine: str) -> None:
    root = _root(real_s3_server, engine, MASTER)
    written = {}
    for tenant in ("acme", "globex"):
        session = root.for_session(tenant, "chat-1")
        written[tenant] = session.write(key="call-1", content=f"{tenant}'s result")
        ended = json.dumps({"ended_at": "2026-01-02T03:04:05+00:00"}).encode()
        session.documents("turns").put(activity_document_name("turn", 1, "end"), ended)
    assert {record.reference for record in root.list()} == {
        f"{tenant}/chat-1/{reference}" for tenant, reference in written.items()
    }
    for tenant, reference in written.items():
        assert root.read(f"{tenant}/chat-1/{reference}") == f"{tenant}'s result"
        assert root.for_tenant(tenant).info(f"chat-1/{reference}").size == len(f"{tenant}'s result")
    activity = [path for path in root.find_objects() if path.endswith(".end.json")]
    assert len(activity) == 2
    assert set(root.activity_times(activity).values()) == {datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)}
    root.delete(f"acme/chat-1/{written['acme']}")
    assert [record.reference for record in root.list()] == [f"globex/chat-1/{written['globex']}"]


def test_the_operator_commands_read_with_each_tenants_key(
    real_s3_server: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from haystack_integrations.offload.cli import main

    monkeypatch.setenv("OFFLOAD_TEST_MASTER_KEY", MASTER)
    root = _root(real_s3_server, "obstore", MASTER)
    reference = root.for_session("acme", "chat-1").write(key="call-1", content="acme's result")
    store = [root.url, "--storage-options", json.dumps(real_s3_server.storage_options())]
    out = tmp_path / "result.txt"
    assert main(["cat", *store, f"acme/chat-1/{reference}", "-o", str(out)]) == 2
    assert "Could not read the result" in capsys.readouterr().err  # without the key: a clear error, nothing written
    assert not out.exists()
    keyed = ["--sse-c-master-key-env", "OFFLOAD_TEST_MASTER_KEY"]
    assert main(["cat", *store, *keyed, f"acme/chat-1/{reference}", "-o", str(out)]) == 0
    assert out.read_text() == "acme's result"
