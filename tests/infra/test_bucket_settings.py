"""
The results bucket's settings, rendered from ``infra/results-bucket.yaml``, applied to a bucket on moto's S3 server
through the S3 API and read back.

A stack deployed to moto would prove little (its CloudFormation skips ``AWS::S3::BucketPolicy`` and ignores
``LifecycleConfiguration``), so the template's own documents are applied with the calls an operator would make.
"""

import json
import uuid
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore, StoragePermissionError

if TYPE_CHECKING:
    from haystack_integrations.offload.testing.local_s3 import LocalS3Server

pytestmark = pytest.mark.s3


@pytest.fixture
def bucket(s3_server: "LocalS3Server") -> str:
    name = f"results-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


def _read_back(client: Any, bucket: str) -> dict[str, Any]:
    return {
        "public_access_block": client.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"],
        "ownership_controls": client.get_bucket_ownership_controls(Bucket=bucket)["OwnershipControls"],
        "encryption": client.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"],
        "lifecycle": client.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"],
        "policy": json.loads(client.get_bucket_policy(Bucket=bucket)["Policy"]),
    }


def test_default_settings_read_back_as_rendered(
    s3_server: "LocalS3Server", infra_documents: ModuleType, bucket: str
) -> None:
    documents = infra_documents.bucket_documents(bucket)
    infra_documents.apply_bucket_documents(s3_server.client(), documents)

    applied = _read_back(s3_server.client(), bucket)

    assert applied["public_access_block"] == {
        "BlockPublicAcls": True,
        "IgnorePublicAcls": True,
        "BlockPublicPolicy": True,
        "RestrictPublicBuckets": True,
    }
    assert applied["ownership_controls"] == {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]}
    assert applied["encryption"] == {
        "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}, "BucketKeyEnabled": False}]
    }
    rules = {rule["ID"]: rule for rule in applied["lifecycle"]}
    assert rules["expire-offloaded-results"]["Expiration"] == {"Days": 30}  # the template's default
    assert rules["expire-offloaded-results"]["Filter"] == {"Prefix": ""}
    assert rules["abort-incomplete-multipart-uploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
    assert all(rule["Status"] == "Enabled" for rule in rules.values())
    assert applied["policy"] == documents.policy


def test_policy_denies_every_request_without_tls(infra_documents: ModuleType) -> None:
    policy = infra_documents.bucket_documents("acme-agent-results", partition="aws-cn").policy
    statements = {statement["Sid"]: statement for statement in policy["Statement"]}

    insecure = statements["DenyInsecureTransport"]
    assert (insecure["Effect"], insecure["Principal"], insecure["Action"]) == ("Deny", "*", "s3:*")
    assert insecure["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    # Both the bucket (listings) and every object, in the stack's partition.
    assert insecure["Resource"] == ["arn:aws-cn:s3:::acme-agent-results", "arn:aws-cn:s3:::acme-agent-results/*"]
    assert statements["DenyOutdatedTls"]["Condition"] == {"NumericLessThan": {"s3:TlsVersion": "1.2"}}
    assert all(statement["Effect"] == "Deny" for statement in statements.values())


def test_plain_http_object_requests_are_refused_once_the_policy_is_applied(
    s3_server: "LocalS3Server", infra_documents: ModuleType, bucket: str
) -> None:
    # The local server speaks plain HTTP. AWS refuses these requests because aws:SecureTransport is false; moto
    # does not evaluate that condition and applies the Deny to every object request, TLS or not. So this shows the
    # policy is in force on object reads and writes, not that a TLS client would pass.
    store = FsspecToolResultStore(f"s3://{bucket}/prod", storage_options=s3_server.storage_options())
    session = store.for_session("acme", "chat-1")
    reference = session.write(key="before.txt", content="written before the policy")

    infra_documents.apply_bucket_documents(s3_server.client(), infra_documents.bucket_documents(bucket))

    with pytest.raises(StoragePermissionError):
        session.read(reference)
    with pytest.raises(StoragePermissionError):
        session.write(key="after.txt", content="x")


@pytest.mark.parametrize(("days", "prefix"), [(1, ""), (7, "prod"), (3650, "prod/eu")])
def test_lifecycle_expiry_is_configurable(
    s3_server: "LocalS3Server", infra_documents: ModuleType, bucket: str, days: int, prefix: str
) -> None:
    documents = infra_documents.bucket_documents(
        bucket, expiration_days=days, expiration_prefix=prefix, abort_incomplete_multipart_upload_days=3
    )
    s3_server.client().put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration=documents.lifecycle)

    rules = {rule["ID"]: rule for rule in _read_back_lifecycle(s3_server, bucket)}
    assert rules["expire-offloaded-results"]["Expiration"] == {"Days": days}
    # A prefix filter ends in "/" so that "prod" does not also expire "production/...".
    assert rules["expire-offloaded-results"]["Filter"] == {"Prefix": f"{prefix}/" if prefix else ""}
    assert rules["abort-incomplete-multipart-uploads"]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 3}


