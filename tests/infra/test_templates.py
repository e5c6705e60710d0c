"""Rendering ``infra/``'s templates: parameters are checked as CloudFormation checks them, documents come out whole."""

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

INFRA_DIR = Path(__file__).resolve().parents[2] / "infra"


def test_tenant_policy_names_only_the_tenants_prefix(infra_documents: ModuleType) -> None:
    documents = infra_documents.tenant_policies("acme-agent-results", "prod/eu", "acme")

    assert list(documents) == ["TenantPolicy"]  # no KMS policy without a key
    statements = {statement["Sid"]: statement for statement in documents["TenantPolicy"]["Statement"]}
    objects = statements["TenantObjects"]
    assert objects["Effect"] == "Allow"
    assert objects["Resource"] == "arn:aws:s3:::acme-agent-results/prod/eu/acme/*"
    assert set(objects["Action"]) == {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"}
    listing = statements["TenantListing"]
    assert (listing["Action"], listing["Resource"]) == ("s3:ListBucket", "arn:aws:s3:::acme-agent-results")
    assert listing["Condition"] == {"StringLike": {"s3:prefix": "prod/eu/acme/*"}}
    # Nothing else is granted: no wildcard actions, no other bucket.
    assert all("*" not in action for statement in statements.values() for action in _actions(statement))


def _actions(statement: dict[str, object]) -> list[str]:
    actions = statement["Action"]
    return [actions] if isinstance(actions, str) else list(actions)  # type: ignore[arg-type]


def test_tenant_kms_policy_comes_with_a_key(infra_documents: ModuleType) -> None:
    key = "arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    documents = infra_documents.tenant_policies(
        "acme-agent-results", "prod", "acme", kms_key_arn=key, region="eu-west-1"
    )

    [statement] = documents["TenantEncryptionKeyPolicy"]["Statement"]
    assert statement["Resource"] == key
    assert set(statement["Action"]) == {"kms:GenerateDataKey", "kms:Decrypt"}
    assert statement["Condition"] == {"StringEquals": {"kms:ViaService": "s3.eu-west-1.amazonaws.com"}}


@pytest.mark.parametrize(
    "tenant",
    ["a*", "acme/other", "..", ".hidden", "", "x?", "${aws:username}", "a" * 129],
    ids=["wildcard", "separator", "dotdot", "hidden", "empty", "question", "policy-variable", "too-long"],
)
def test_tenant_ids_the_store_would_refuse_are_refused(infra_documents: ModuleType, tenant: str) -> None:
    with pytest.raises(infra_documents.TemplateError, match="TenantId"):
        infra_documents.tenant_policies("acme-agent-results", "prod", tenant)


@pytest.mark.parametrize(
    ("arguments", "parameter"),
    [
        ({"expiration_days": -1}, "ExpirationDays"),
        ({"expiration_days": 3651}, "ExpirationDays"),
        ({"abort_incomplete_multipart_upload_days": 0}, "AbortIncompleteMultipartUploadDays"),
        ({"expiration_prefix": "/prod"}, "ExpirationPrefix"),
        ({"expiration_prefix": "prod/"}, "ExpirationPrefix"),
        ({"kms_key_arn": "alias/results"}, "KmsKeyArn"),
    ],
)
def test_bucket_parameters_are_checked(
    infra_documents: ModuleType, arguments: dict[str, object], parameter: str
) -> None:
    with pytest.raises(infra_documents.TemplateError, match=parameter):
        infra_documents.bucket_documents("acme-agent-results", **arguments)


def test_bucket_name_is_checked(infra_documents: ModuleType) -> None:
    with pytest.raises(infra_documents.TemplateError, match="BucketName"):
        infra_documents.bucket_documents("Not_A_Bucket")


def test_prefix_is_required_and_checked(infra_documents: ModuleType) -> None:
    with pytest.raises(infra_documents.TemplateError, match="Prefix"):
        infra_documents.tenant_policies("acme-agent-results", "prod/*", "acme")
    with pytest.raises(infra_documents.TemplateError, match="Prefix"):
        infra_documents.tenant_policies("acme-agent-results", "", "acme")


def test_unknown_intrinsic_functions_fail_loudly(infra_documents: ModuleType) -> None:
    template = {"Resources": {}, "Parameters": {}}
    renderer = infra_documents._renderer(
        template, {}, partition="aws", region="us-east-1", account_id="123456789012", stack_name="s"
    )
    with pytest.raises(infra_documents.TemplateError, match="Fn::ImportValue"):
        renderer.resolve({"Fn::ImportValue": "shared-bucket"})


def test_every_template_parses_and_every_resource_is_rendered(infra_documents: ModuleType) -> None:
    for path in sorted(INFRA_DIR.glob("*.yaml")):
        template = infra_documents.load_template(path)
        assert template["AWSTemplateFormatVersion"] == "2010-09-09"
    bucket = infra_documents.load_template(infra_documents.BUCKET_TEMPLATE)
    assert set(bucket["Resources"]) == {"ResultsBucket", "ResultsBucketPolicy"}
    tenant = infra_documents.load_template(infra_documents.TENANT_TEMPLATE)
    assert set(tenant["Resources"]) == {"TenantPolicy", "TenantEncryptionKeyPolicy"}


def test_command_line_prints_documents_and_refuses_bad_values() -> None:
    script = str(INFRA_DIR / "documents.py")
    printed = subprocess.run(
        [
            sys.executable,
            script,
            "tenant-policy",
            "--bucket",
            "acme-agent-results",
            "--prefix",
            "prod",
            "--tenant",
            "acme",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(printed.stdout)["TenantPolicy"]["Statement"][0]["Resource"].endswith("/prod/acme/*")

    refused = subprocess.run(
        [sys.executable, script, "bucket", "--bucket", "acme-agent-results", "--expiration-days", "3651"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "ExpirationDays" in refused.stderr
