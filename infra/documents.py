"""
Render the documents in this folder's CloudFormation templates with concrete values, in the shapes the S3 and IAM
APIs take.

The templates are the single source of every document: the bucket's public access block, ownership controls,
encryption, lifecycle rules and TLS-only policy (``results-bucket.yaml``) and the per-tenant IAM policies
(``tenant-policy.yaml``). CloudFormation deploys them as written; this module resolves the same text for everything
else:

- the tests in ``tests/infra`` apply them to a bucket on moto's S3 server through the S3 API and read them back
  (moto's CloudFormation skips ``AWS::S3::BucketPolicy`` and ignores ``LifecycleConfiguration``, so a stack
  deployed to moto would prove little), and attach the tenant policy to IAM users with moto's IAM enforcement on;
- operators who do not use CloudFormation print them as JSON for their own tooling::

      python infra/documents.py tenant-policy --bucket acme-agent-results --prefix prod --tenant acme
      python infra/documents.py bucket --bucket acme-agent-results --expiration-days 7

Only the intrinsic functions the templates use are resolved (``Ref``, ``Fn::Sub``, ``Fn::GetAtt``, ``Fn::If``,
``Fn::Equals``, ``Fn::Not``, ``Fn::And``, ``Fn::Or``, ``Fn::Join``); anything else raises, so a template change
that this module cannot honour fails loudly instead of rendering something else. Parameters are checked against the
template's own constraints (``AllowedPattern``, ``MinValue``/``MaxValue``, lengths, ``AllowedValues``), as
CloudFormation checks them, so a value the stack would refuse is refused here too.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "BUCKET_TEMPLATE",
    "TENANT_TEMPLATE",
    "BucketDocuments",
    "TemplateError",
    "apply_bucket_documents",
    "bucket_documents",
    "load_template",
    "tenant_policies",
]

INFRA_DIR = Path(__file__).resolve().parent
BUCKET_TEMPLATE = INFRA_DIR / "results-bucket.yaml"
TENANT_TEMPLATE = INFRA_DIR / "tenant-policy.yaml"

# Stand-ins for the stack's own identity; they only appear in names and log prefixes, never in a security decision.
DEFAULT_ACCOUNT_ID = "123456789012"
DEFAULT_STACK_NAME = "offload-results"


class TemplateError(ValueError):
    """A template cannot be rendered: a parameter breaks its constraints, or the template uses something unknown."""


class _NoValue:
    """``AWS::NoValue``: the property or list item it stands for is left out."""

    def __repr__(self) -> str:
        return "AWS::NoValue"


_NO_VALUE = _NoValue()


# YAML with CloudFormation's short-form tags (!Ref, !Sub, ...), read into their long form ({"Fn::Sub": ...}).


class _TemplateLoader(yaml.SafeLoader):
    """A safe YAML loader that also understands CloudFormation's short-form intrinsic tags."""


