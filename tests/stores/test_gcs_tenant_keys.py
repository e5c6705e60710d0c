"""
Per-tenant customer-supplied keys (CSEK) on ``gs://``: derived apart from S3's, sent on each read and write of a
tenant's objects (and on nothing else) through fake-gcs-server with a recording proxy in front, and GCS's refusals of a
key, answered by a local fake, raised as permission errors. fake-gcs-server ignores the keys (its gap is xfailed).
"""

import base64
import contextlib
import hashlib
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from haystack.utils import Secret

from haystack_integrations.offload import FsspecToolResultStore, StorageError, StoragePermissionError
from haystack_integrations.offload.stores import AssumeRoleCredentials, TenantKeys
from haystack_integrations.offload.stores.encryption import HKDF_SALT, hkdf_sha256
from haystack_integrations.offload.stores.gcs_keys import GCS_HKDF_SALT, KEY_HEADERS, check_key_transport
from haystack_integrations.offload.testing.faults import FaultProxy
from haystack_integrations.offload.testing.relay import ProxiedRequest
from support.labelled_requests import LabelledRequests
from support.local_http import QuietHandler, serving

MASTER = "g" * 24 + uuid.uuid4().hex  # 56 characters
KEYS = TenantKeys(Secret.from_token(MASTER))
_, KEY, KEY_SHA256 = KEY_HEADERS


def _sha256_of(tenant: str) -> str:
    key = hkdf_sha256(MASTER.encode(), salt=GCS_HKDF_SALT, info=tenant.encode())
    return base64.b64encode(hashlib.sha256(key).digest()).decode()


def _root(server: Any, endpoint: str, bucket: str, keys: TenantKeys | None = KEYS) -> FsspecToolResultStore:
    options = {**server.storage_options(), "endpoint_url": endpoint}
    return FsspecToolResultStore(f"gs://{bucket}/{uuid.uuid4().hex[:8]}", storage_options=options, encryption=keys)


def _described(request: ProxiedRequest) -> tuple[str, str, str | None]:
    """(method, kind, the key's SHA-256 header or None)."""
    return request.method, _kind(request.target), request.header(KEY_SHA256)


def _kind(target: str) -> str:
    path = target.split("?", 1)[0]
    if path.startswith("/upload/"):
        return "upload"
    if path.startswith("/download/") or "alt=media" in target:
        return "download"
    return "object" if "/o/" in path else "listing"


@pytest.mark.parametrize(("size", "results"), [(1_000, 5), (1_000_000, 50)])
def test_a_tenants_reads_and_writes_carry_its_key_and_cost_no_request_more(
    fake_gcs_server: Any, size: int, results: int
) -> None:
    with FaultProxy(fake_gcs_server.endpoint) as proxy:  # no faults: it records
        session = _root(fake_gcs_server, proxy.endpoint_url, fake_gcs_server.new_bucket()).for_session("acme", "s1")
        session.warm_up()
        sent = LabelledRequests(proxy, _described)
        reference = sent("write", lambda: session.write(key="k.txt", content="x" * size))
        for n in range(results - 1):
            session.write(key=f"{n}.txt", content="y")
        assert sent("read", lambda: session.read(reference)) == "x" * size
        assert sent("range", lambda: session.read_range(reference, 0, 3)) == b"xxx"
        sent("page", lambda: session.list_page(limit=20))
        sent("delete", lambda: session.delete(reference))
    acme = _sha256_of("acme")
    # The same requests as without keys (test_gcs.py), each read and write with the tenant's key.
    assert sent.calls["write"] == [("POST", "upload", acme)]
    assert sent.calls["read"] == [("GET", "download", acme)]
    assert sent.calls["range"] == [("GET", "download", acme)]
    assert sent.calls["page"] == [("GET", "listing", None)]  # a listing needs no key: GCS keeps names under its own
    assert sent.calls["delete"] == [("DELETE", "object", None)]  # nor does a delete