def test_lifecycle_expiry_can_be_left_to_purges(
    s3_server: "LocalS3Server", infra_documents: ModuleType, bucket: str
) -> None:
    # ExpirationDays=0: no expiry rule (results stay until a purge takes them), and unfinished uploads still go.
    documents = infra_documents.bucket_documents(bucket, expiration_days=0, expiration_prefix="prod")
    s3_server.client().put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration=documents.lifecycle)

    rules = {rule["ID"]: rule for rule in _read_back_lifecycle(s3_server, bucket)}
    assert set(rules) == {"abort-incomplete-multipart-uploads"}


def _read_back_lifecycle(s3_server: "LocalS3Server", bucket: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = s3_server.client().get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    return rules


def test_sse_s3_encrypts_new_results(s3_server: "LocalS3Server", infra_documents: ModuleType, bucket: str) -> None:
    documents = infra_documents.bucket_documents(bucket)
    client = s3_server.client()
    client.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration=documents.encryption)

    store = FsspecToolResultStore(f"s3://{bucket}/prod", storage_options=s3_server.storage_options())
    reference = store.for_session("acme", "chat-1").write(key="k.txt", content="secret")

    head = client.head_object(Bucket=bucket, Key=f"prod/acme/chat-1/{reference}")
    assert head["ServerSideEncryption"] == "AES256"


def test_sse_kms_uses_the_given_key_with_a_bucket_key(
    s3_server: "LocalS3Server", infra_documents: ModuleType, bucket: str
) -> None:
    key_arn = s3_server.client("kms").create_key(Description="offload results")["KeyMetadata"]["Arn"]
    documents = infra_documents.bucket_documents(bucket, kms_key_arn=key_arn)
    client = s3_server.client()
    infra_documents.apply_bucket_documents(client, documents)

    assert _read_back(client, bucket)["encryption"] == {
        "Rules": [
            {
                "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key_arn},
                "BucketKeyEnabled": True,
            }
        ]
    }
    # Objects written from now on carry the key (checked on a second bucket with the same encryption only: the
    # TLS-only policy refuses plain-HTTP object requests on this one).
    other = f"{bucket}-kms"
    s3_server.create_bucket(other)
    client.put_bucket_encryption(Bucket=other, ServerSideEncryptionConfiguration=documents.encryption)
    store = FsspecToolResultStore(f"s3://{other}/prod", storage_options=s3_server.storage_options())
    reference = store.for_session("acme", "chat-1").write(key="k.txt", content="secret")
    head = client.head_object(Bucket=other, Key=f"prod/acme/chat-1/{reference}")
    assert (head["ServerSideEncryption"], head["SSEKMSKeyId"], head["BucketKeyEnabled"]) == ("aws:kms", key_arn, True)


def test_access_logging_is_applied_when_a_log_bucket_is_given(
    s3_server: "LocalS3Server", infra_documents: ModuleType, bucket: str
) -> None:
    assert infra_documents.bucket_documents(bucket).logging is None
    log_bucket = f"{bucket}-logs"
    s3_server.create_bucket(log_bucket)
    # What AWS (and moto) require of the log bucket: the logging service may write under the prefix.
    log_delivery = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "logging.s3.amazonaws.com"},
                "Action": "s3:PutObject",
                "Resource": f"arn:aws:s3:::{log_bucket}/s3-access/acme-results/*",
            }
        ],
    }
    s3_server.client().put_bucket_policy(Bucket=log_bucket, Policy=json.dumps(log_delivery))
    documents = infra_documents.bucket_documents(bucket, access_log_bucket=log_bucket, stack_name="acme-results")

    s3_server.client().put_bucket_logging(Bucket=bucket, BucketLoggingStatus=documents.logging)

    enabled = s3_server.client().get_bucket_logging(Bucket=bucket)["LoggingEnabled"]
    assert (enabled["TargetBucket"], enabled["TargetPrefix"]) == (log_bucket, "s3-access/acme-results/")