def _construct_intrinsic(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> dict[str, Any]:
    name = "Ref" if tag_suffix == "Ref" else f"Fn::{tag_suffix}"
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if name == "Fn::GetAtt":
            # !GetAtt Resource.Attribute is short for ["Resource", "Attribute"].
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {name: value}


_TemplateLoader.add_multi_constructor("!", _construct_intrinsic)


def load_template(path: Path | str) -> dict[str, Any]:
    """
    Read a CloudFormation template written in YAML, short-form tags included.

    :param path: The template file.
    :returns: The template as plain data, with intrinsic functions in their long form (``{"Fn::Sub": ...}``).
    :raises TemplateError: If the file is not a mapping with ``Resources``.
    """
    with open(path, encoding="utf-8") as file:
        template = yaml.load(file, Loader=_TemplateLoader)  # noqa: S506 - a SafeLoader subclass
    if not isinstance(template, dict) or "Resources" not in template:
        raise TemplateError(f"{path} is not a CloudFormation template (no Resources).")
    return template


# Intrinsic functions, resolved against concrete parameter values.


@dataclass
class _Renderer:
    template: Mapping[str, Any]
    parameters: dict[str, Any]
    pseudo: dict[str, str]
    # Logical id -> attribute -> value; "Ref" is what !Ref of the resource gives.
    resources: dict[str, dict[str, str]] = field(default_factory=dict)
    _conditions: dict[str, bool] = field(default_factory=dict)

    def condition(self, name: str) -> bool:
        if name not in self._conditions:
            definitions = self.template.get("Conditions", {})
            if name not in definitions:
                raise TemplateError(f"Unknown condition {name!r}.")
            self._conditions[name] = bool(self.resolve(definitions[name]))
        return self._conditions[name]

    def ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return _NO_VALUE
        if name in self.pseudo:
            return self.pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        if name in self.resources:
            return self.resources[name]["Ref"]
        raise TemplateError(f"Cannot resolve Ref {name!r}.")

    def get_att(self, resource: str, attribute: str) -> str:
        try:
            return self.resources[resource][attribute]
        except KeyError:
            raise TemplateError(f"Cannot resolve Fn::GetAtt {resource}.{attribute}.") from None

    def sub(self, argument: Any) -> str:
        if isinstance(argument, list):
            text, variables = argument[0], {key: self.resolve(value) for key, value in argument[1].items()}
        else:
            text, variables = argument, {}

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"  # ${!Literal} is the escape for a literal ${Literal}
            if name in variables:
                return str(variables[name])
            if "." in name and not name.startswith("AWS::"):
                resource, attribute = name.split(".", 1)
                return self.get_att(resource, attribute)
            return str(self.ref(name))

        return re.sub(r"\$\{([^}]+)\}", replace, text)

    def resolve(self, value: Any) -> Any:
        if isinstance(value, list):
            items = [self.resolve(item) for item in value]
            return [item for item in items if item is not _NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            [(key, argument)] = value.items()
            if key == "Ref":
                return self.ref(argument)
            if key == "Condition" and isinstance(argument, str):
                return self.condition(argument)
            if key.startswith("Fn::"):
                return self._function(key, argument)
        resolved = {key: self.resolve(item) for key, item in value.items()}
        return {key: item for key, item in resolved.items() if item is not _NO_VALUE}

    def _function(self, name: str, argument: Any) -> Any:
        if name == "Fn::Sub":
            return self.sub(argument)
        if name == "Fn::GetAtt":
            return self.get_att(argument[0], argument[1])
        if name == "Fn::If":
            condition, when_true, when_false = argument
            return self.resolve(when_true if self.condition(condition) else when_false)
        if name == "Fn::Equals":
            left, right = (self.resolve(item) for item in argument)
            return str(left) == str(right)
        if name == "Fn::Not":
            return not self.resolve(argument[0])
        if name == "Fn::And":
            return all(self.resolve(item) for item in argument)
        if name == "Fn::Or":
            return any(self.resolve(item) for item in argument)
        if name == "Fn::Join":
            separator, items = argument
            return str(separator).join(str(item) for item in self.resolve(items))
        raise TemplateError(f"{name} is not supported by infra/documents.py; extend it with the template.")


def _parameters(template: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """Apply defaults and check each value against the template's constraints, as CloudFormation does."""
    declared: Mapping[str, Mapping[str, Any]] = template.get("Parameters", {})
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise TemplateError(f"Unknown parameters {unknown}; the template declares {sorted(declared)}.")
    values: dict[str, Any] = {}
    for name, spec in declared.items():
        if name in given and given[name] is not None:
            value = given[name]
        elif "Default" in spec:
            value = spec["Default"]
        else:
            raise TemplateError(f"Parameter {name} is required: {spec.get('Description', '').strip()}")
        values[name] = _checked(name, value, spec)
    return values


def _checked(name: str, value: Any, spec: Mapping[str, Any]) -> Any:
    hint = f" ({spec['ConstraintDescription']})" if "ConstraintDescription" in spec else ""
    if spec.get("Type") == "Number":
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TemplateError(f"Parameter {name} must be a number, got {value!r}.")
        try:
            number = float(value)
        except ValueError:
            raise TemplateError(f"Parameter {name} must be a number, got {value!r}.") from None
        if "MinValue" in spec and number < float(spec["MinValue"]):
            raise TemplateError(f"Parameter {name} must be at least {spec['MinValue']}, got {value!r}.")
        if "MaxValue" in spec and number > float(spec["MaxValue"]):
            raise TemplateError(f"Parameter {name} must be at most {spec['MaxValue']}, got {value!r}.")
        return int(number) if number.is_integer() else number
    if not isinstance(value, str):
        raise TemplateError(f"Parameter {name} must be a string, got {type(value).__name__}.")
    if "MinLength" in spec and len(value) < int(spec["MinLength"]):
        raise TemplateError(f"Parameter {name} must be at least {spec['MinLength']} characters long.")
    if "MaxLength" in spec and len(value) > int(spec["MaxLength"]):
        raise TemplateError(f"Parameter {name} must be at most {spec['MaxLength']} characters long.")
    # CloudFormation matches AllowedPattern against the whole value.
    if "AllowedPattern" in spec and not re.fullmatch(spec["AllowedPattern"], value):
        raise TemplateError(f"Parameter {name} does not match {spec['AllowedPattern']}: {value!r}{hint}.")
    if "AllowedValues" in spec and value not in spec["AllowedValues"]:
        raise TemplateError(f"Parameter {name} must be one of {spec['AllowedValues']}, got {value!r}.")
    return value


def _renderer(
    template: Mapping[str, Any],
    parameters: Mapping[str, Any],
    *,
    partition: str,
    region: str,
    account_id: str,
    stack_name: str,
) -> _Renderer:
    return _Renderer(
        template=template,
        parameters=_parameters(template, parameters),
        pseudo={
            "AWS::Partition": partition,
            "AWS::Region": region,
            "AWS::AccountId": account_id,
            "AWS::StackName": stack_name,
            "AWS::URLSuffix": "amazonaws.com",
        },
    )


def _active_resource(renderer: _Renderer, logical_id: str) -> dict[str, Any] | None:
    resource: dict[str, Any] = renderer.template["Resources"][logical_id]
    if "Condition" in resource and not renderer.condition(resource["Condition"]):
        return None
    return resource


# The results bucket.


@dataclass(frozen=True)
class BucketDocuments:
    """
    The results bucket's settings from ``results-bucket.yaml``, in the shapes boto3's S3 client takes.

    :param bucket: The bucket name.
    :param public_access_block: For ``put_public_access_block(PublicAccessBlockConfiguration=...)``.
    :param ownership_controls: For ``put_bucket_ownership_controls(OwnershipControls=...)``.
    :param encryption: For ``put_bucket_encryption(ServerSideEncryptionConfiguration=...)``.
    :param lifecycle: For ``put_bucket_lifecycle_configuration(LifecycleConfiguration=...)``.
    :param policy: The bucket policy document, for ``put_bucket_policy(Policy=json.dumps(...))``.
    :param logging: For ``put_bucket_logging(BucketLoggingStatus=...)``, or ``None`` without a log bucket.
    """

    bucket: str
    public_access_block: dict[str, bool]
    ownership_controls: dict[str, Any]
    encryption: dict[str, Any]
    lifecycle: dict[str, Any]
    policy: dict[str, Any]
    logging: dict[str, Any] | None


def bucket_documents(
    bucket: str,
    *,
    kms_key_arn: str = "",
    expiration_days: int | None = None,
    abort_incomplete_multipart_upload_days: int | None = None,
    expiration_prefix: str = "",
    access_log_bucket: str = "",
    partition: str = "aws",
    region: str = "us-east-1",
    account_id: str = DEFAULT_ACCOUNT_ID,
    stack_name: str = DEFAULT_STACK_NAME,
) -> BucketDocuments:
    """
    Render the results bucket's settings from ``results-bucket.yaml`` for one bucket.

    :param bucket: The bucket name (the template's ``BucketName``).
    :param kms_key_arn: A KMS key ARN for SSE-KMS; empty for SSE-S3.
    :param expiration_days: Days before results expire; ``None`` takes the template's default.
    :param abort_incomplete_multipart_upload_days: Days before incomplete uploads are aborted; ``None`` for the
        template's default.
    :param expiration_prefix: Expire only objects under this prefix; empty for the whole bucket.
    :param access_log_bucket: Bucket for S3 server access logs; empty for none.
    :param partition: The AWS partition (``aws``, ``aws-cn``, ``aws-us-gov``).
    :param region: The region, for region-dependent values.
    :param account_id: The account id, for account-dependent values.
    :param stack_name: The stack name, used in the access-log prefix.
    :returns: The documents, ready for boto3.
    :raises TemplateError: If a value breaks the template's parameter constraints.
    """
    template = load_template(BUCKET_TEMPLATE)
    renderer = _renderer(
        template,
        {
            "BucketName": bucket,
            "KmsKeyArn": kms_key_arn,
            "ExpirationDays": expiration_days,
            "AbortIncompleteMultipartUploadDays": abort_incomplete_multipart_upload_days,
            "ExpirationPrefix": expiration_prefix,
            "AccessLogBucketName": access_log_bucket,
        },
        partition=partition,
        region=region,
        account_id=account_id,
        stack_name=stack_name,
    )
    renderer.resources["ResultsBucket"] = {"Ref": bucket, "Arn": f"arn:{partition}:s3:::{bucket}"}
    properties = renderer.resolve(template["Resources"]["ResultsBucket"]["Properties"])
    policy = renderer.resolve(template["Resources"]["ResultsBucketPolicy"]["Properties"]["PolicyDocument"])
    logging = properties.get("LoggingConfiguration")
    return BucketDocuments(
        bucket=bucket,
        public_access_block=dict(properties["PublicAccessBlockConfiguration"]),
        ownership_controls=dict(properties["OwnershipControls"]),
        encryption=_encryption(properties["BucketEncryption"]),
        lifecycle=_lifecycle(properties["LifecycleConfiguration"]),
        policy=policy,
        logging=(
            {
                "LoggingEnabled": {
                    "TargetBucket": logging["DestinationBucketName"],
                    "TargetPrefix": logging["LogFilePrefix"],
                }
            }
            if logging
            else None
        ),
    )


def _encryption(config: Mapping[str, Any]) -> dict[str, Any]:
    rules = []
    for rule in config["ServerSideEncryptionConfiguration"]:
        _only(rule, {"ServerSideEncryptionByDefault", "BucketKeyEnabled"}, "encryption rule")
        api_rule: dict[str, Any] = {"ApplyServerSideEncryptionByDefault": dict(rule["ServerSideEncryptionByDefault"])}
        if "BucketKeyEnabled" in rule:
            api_rule["BucketKeyEnabled"] = bool(rule["BucketKeyEnabled"])
        rules.append(api_rule)
    return {"Rules": rules}


def _lifecycle(config: Mapping[str, Any]) -> dict[str, Any]:
    # CloudFormation's rule properties differ from the S3 API's; translate the ones the template uses and refuse the
    # rest, so a rule added to the template cannot be silently dropped here.
    rules = []
    for rule in config["Rules"]:
        _only(rule, {"Id", "Status", "Prefix", "ExpirationInDays", "AbortIncompleteMultipartUpload"}, "lifecycle rule")
        api_rule: dict[str, Any] = {
            "ID": rule["Id"],
            "Status": rule["Status"],
            "Filter": {"Prefix": rule.get("Prefix", "")},
        }
        if "ExpirationInDays" in rule:
            api_rule["Expiration"] = {"Days": int(rule["ExpirationInDays"])}
        if "AbortIncompleteMultipartUpload" in rule:
            days = int(rule["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"])
            api_rule["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": days}
        rules.append(api_rule)
    return {"Rules": rules}


def _only(mapping: Mapping[str, Any], allowed: set[str], what: str) -> None:
    extra = sorted(set(mapping) - allowed)
    if extra:
        raise TemplateError(f"The {what} uses {extra}, which infra/documents.py does not translate yet.")


def apply_bucket_documents(client: Any, documents: BucketDocuments) -> None:
    """
    Apply the bucket's settings through the S3 API, in the order that keeps the bucket safe at every step.

    The public access block goes first (nothing public can be attached afterwards), the bucket policy last.

    :param client: A boto3 S3 client.
    :param documents: The documents from `bucket_documents`.
    :raises botocore.exceptions.ClientError: If S3 refuses a setting.
    """
    bucket = documents.bucket
    client.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration=documents.public_access_block)
    client.put_bucket_ownership_controls(Bucket=bucket, OwnershipControls=documents.ownership_controls)
    client.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration=documents.encryption)
    client.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration=documents.lifecycle)
    if documents.logging is not None:
        client.put_bucket_logging(Bucket=bucket, BucketLoggingStatus=documents.logging)
    client.put_bucket_policy(Bucket=bucket, Policy=json.dumps(documents.policy))


