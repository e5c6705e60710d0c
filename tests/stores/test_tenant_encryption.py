"""
Per-tenant SSE-C keys (`TenantKeys`): derived as RFC 5869 says, sent on every request in a tenant's scope (from the
tenant's stores and the root's operator requests alike) on both engines, never on the root's own, serialized by
reference. moto ignores SSE-C, so here the headers are what is checked; RGW's refusals are in
``test_tenant_encryption_rgw.py``.
"""

import base64
import hashlib
import uuid

import pytest
from haystack.core.errors import SerializationError
from haystack.utils import Secret

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores import AssumeRoleCredentials, TenantKeys
from haystack_integrations.offload.stores.encryption import hkdf_sha256
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

ENGINES = ["obstore", "fsspec"]
MASTER = "m" * 24 + uuid.uuid4().hex  # 56 characters
KEY_MD5 = "x-amz-server-side-encryption-customer-key-md5"


def _md5_of(key: bytes) -> str:
    return base64.b64encode(hashlib.md5(key).digest()).decode()  # noqa: S324 - what SSE-C's header carries


def _root(s3_server: LocalS3Server, engine: str, keys: TenantKeys, **options: object) -> FsspecToolResultStore:
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex[:8]}"
    return FsspecToolResultStore(
        url, storage_options=s3_server.storage_options(), engine=engine, encryption=keys, **options
    )


def test_keys_are_hkdf_sha256_as_rfc_5869_defines_it() -> None:
    # RFC 5869, appendix A.1 (test case 1).
    okm = hkdf_sha256(
        bytes.fromhex("0b" * 22),
        salt=bytes.fromhex("000102030405060708090a0b0c"),
        info=bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"),
        length=42,
    )
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")


def test_each_tenant_has_its_own_key_the_same_every_time() -> None:
    keys = TenantKeys(Secret.from_token(MASTER))
    acme, globex = keys.key_for("acme"), keys.key_for("globex")
    assert len(acme) == 32 and acme != globex
    assert TenantKeys(Secret.from_token(MASTER)).key_for("acme") == acme
    assert TenantKeys(Secret.from_token(MASTER + "x")).key_for("acme") != acme


@pytest.mark.s3
@pytest.mark.parametrize("engine", ENGINES)
def test_every_request_in_a_tenants_scope_sends_its_key_and_no_other(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str
) -> None:
    keys = TenantKeys(Secret.from_token(MASTER))
    root = _root(s3_server, engine, keys)
    acme, globex = root.for_session("acme", "s1"), root.for_session("globex", "s1")
    reference = acme.write(key="call-1", content="acme's result")
    assert acme.read(reference) == "acme's result"
    assert acme.read_range(reference, 0, 4) == b"acme"
    assert acme.info(reference).size == len("acme's result")
    acme.documents("approvals").create("request.json", b"{}")
    assert acme.documents("approvals").get("request.json") == b"{}"
    globex.write(key="call-1", content="globex's result")
    # The root's operator requests inside a tenant's scope send that tenant's key, with the worker's credentials.
    assert root.read(f"acme/s1/{reference}") == "acme's result"
    root.list()

    sent: dict[str, set[str | None]] = {"acme": set(), "globex": set()}
    for request in s3_requests.snapshot():
        if request.method in {"GET", "PUT", "HEAD"} and request.query == "":  # object requests, not listings
            tenant = "acme" if "/acme/" in request.path else "globex" if "/globex/" in request.path else None
            if tenant is not None:
                sent[tenant].add(request.header(KEY_MD5))
    assert sent == {"acme": {_md5_of(keys.key_for("acme"))}, "globex": {_md5_of(keys.key_for("globex"))}}
    unkeyed = [r for r in s3_requests.snapshot() if r.header(KEY_MD5) is not None and "list-type" in r.query]
    assert unkeyed == []  # a listing carries no key


@pytest.mark.s3
@pytest.mark.parametrize("engine", ENGINES)
async def test_the_async_path_and_streamed_writes_send_the_key(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str
) -> None:
    keys = TenantKeys(Secret.from_token(MASTER))
    session = _root(s3_server, engine, keys).for_session("acme", "s2")
    big = "x" * (17 * 1024 * 1024)  # above the multipart threshold: every part must carry the key
    reference = await session.write_async(key="big", content=big)
    assert await session.read_range_async(reference, 0, 3) == b"xxx"
    object_requests = [r for r in s3_requests.snapshot() if "/acme/" in r.path and "uploadId" not in r.query]
    parts = [r for r in s3_requests.snapshot() if "partNumber" in r.query]
    assert object_requests and all(r.header(KEY_MD5) == _md5_of(keys.key_for("acme")) for r in object_requests)
    assert len(parts) >= 2 and all(r.header(KEY_MD5) == _md5_of(keys.key_for("acme")) for r in parts)


@pytest.mark.s3
@pytest.mark.parametrize("engine", ENGINES)
def test_keys_and_credentials_together(s3_server: LocalS3Server, s3_requests: RequestLog, engine: str) -> None:
    keys = TenantKeys(Secret.from_token(MASTER))
    source = AssumeRoleCredentials("arn:aws:iam::123456789012:role/offload-tenants")
    session = _root(s3_server, engine, keys, credentials=source).for_session("acme", "s3")
    assert session.read(session.write(key="call-1", content="both")) == "both"
    mine = [r for r in s3_requests.snapshot() if "/acme/" in r.path and r.method in {"GET", "PUT"}]
    assert {r.header(KEY_MD5) for r in mine} == {_md5_of(keys.key_for("acme"))}
    assert all(r.header("x-amz-security-token") for r in mine)
    assert source.calls == 1


def test_a_store_with_tenant_keys_serializes_the_master_secret_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_TEST_MASTER_KEY", MASTER)
    store = FsspecToolResultStore(
        "s3://bucket/prod", encryption=TenantKeys(Secret.from_env_var("OFFLOAD_TEST_MASTER_KEY"))
    )
    data = store.to_dict()
    assert data["init_parameters"]["encryption"]["init_parameters"]["master_secret"]["env_vars"] == [
        "OFFLOAD_TEST_MASTER_KEY"
    ]
    assert MASTER not in repr(data)
    again = FsspecToolResultStore.from_dict(data)
    assert isinstance(again.encryption, TenantKeys)
    assert again.encryption.key_for("acme") == store.encryption.key_for("acme")  # type: ignore[union-attr]
    with pytest.raises(SerializationError, match="token Secret"):
        FsspecToolResultStore("s3://bucket/prod", encryption=TenantKeys(Secret.from_token(MASTER))).to_dict()


def test_bad_settings_are_refused(s3_server: LocalS3Server) -> None:
    keys = TenantKeys(Secret.from_token(MASTER))
    with pytest.raises(ValueError, match="s3:// stores"):
        FsspecToolResultStore("memory://somewhere", encryption=keys)
    with pytest.raises(ValueError, match="ServerSideEncryption"):
        FsspecToolResultStore(
            f"{s3_server.bucket_url}/x",
            storage_options={**s3_server.storage_options(), "s3_additional_kwargs": {"ServerSideEncryption": "AES256"}},
            encryption=keys,
        )
    with pytest.raises(ValueError, match="at least 32 characters"):
        TenantKeys(Secret.from_token("short")).key_for("acme")
    with pytest.raises(TypeError, match="Secret"):
        TenantKeys(MASTER)  # type: ignore[arg-type]