def test_each_tenant_its_own_key_the_roots_operator_requests_too_and_nothing_else_keyed(fake_gcs_server: Any) -> None:
    bucket = fake_gcs_server.new_bucket()
    with FaultProxy(fake_gcs_server.endpoint) as proxy:
        root = _root(fake_gcs_server, proxy.endpoint_url, bucket)
        acme, globex = root.for_session("acme", "s1"), root.for_session("globex", "s1")
        plain = _root(fake_gcs_server, proxy.endpoint_url, bucket, keys=None).for_session("acme", "s1")
        sent = LabelledRequests(proxy, _described)
        reference = sent("acme write", lambda: acme.write(key="call-1", content="acme's result"))
        sent("acme info", lambda: acme.info(reference))
        sent("acme document", lambda: acme.documents("approvals").create("request.json", b"{}"))
        assert sent("acme document read", lambda: acme.documents("approvals").get("request.json")) == b"{}"
        sent("globex write", lambda: globex.write(key="call-1", content="globex's result"))
        # The root's operator requests inside a tenant's scope send that tenant's key (as on S3).
        assert sent("root read", lambda: root.read(f"acme/s1/{reference}")) == "acme's result"
        sent("root list", lambda: root.list())
        sent("plain", lambda: plain.read(plain.write(key="call-2", content="no key")))
    acme_key, globex_key = _sha256_of("acme"), _sha256_of("globex")
    owner = {"acme write": acme_key, "acme info": acme_key, "acme document": acme_key}
    owner |= {"acme document read": acme_key, "globex write": globex_key, "root read": acme_key}
    owner |= {"root list": None, "plain": None}
    # Each request that reads or writes the object carries its tenant's key; deletes and listings none (GCS keeps
    # names and metadata under its own keys). The document's create probes exclusive creates first (and deletes).
    # gcsfs's info sends its metadata GET and a listing at once and cancels the slower: either may reach the proxy after
    # the info returned, among the next call's requests. Such a request, keyed as its call's (or keyless where no key
    # belongs), is left out of every call's shape but the root's list's; one keyed wrongly would still show, and fail.
    stray = {("GET", "listing", True), ("GET", "object", True)}
    shape = {
        label: {
            (method, kind, key == (owner[label] if method != "DELETE" and kind != "listing" else None))
            for method, kind, key in sent.calls[label]
        }
        for label in owner
    }
    assert ("GET", "object", True) in shape.pop("acme info")
    shape = {label: found - stray if label != "root list" else found for label, found in shape.items()}
    assert shape == {
        "acme write": {("POST", "upload", True)},
        "acme document": {("POST", "upload", True), ("GET", "download", True), ("DELETE", "object", True)},
        "acme document read": {("GET", "download", True)},
        "globex write": {("POST", "upload", True)},
        "root read": {("GET", "download", True)},
        "root list": {("GET", "listing", True)},
        "plain": {("POST", "upload", True), ("GET", "download", True)},
    }
    whole = [request for request in proxy.requests.snapshot() if request.header(KEY) is not None]
    assert {request.header(KEY_HEADERS[0]) for request in whole} == {"AES256"}


async def test_the_async_path_sends_the_key(fake_gcs_server: Any) -> None:
    with FaultProxy(fake_gcs_server.endpoint) as proxy:
        session = _root(fake_gcs_server, proxy.endpoint_url, fake_gcs_server.new_bucket()).for_session("acme", "s2")
        reference = await session.write_async(key="k", content="async")
        assert await session.read_async(reference) == "async"
    data = [r for r in proxy.requests.snapshot() if _kind(r.target) in {"upload", "download"}]
    assert len(data) == 2 and {r.header(KEY_SHA256) for r in data} == {_sha256_of("acme")}


def test_gcs_keys_are_hkdf_with_a_salt_of_their_own_so_s3_never_sees_them() -> None:
    gcs = KEYS.key_for("acme", salt=GCS_HKDF_SALT)
    assert gcs == hkdf_sha256(MASTER.encode(), salt=GCS_HKDF_SALT, info=b"acme") and len(gcs) == 32
    assert gcs != KEYS.key_for("acme") == hkdf_sha256(MASTER.encode(), salt=HKDF_SALT, info=b"acme")
    assert gcs != KEYS.key_for("globex", salt=GCS_HKDF_SALT)


