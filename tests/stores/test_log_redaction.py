"""
No secret in any log record at any level: with every logger at DEBUG, a tenant's write and read on moto (STS
credentials and SSE-C keys per tenant, both engines) leave neither the tenant's derived key nor its STS secret key
or session token in any record, though botocore and aiobotocore log requests, signatures and response bodies.
"""

import base64
import logging
import uuid
from collections.abc import Iterator

import pytest
from haystack.utils import Secret

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores import AssumeRoleCredentials, TenantKeys, log_redaction
from haystack_integrations.offload.testing.local_s3 import LocalS3Server

pytestmark = pytest.mark.s3

ENGINES = ["obstore", "fsspec"]
MASTER = "k" * 24 + uuid.uuid4().hex


@pytest.fixture
def every_logger_at_debug(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Root and every logger created so far at DEBUG (restored afterwards), captured by `caplog`."""
    caplog.set_level(logging.DEBUG)
    loggers = [logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
    yield caplog
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)


def _spellings(secret: bytes | str) -> set[str]:
    """How a secret could appear in a message: as itself, in base64, as a bytes repr, in hex."""
    raw = secret.encode() if isinstance(secret, str) else secret
    spelled = {base64.b64encode(raw).decode(), repr(raw)[2:-1], raw.hex()}
    if isinstance(secret, str):
        spelled.add(secret)
    return {value for value in spelled if len(value) >= 16}


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_tenants_keys_and_sts_credentials_are_in_no_debug_record(
    s3_server: LocalS3Server, every_logger_at_debug: pytest.LogCaptureFixture, engine: str
) -> None:
    keys = TenantKeys(Secret.from_token(MASTER))
    source = AssumeRoleCredentials("arn:aws:iam::123456789012:role/offload-tenants")
    prefix = uuid.uuid4().hex[:8]
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{prefix}",
        storage_options=s3_server.storage_options(),
        engine=engine,
        encryption=keys,
        credentials=source,
    )
    session = root.for_session("acme", "s1")
    reference = await session.write_async(key="call-1", content="a secret-free log")
    assert await session.read_async(reference) == "a secret-free log"
    assert session.read(session.write(key="call-2", content="sync too")) == "sync too"

    bucket = s3_server.bucket_url.removeprefix("s3://").split("/")[0]
    credentials = source.current(bucket, f"{prefix}/acme")
    assert credentials is not None and source.calls == 1
    secrets = {
        "the tenant's SSE-C key": _spellings(keys.key_for("acme")),
        "the STS secret key": _spellings(credentials.secret),
        "the STS session token": _spellings(credentials.token),
    }
    records = every_logger_at_debug.records
    names = {record.name.split(".")[0] for record in records}
    assert "botocore" in names  # the loggers that used to carry the secrets did log
    handler = logging.Formatter("%(name)s %(levelname)s %(message)s")
    for record in records:
        text = handler.format(record)
        for what, spelled in secrets.items():
            assert not any(value in text for value in spelled), f"{what} in a {record.name} record: {text[:300]}"


@pytest.mark.parametrize(
    ("message", "kept"),
    [
        ("headers={'Authorization': b'AWS4-HMAC-SHA256 Credential=ASIA1/x, Signature=0a1b2c3d4e'}", "Credential=ASIA1"),
        ("?X-Amz-Security-Token=FQo%2Bsecret&X-Amz-Signature=0a1b2c3d4e&x=1", "&x=1"),
        ("{'SSECustomerKey': b'\\x9a\\'0a1b2c3d4e', 'SSECustomerAlgorithm': 'AES256'}", "'AES256'"),
        ('{"SecretAccessKey": "0a1b2c3d4e", "SessionToken": "0a1b2c3d4e"}', '"SecretAccessKey": "<redacted>"'),
        ("Signature:\n0a1b2c3d4e", "Signature:\n<redacted>"),
    ],
)
def test_presigned_urls_signatures_and_raw_keys_are_redacted_too(message: str, kept: str) -> None:
    redacted = log_redaction.redact(message)
    assert "0a1b2c3d4e" not in redacted and "secret" not in redacted and kept in redacted
