"""
The per-tenant policy of ``infra/tenant-policy.yaml``, applied at run time as an STS session policy on Ceph RGW: a
worker's credentials assumed for one tenant reach that tenant's prefix only, whatever scope the store is built with.

The store's own checks cannot help here on purpose: a store *scoped to another tenant* signs with the first tenant's
temporary credentials (what a mis-built store or a bug in a scope check would do), so only RGW stands in the way.
Unlike moto (``test_tenant_policy_iam.py``), RGW evaluates the ``s3:prefix`` condition on listings and each key of
a batch delete. Runs in the real-S3 lane (``OFFLOAD_TEST_REAL_S3=rgw``).
"""

import copy
import json
import os
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from haystack_integrations.offload import FsspecToolResultStore, StoragePermissionError
from haystack_integrations.offload.stores import AssumeRoleCredentials

pytestmark = [pytest.mark.s3, pytest.mark.slow, pytest.mark.rgw]

PREFIX = "prod"
TENANTS = ("acme", "acme-labs")  # siblings: a policy without the trailing "/" would let "acme" into "acme-labs/"
ENGINES = ("obstore", "fsspec")


@pytest.fixture(scope="module")
def sts_server() -> Iterator[Any]:
    """A Ceph RGW serving STS, with a role the test user may assume with its permanent keys only."""
    if os.environ.get("OFFLOAD_TEST_REAL_S3", "").strip().lower() != "rgw":
        pytest.skip("the RGW lane is off (OFFLOAD_TEST_REAL_S3=rgw turns it on)")
    from support.ceph_rgw import CephRGWServer, ceph_available

    missing = ceph_available()
    if missing is not None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
    with CephRGWServer(sts=True) as server:
        server.role_arn = server.create_tenant_role()
        yield server


def _sts(server: Any, options: dict[str, Any]) -> Any:
    return boto3.client(
        "sts",
        endpoint_url=server.endpoint_url,
        aws_access_key_id=options["key"],
        aws_secret_access_key=options["secret"],
        aws_session_token=options.get("token"),
        region_name="us-east-1",
    )