# The per-tenant policy.


def tenant_policies(
    bucket: str,
    prefix: str,
    tenant: str,
    *,
    kms_key_arn: str = "",
    partition: str = "aws",
    region: str = "us-east-1",
    account_id: str = DEFAULT_ACCOUNT_ID,
) -> dict[str, dict[str, Any]]:
    """
    Render the IAM policy documents of ``tenant-policy.yaml`` for one tenant.

    :param bucket: The results bucket.
    :param prefix: The store's root inside the bucket (``"prod"`` for ``s3://<bucket>/prod``).
    :param tenant: The tenant id, as given to ``FsspecToolResultStore.for_session``.
    :param kms_key_arn: The bucket's KMS key under SSE-KMS; empty otherwise.
    :param partition: The AWS partition.
    :param region: The region (the KMS policy names the S3 endpoint of this region).
    :param account_id: The account id.
    :returns: Policy documents by logical id: ``TenantPolicy`` always, ``TenantEncryptionKeyPolicy`` with a KMS key.
    :raises TemplateError: If a value breaks the template's constraints (e.g. a tenant id with ``*`` or ``/``).
    """
    template = load_template(TENANT_TEMPLATE)
    renderer = _renderer(
        template,
        {"BucketName": bucket, "Prefix": prefix, "TenantId": tenant, "KmsKeyArn": kms_key_arn},
        partition=partition,
        region=region,
        account_id=account_id,
        stack_name=f"offload-tenant-{tenant}",
    )
    documents = {}
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] != "AWS::IAM::ManagedPolicy" or _active_resource(renderer, logical_id) is None:
            continue
        documents[logical_id] = renderer.resolve(resource["Properties"]["PolicyDocument"])
    return documents