def test_the_key_is_not_in_gcsfs_debug_log(fake_gcs_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    session = _root(fake_gcs_server, fake_gcs_server.endpoint, fake_gcs_server.new_bucket()).for_session("acme", "s3")
    with caplog.at_level(logging.DEBUG):
        session.read(session.write(key="k", content="logged?"))
    key = base64.b64encode(KEYS.key_for("acme", salt=GCS_HKDF_SALT)).decode()
    assert "POST" in caplog.text  # gcsfs logged its requests, with their headers
    assert key not in caplog.text


@pytest.mark.xfail(strict=True, reason="fake-gcs-server 1.54 ignores customer-supplied keys: any key reads the object")
def test_the_emulator_refuses_another_tenants_key(fake_gcs_server: Any) -> None:
    bucket = fake_gcs_server.new_bucket()
    root = _root(fake_gcs_server, fake_gcs_server.endpoint, bucket)
    reference = root.for_session("acme", "s1").write(key="k", content="acme's")
    other = FsspecToolResultStore(
        root.url, storage_options=root.storage_options, encryption=TenantKeys(Secret.from_token(MASTER + "x"))
    )
    with pytest.raises(StoragePermissionError):
        other.for_session("acme", "s1").read(reference)


class _KeyRefusing(QuietHandler):
    """GCS's JSON API taking uploads and refusing reads with a 400 of the server's `reason`."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer_json(
            200, {"kind": "storage#object", "name": "k", "bucket": "results", "size": "1", "generation": "1"}
        )

    def do_GET(self) -> None:
        self.server.keys_seen.append(self.headers.get(KEY_SHA256))  # type: ignore[attr-defined]
        reason = self.server.reason  # type: ignore[attr-defined]
        self.answer_json(400, {"error": {"code": 400, "message": "Refused.", "errors": [{"reason": reason}]}})


@pytest.fixture
def refusing_gcs() -> Iterator[Callable[[str], tuple[str, list[str | None]]]]:
    with contextlib.ExitStack() as servers:

        def start(reason: str) -> tuple[str, list[str | None]]:
            server = servers.enter_context(serving(_KeyRefusing, reason=reason, keys_seen=[]))
            return f"http://127.0.0.1:{server.server_address[1]}", server.keys_seen

        yield start


@pytest.mark.parametrize(
    "reason", ["customerEncryptionKeyIsIncorrect", "resourceNotEncryptedWithCustomerEncryptionKey"]
)
def test_a_refused_key_is_a_permission_error_named_and_not_retried(
    fake_gcs_server: Any, refusing_gcs: Any, reason: str
) -> None:
    endpoint, keys_seen = refusing_gcs(reason)
    root = _root(fake_gcs_server, endpoint, "results")
    session = root.for_session("acme", "s1")
    reference = session.write(key="k", content="x")
    with pytest.raises(StoragePermissionError, match="with this tenant's encryption key") as caught:
        session.read(reference)
    assert caught.value.location == f"gs://results at {endpoint}"
    assert root.retry_stats.as_dict()["causes"] == {}
    assert keys_seen == [_sha256_of("acme")]  # one read, with the key: a refusal is not retried


def test_a_read_without_the_key_is_a_permission_error_that_says_so(fake_gcs_server: Any, refusing_gcs: Any) -> None:
    endpoint, keys_seen = refusing_gcs("resourceIsEncryptedWithCustomerEncryptionKey")
    session = _root(fake_gcs_server, endpoint, "results", keys=None).for_session("acme", "s1")
    reference = session.write(key="k", content="x")
    with pytest.raises(StoragePermissionError, match="without an encryption key"):
        session.read(reference)
    assert keys_seen == [None]


@pytest.mark.parametrize("keys", [KEYS, None], ids=["keys", "no-keys"])
def test_another_400_is_not_called_a_key_refusal(
    fake_gcs_server: Any, refusing_gcs: Any, keys: TenantKeys | None
) -> None:
    # S3 answers a wrong or missing key with a bare 400, so there any 400 to a read is one; GCS names the reason.
    endpoint, _ = refusing_gcs("badRequest")
    session = _root(fake_gcs_server, endpoint, "results", keys=keys).for_session("acme", "s1")
    reference = session.write(key="k", content="x")
    with pytest.raises(StorageError, match="HTTP 400") as caught:
        session.read(reference)
    assert not isinstance(caught.value, StoragePermissionError)


def test_keys_are_sent_to_google_over_tls_or_to_this_machine_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    check_key_transport({}, {})  # Google's own endpoint
    check_key_transport({"endpoint_url": "https://storage.example.com"}, {})
    check_key_transport({"endpoint_url": "http://127.0.0.1:4443"}, {})
    check_key_transport({}, {"STORAGE_EMULATOR_HOST": "localhost:4443"})
    for options, environ in [
        ({"endpoint_url": "http://storage.example.com"}, {}),
        ({}, {"STORAGE_EMULATOR_HOST": "gcs.internal:4443"}),
    ]:
        with pytest.raises(ValueError, match="must be https://"):
            check_key_transport(options, environ)
    with pytest.raises(ValueError, match="must be https://"):
        FsspecToolResultStore("gs://results/p", storage_options={"endpoint_url": "http://10.0.0.7"}, encryption=KEYS)


def test_what_gs_stores_refuse() -> None:
    with pytest.raises(ValueError, match="encryption= to s3://, gs://"):  # and az:// (test_azure_tenant_keys.py)
        FsspecToolResultStore("memory://results/p", encryption=KEYS)
    with pytest.raises(ValueError, match="credentials= apply to s3://"):
        FsspecToolResultStore("gs://results/p", credentials=AssumeRoleCredentials("arn:aws:iam::1:role/r"))
    assert FsspecToolResultStore("gs://results/p", encryption=KEYS).encryption is KEYS


def test_a_gs_store_with_keys_serializes_the_master_secret_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_TEST_GCS_MASTER_KEY", MASTER)
    keys = TenantKeys(Secret.from_env_var("OFFLOAD_TEST_GCS_MASTER_KEY"))
    data = FsspecToolResultStore("gs://results/p", encryption=keys).to_dict()
    assert MASTER not in repr(data)
    again = FsspecToolResultStore.from_dict(data)
    assert isinstance(again.encryption, TenantKeys) and again.url == "gs://results/p"
    assert again.encryption.key_for("acme", salt=GCS_HKDF_SALT) == KEYS.key_for("acme", salt=GCS_HKDF_SALT)


def test_a_resumable_upload_sends_the_key_on_its_start_and_every_chunk(fake_gcs_server: Any) -> None:
    import gcsfs

    from haystack_integrations.offload.stores.async_fsspec_io import without_client_retries
    from haystack_integrations.offload.stores.gcs_keys import tenant_csek_headers, with_customer_key

    bucket = fake_gcs_server.new_bucket()
    with FaultProxy(fake_gcs_server.endpoint) as proxy:
        options = {**fake_gcs_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        fs = without_client_retries(gcsfs.GCSFileSystem(skip_instance_cache=True, **options))
        fs = with_customer_key(fs, tenant_csek_headers(KEYS, "acme"))
        # What gcsfs sends from 50 MiB, at 600 KiB in chunks of 256 KiB: a start and 3 chunks.
        fs.pipe_file(f"{bucket}/acme/s1/big", b"z" * (600 * 1024), chunksize=2**18)
        assert fs.cat_file(f"{bucket}/acme/s1/big", start=0, end=2) == b"zz"
    uploads = [r for r in proxy.requests.snapshot() if _kind(r.target) == "upload"]
    assert len(uploads) == 4 and sum("upload_id=" in r.target for r in uploads) == 3
    assert {r.header(KEY_SHA256) for r in uploads} == {_sha256_of("acme")}