def _assumed(server: Any, policy: dict[str, Any] | None, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Storage options signing with credentials assumed under `policy` (RGW takes it only as compact JSON)."""
    options = server.storage_options()
    extra = {"Policy": json.dumps(policy, separators=(",", ":"))} if policy is not None else {}
    answer = _sts(server, base or options).assume_role(
        RoleArn=server.role_arn, RoleSessionName=f"tenant-{uuid.uuid4().hex[:8]}", DurationSeconds=900, **extra
    )
    credentials = answer["Credentials"]
    return {
        **options,
        "key": credentials["AccessKeyId"],
        "secret": credentials["SecretAccessKey"],
        "token": credentials["SessionToken"],
    }


@pytest.fixture(scope="module")
def tenant_options(sts_server: Any, infra_documents: ModuleType) -> dict[str, dict[str, Any]]:
    """Per tenant: storage options with credentials assumed under that tenant's policy."""
    options = {}
    for tenant in TENANTS:
        [policy] = infra_documents.tenant_policies(sts_server.bucket, PREFIX, tenant).values()
        options[tenant] = _assumed(sts_server, policy)
    return options


def _root(server: Any, options: dict[str, Any], engine: str) -> FsspecToolResultStore:
    return FsspecToolResultStore(f"s3://{server.bucket}/{PREFIX}", storage_options=options, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("me", "other"), [TENANTS, TENANTS[::-1]])
def test_assumed_credentials_reach_only_their_tenants_prefix(
    sts_server: Any, tenant_options: dict[str, dict[str, Any]], engine: str, me: str, other: str
) -> None:
    session = f"chat-{uuid.uuid4().hex[:8]}"
    theirs = _root(sts_server, tenant_options[other], engine).for_session(other, session)
    their_result = theirs.write(key="call-1", content="the other tenant's result")
    theirs.documents("approvals").create("request.json", b'{"approved": false}')
    mine = _root(sts_server, tenant_options[me], engine)
    own = mine.for_session(me, session)
    assert own.read(own.write(key="call-1", content="mine")) == "mine"
    own.documents("approvals").create("request.json", b"{}")
    assert own.documents("approvals").get("request.json") == b"{}"

    # My credentials, their scope: a mis-built store. Every request reaches RGW, and RGW refuses each one.
    misbuilt = mine.for_session(other, session)
    attempts = {
        "read": lambda: misbuilt.read(their_result),
        "list": misbuilt.list,
        "write": lambda: misbuilt.write(key="call-2", content="forged"),
        "delete": lambda: misbuilt.delete(their_result),
        "purge": misbuilt.purge,
        "read a document": lambda: misbuilt.documents("approvals").get("request.json"),
        "overwrite a document": lambda: misbuilt.documents("approvals").put("request.json", b'{"approved": true}'),
        "list documents": lambda: misbuilt.documents("approvals").list(),
        "tenant listing": lambda: mine.for_tenant(other).list(),
    }
    refused = {}
    for name, attempt in attempts.items():
        with pytest.raises(StoragePermissionError) as raised:
            attempt()
        refused[name] = raised.value.location
    assert set(refused) == set(attempts)
    assert all(location == f"s3://{sts_server.bucket} at {sts_server.endpoint_url}" for location in refused.values())
    # Nothing of theirs changed.
    assert theirs.read(their_result) == "the other tenant's result"
    assert theirs.documents("approvals").get("request.json") == b'{"approved": false}'
    # And mine are mine to delete (s3fs deletes with DeleteObjects, which RGW authorises per key).
    own.write(key="call-2", content="more")
    assert own.purge() == 2 and own.list() == []


def test_temporary_credentials_cannot_assume_the_role_again_to_drop_their_policy(
    sts_server: Any, tenant_options: dict[str, dict[str, Any]]
) -> None:
    with pytest.raises(ClientError) as raised:
        _assumed(sts_server, None, base=tenant_options["acme"])
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


@pytest.mark.parametrize("engine", ENGINES)
def test_a_store_with_assume_role_credentials_is_held_to_each_tenants_prefix_by_rgw(
    sts_server: Any, engine: str
) -> None:
    # With a session tag too: RGW takes it (not enforcing conditions on it), the session policy does the work.
    source = AssumeRoleCredentials(sts_server.role_arn, tenant_tag="tenant")
    root = FsspecToolResultStore(
        f"s3://{sts_server.bucket}/{PREFIX}-{uuid.uuid4().hex[:6]}",
        storage_options=sts_server.storage_options(),
        engine=engine,
        credentials=source,
    )
    session = f"chat-{uuid.uuid4().hex[:8]}"
    theirs = root.for_session("acme-labs", session)
    their_result = theirs.write(key="call-1", content="theirs")
    theirs.documents("approvals").create("request.json", b'{"approved": false}')
    mine = root.for_session("acme", session)
    assert mine.read(mine.write(key="call-1", content="mine")) == "mine"
    mine.documents("approvals").create("request.json", b"{}")  # the exclusive-create probe too, in acme's prefix
    assert source.calls == 2

    # The test seam: the scope check bypassed, acme's client (its credentials) aimed at acme-labs' scope.
    misbuilt = copy.copy(mine)
    misbuilt._scope = ("acme-labs", session)
    attempts = {
        "read": lambda: misbuilt.read(their_result),
        "list": misbuilt.list,
        "write": lambda: misbuilt.write(key="call-2", content="forged"),
        "delete": lambda: misbuilt.delete(their_result),
        "read a document": lambda: misbuilt.documents("approvals").get("request.json"),
        "overwrite a document": lambda: misbuilt.documents("approvals").put("request.json", b'{"approved": true}'),
    }
    for name, attempt in attempts.items():
        with pytest.raises(StoragePermissionError) as raised:
            attempt()
        location = raised.value.location
        assert location.startswith(f"s3://{sts_server.bucket} at "), name  # RGW's answer, not ours
        # The scope the refused credentials were issued for: the caller's own tenant, never the other one.
        assert location.endswith("signed as tenant 'acme'") and "acme-labs" not in str(raised.value), name
    assert theirs.read(their_result) == "theirs"
    assert theirs.documents("approvals").get("request.json") == b'{"approved": false}'
    assert mine.purge() == 1 and theirs.purge() == 1


def test_the_reference_server_assumes_the_role_and_encrypts_per_tenant(sts_server: Any) -> None:
    from fastapi.testclient import TestClient

    from offload_haystack_app.server import ServerSettings, create_app

    prefix = f"{PREFIX}-{uuid.uuid4().hex[:6]}"
    settings = ServerSettings(
        store=f"s3://{sts_server.bucket}/{prefix}",
        storage_options=sts_server.storage_options(),
        s3_tenant_role_arn=sts_server.role_arn,
        s3_sse_c_master_key="the reference server's master secret, for this test",
        tokens={"acme-token-0123456789abcdef": "acme", "labs-token-0123456789abcdef": "acme-labs"},
    )
    app = create_app(settings)
    with TestClient(app) as client:
        for token in settings.tokens:
            headers = {"Authorization": f"Bearer {token}"}
            reply = client.post("/api/sessions/s1/messages", json={"text": "Dump the invoices table"}, headers=headers)
            assert reply.status_code == 200, reply.text
            results = client.get("/api/sessions/s1/results", headers=headers).json()["results"]
            assert results
            page = client.get(f"/api/sessions/s1/results/{results[0]['reference']}", headers=headers)
            assert page.status_code == 200, page.text
        assert app.state.root.credentials.calls == 2  # one per tenant
    # Everything the server wrote (results, history, turns) is encrypted with its tenant's key.
    s3 = boto3.client(
        "s3",
        endpoint_url=sts_server.endpoint_url,
        aws_access_key_id=sts_server.storage_options()["key"],
        aws_secret_access_key=sts_server.storage_options()["secret"],
        region_name="us-east-1",
    )
    written = [item["Key"] for item in s3.list_objects_v2(Bucket=sts_server.bucket, Prefix=f"{prefix}/")["Contents"]]
    assert any("/acme/" in key for key in written) and any("/acme-labs/" in key for key in written)
    for key in written:
        with pytest.raises(ClientError):
            s3.get_object(Bucket=sts_server.bucket, Key=key)


def test_a_role_sts_will_not_give_is_a_permission_error_not_a_storage_failure(sts_server: Any) -> None:
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"AWS": ["arn:aws:iam:::user/someone-else"]}, "Action": ["sts:AssumeRole"]}
        ],
    }
    allow = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": ["*"]}]}
    role = sts_server.create_role(f"not-ours-{uuid.uuid4().hex[:6]}", trust=trust, policy=allow)
    root = FsspecToolResultStore(
        f"s3://{sts_server.bucket}/{PREFIX}",
        storage_options=sts_server.storage_options(),
        credentials=AssumeRoleCredentials(role),
    )
    with pytest.raises(StoragePermissionError, match="STS answered 403") as raised:
        root.for_session("acme", "s1").write(key="call-1", content="x")
    assert role not in str(raised.value) and raised.value.location
