"""
On Ceph RGW, which enforces SSE-C: a store without keys reading a tenant's encrypted objects is told what a store with
the wrong key is told (refused, for the encryption key), not a bare "HTTP 400 InvalidArgument"; and the STS session
names of tenant ids with ``+`` or of 100 characters are ones RGW takes. Runs in the real-S3 lane
(``OFFLOAD_TEST_REAL_S3=rgw``); moto ignores SSE-C, so it cannot show the first.
"""

import uuid
from typing import Any

import pytest
from haystack.utils import Secret

from haystack_integrations.offload import FsspecToolResultStore, StoragePermissionError
from haystack_integrations.offload.stores import AssumeRoleCredentials, TenantKeys

pytestmark = [pytest.mark.s3, pytest.mark.rgw]

ENGINES = ("obstore", "fsspec")
MASTER = "the master secret of the keyless tests, 48 chars"
# What the keyed store's refusal and the keyless one's share.
KEY_REFUSED = r"Storage refused to .* encryption key \(SSE-C\)"


def _store(server: Any, engine: str, url: str, **options: Any) -> FsspecToolResultStore:
    return FsspecToolResultStore(url, storage_options=server.storage_options(), engine=engine, **options)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_store_without_keys_reading_encrypted_objects_is_told_so(real_s3_server: Any, engine: str) -> None:
    url = f"{real_s3_server.bucket_url}/{uuid.uuid4().hex[:8]}"
    keyed = _store(real_s3_server, engine, url, encryption=TenantKeys(Secret.from_token(MASTER)))
    session = keyed.for_session("acme", "chat-1")
    reference = session.write(key="call-1", content="acme's invoice total: 1200")
    session.documents("approvals").create("call-1.json", b"{}")

    keyless_root = _store(real_s3_server, engine, url)
    keyless = keyless_root.for_session("acme", "chat-1")
    reads = {
        "read": lambda: keyless.read(reference),
        "read a range": lambda: keyless.read_range(reference, 0, 5),
        "describe": lambda: keyless.info(reference),
        "read a document": lambda: keyless.documents("approvals").get("call-1.json"),
        "the root's read": lambda: keyless_root.read(f"acme/chat-1/{reference}"),
    }
    for name, read in reads.items():
        with pytest.raises(StoragePermissionError, match=KEY_REFUSED) as raised:
            read()
        assert "without an encryption key" in str(raised.value), name
        assert "s3://" in str(raised.value.location), name
    assert session.read(reference) == "acme's invoice total: 1200"


@pytest.mark.parametrize("engine", ENGINES)
def test_tenant_ids_spelled_in_a_session_name_rgw_takes(
    real_s3_server: Any, real_s3_tenant_role: str, engine: str
) -> None:
    source = AssumeRoleCredentials(real_s3_tenant_role)
    root = _store(real_s3_server, engine, f"{real_s3_server.bucket_url}/{uuid.uuid4().hex[:8]}", credentials=source)
    tenants = ["a+b", "a-b-300273da", "x+" * 50]
    for tenant in tenants:
        session = root.for_session(tenant, "chat-1")
        assert session.read(session.write(key="call-1", content=tenant)) == tenant
    assert source.calls == len(tenants)