def main(argv: Sequence[str] | None = None) -> int:
    """
    Print rendered documents as JSON: ``python infra/documents.py {bucket,tenant-policy} ...``.

    :param argv: Command-line arguments; ``None`` reads ``sys.argv``.
    :returns: The exit code: 0, or 2 when a value breaks the template's constraints.
    """
    parser = argparse.ArgumentParser(prog="python infra/documents.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    bucket = commands.add_parser("bucket", help="the results bucket's settings, as S3 API payloads")
    bucket.add_argument("--bucket", required=True)
    bucket.add_argument("--kms-key-arn", default="")
    bucket.add_argument("--expiration-days", type=int)
    bucket.add_argument("--expiration-prefix", default="")
    tenant = commands.add_parser("tenant-policy", help="a tenant's IAM policy documents")
    tenant.add_argument("--bucket", required=True)
    tenant.add_argument("--prefix", required=True)
    tenant.add_argument("--tenant", required=True)
    tenant.add_argument("--kms-key-arn", default="")
    for command in (bucket, tenant):
        command.add_argument("--partition", default="aws")
        command.add_argument("--region", default="us-east-1")
    args = parser.parse_args(argv)
    try:
        if args.command == "bucket":
            documents = bucket_documents(
                args.bucket,
                kms_key_arn=args.kms_key_arn,
                expiration_days=args.expiration_days,
                expiration_prefix=args.expiration_prefix,
                partition=args.partition,
                region=args.region,
            )
            output: Any = {name: value for name, value in vars(documents).items() if name != "bucket"}
        else:
            output = tenant_policies(
                args.bucket,
                args.prefix,
                args.tenant,
                kms_key_arn=args.kms_key_arn,
                partition=args.partition,
                region=args.region,
            )
    except TemplateError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(output, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
