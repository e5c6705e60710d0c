"""
Credentials per tenant: STS ``AssumeRole`` with a session policy that reaches only the tenant's prefix, cached per
tenant and renewed before they expire.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from haystack.core.serialization import default_from_dict, default_to_dict

from haystack_integrations.offload.errors import StorageError, StoragePermissionError
from haystack_integrations.offload.stores import log_redaction
from haystack_integrations.offload.stores.options import DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT

logger = logging.getLogger(__name__)

# STS refuses shorter sessions; AWS allows up to the role's maximum (one hour by default).
MIN_DURATION = timedelta(seconds=900)
_TAG_KEY = re.compile(r"[\w .:/=+\-@]{1,128}")
# Attempts per STS call: botocore retries 5xx, throttling, resets and timeouts (never a refusal), with backoff.
STS_ATTEMPTS = 3
# Session names: STS takes 2 to 64 characters. A name spelled from the id is at most 63 characters, a hashed one 64.
_SESSION_PREFIX = "offload-"
_SESSION_NAME_MAX = 64
_VERBATIM_MAX = _SESSION_NAME_MAX - len(_SESSION_PREFIX) - 1
_DIGEST_CHARACTERS = 26  # 130 bits of SHA-256 in base32: no collision an attacker can search for
_HASHED_HEAD = _SESSION_NAME_MAX - len(_SESSION_PREFIX) - 1 - _DIGEST_CHARACTERS
# The ids the scope rules accept (stores/scope.py); anything else (never a store's tenant) is hashed.
_VERBATIM = re.compile(r"[A-Za-z0-9._@+=-]+")


@dataclass(frozen=True)
class TemporaryCredentials:
    """One tenant's credentials from STS, and when they stop working."""

    key: str
    secret: str
    token: str
    expires_at: datetime

    def storage_options(self) -> dict[str, str]:
        """The s3fs storage options that sign with them (both engines take these names)."""
        return {"key": self.key, "secret": self.secret, "token": self.token}


def tenant_session_policy(bucket: str, prefix: str) -> dict[str, Any]:
    """
    The session policy for one tenant: its objects below ``<bucket>/<prefix>/`` and a listing of that prefix only.

    :param bucket: The bucket.
    :param prefix: The tenant's prefix inside it, without slashes at either end (``"prod/acme"``).
    :returns: The policy document.
    """
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                "Resource": f"arn:aws:s3:::{bucket}/{prefix}/*",
            },
            {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{bucket}",
                "Condition": {"StringLike": {"s3:prefix": f"{prefix}/*"}},
            },
        ],
    }


def role_session_name(tenant: str) -> str:
    """
    The STS session name for a tenant, as audit logs show it, within STS's 64 characters of ``[A-Za-z0-9_=,.@-]``
    (Ceph RGW refuses ``+``): two tenants never share one.

    An id of at most `_VERBATIM_MAX` characters that the scope rules accept is spelled ``offload-<tenant>`` with each
    ``+`` written ``,`` (a character no tenant id holds, so the spelling can be undone): such names are at most 63
    characters long. Every other id is named by exactly 64 characters: ``offload-``, its first characters (the same
    spelling, other characters as ``-``), ``-`` and 130 bits of SHA-256 of the exact id in base32. The lengths keep the
    two forms apart, and within the second form only a SHA-256 collision could give two ids one name.

    :param tenant: The tenant id.
    :returns: The session name.
    """
    spelled = tenant.replace("+", ",")
    if len(tenant) <= _VERBATIM_MAX and _VERBATIM.fullmatch(tenant):
        return f"{_SESSION_PREFIX}{spelled}"
    digest = base64.b32encode(hashlib.sha256(tenant.encode()).digest()).decode().rstrip("=").lower()
    head = re.sub(r"[^A-Za-z0-9_=,.@-]", "-", spelled)[:_HASHED_HEAD]
    return f"{_SESSION_PREFIX}{head}-{digest[:_DIGEST_CHARACTERS]}"


class AssumeRoleCredentials:
    """
    Credentials per tenant from STS ``AssumeRole``, each limited by `tenant_session_policy` to the tenant's prefix.

    Give it to a store (``FsspecToolResultStore(url, credentials=AssumeRoleCredentials(role_arn))``): the store's own
    credentials (its storage options, else the environment) assume the role, and every store derived for a tenant
    signs with that tenant's credentials. They are cached per tenant and renewed `renew_before` their expiry, one STS
    call per tenant at a time however many runs start at once. The role's trust policy should allow permanent keys
    only (``"Condition": {"StringEquals": {"sts:authentication": "false"}}`` on Ceph RGW), so temporary credentials
    cannot assume it again without a session policy.

    :param role_arn: The role to assume; its own policy must allow what the tenants do (the session policy narrows it).
    :param duration: How long each tenant's credentials last (at least 15 minutes).
    :param renew_before: Renew them this long before they expire.
    :param sts_endpoint_url: The STS endpoint; None: the store's S3 endpoint when it has one (Ceph RGW and MinIO serve
        STS there), else AWS's regional STS.
    :param region: The region to sign STS requests for; None: the store's, else ``us-east-1``.
    :param tenant_tag: A session tag key to carry the tenant id (``{"Key": tenant_tag, "Value": tenant}``), for roles
        whose policies grant by ``aws:PrincipalTag/<tenant_tag>`` (ABAC) on top of the session policy; the role's
        trust policy must then allow ``sts:TagSession``. None: no tags. Ceph RGW 16.2 accepts tags without enforcing
        conditions on them.
    """

    def __init__(
        self,
        role_arn: str,
        *,
        duration: timedelta = timedelta(hours=1),
        renew_before: timedelta = timedelta(minutes=5),
        sts_endpoint_url: str | None = None,
        region: str | None = None,
        tenant_tag: str | None = None,
    ) -> None:
        if duration < MIN_DURATION:
            raise ValueError(
                f"duration must be at least {MIN_DURATION} (STS refuses shorter sessions), not {duration}."
            )
        if not timedelta(0) <= renew_before < duration:
            raise ValueError("renew_before must be at least 0 and shorter than duration.")
        self.role_arn = role_arn
        self.duration = duration
        self.renew_before = renew_before
        self.sts_endpoint_url = sts_endpoint_url
        self.region = region
        if tenant_tag is not None and not _TAG_KEY.fullmatch(tenant_tag):
            raise ValueError(
                f"tenant_tag {tenant_tag!r} is not an STS tag key (1-128 of letters, digits, spaces and _.:/=+-@)."
            )
        self.tenant_tag = tenant_tag
        # botocore logs STS's answers (secret key, session token) and the requests signed with them at DEBUG.
        log_redaction.install()
        self.calls = 0  # STS calls made, for tests and benchmarks
        self._cache: dict[str, TemporaryCredentials] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._client: Any = None

    def current(self, bucket: str, prefix: str) -> TemporaryCredentials | None:
        """The cached credentials for ``<bucket>/<prefix>``, while they are not due for renewal."""
        cached = self._cache.get(f"{bucket}/{prefix}")
        if cached is not None and datetime.now(UTC) < cached.expires_at - self.renew_before:
            return cached
        return None

    def credentials_for(
        self, tenant: str, *, bucket: str, prefix: str, base_options: Mapping[str, Any]
    ) -> TemporaryCredentials:
        """
        The tenant's credentials: cached ones while fresh, else one STS call (the only one for the tenant meanwhile).

        Blocking (one HTTPS request to STS): the store calls it in a worker thread.

        :param tenant: The tenant id.
        :param bucket: The store's bucket.
        :param prefix: The tenant's prefix inside it (``"prod/acme"``).
        :param base_options: The store's storage options, secrets resolved: its credentials and endpoint.
        :returns: The credentials.
        :raises StoragePermissionError: If STS refused (the role's trust policy, wrong base credentials); the role and
            tenant are logged, not put in the message.
        :raises StorageError: If STS could not be reached or failed otherwise, after `STS_ATTEMPTS` attempts for
            what is transient (5xx, throttling, resets, timeouts); nothing is cached, so the next request asks again.
        """
        # Cached by the prefix the policy names, not the tenant alone: one source may serve stores of several roots.
        scope = f"{bucket}/{prefix}"
        with self._guard:
            lock = self._locks.setdefault(scope, threading.Lock())
        with lock:
            cached = self.current(bucket, prefix)
            if cached is not None:
                return cached
            fresh = self._assume(tenant, tenant_session_policy(bucket, prefix), base_options)
            self._cache[scope] = fresh
            return fresh

    def _assume(self, tenant: str, policy: dict[str, Any], base_options: Mapping[str, Any]) -> TemporaryCredentials:
        from botocore.exceptions import BotoCoreError, ClientError

        self.calls += 1
        try:
            answer = self._sts(base_options).assume_role(
                RoleArn=self.role_arn,
                RoleSessionName=role_session_name(tenant),
                DurationSeconds=int(self.duration.total_seconds()),
                # Compact: Ceph RGW refuses a policy with spaces in it.
                Policy=json.dumps(policy, separators=(",", ":")),
                **({"Tags": [{"Key": self.tenant_tag, "Value": tenant}]} if self.tenant_tag else {}),
            )
        except ClientError as error:
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = error.response.get("Error", {}).get("Code", "")
            # The message may reach a model: the role is named in the log only.
            logger.warning("STS refused to assume %s for tenant %r: %s %s", self.role_arn, tenant, status, code)
            answer = " ".join(str(part) for part in (status, code) if part)
            message = f"Could not get this tenant's storage credentials: STS answered {answer}."
            raise (StoragePermissionError if status in (401, 403) else StorageError)(message) from error
        except BotoCoreError as error:
            logger.warning("STS failed for tenant %r (role %s): %s", tenant, self.role_arn, error)
            raise StorageError(f"Could not get this tenant's storage credentials: {type(error).__name__}.") from error
        credentials = answer["Credentials"]
        expires_at = credentials["Expiration"]
        expires_at = expires_at.astimezone(UTC) if expires_at.tzinfo else expires_at.replace(tzinfo=UTC)
        return TemporaryCredentials(
            credentials["AccessKeyId"], credentials["SecretAccessKey"], credentials["SessionToken"], expires_at
        )

    def _sts(self, options: Mapping[str, Any]) -> Any:
        with self._guard:
            if self._client is None:
                from botocore.config import Config
                from botocore.session import Session  # s3fs's dependency, through aiobotocore

                client_kwargs = options.get("client_kwargs") or {}
                self._client = Session(profile=options.get("profile")).create_client(
                    "sts",
                    # As the store's S3 requests: a silent STS must not hold a tenant's first request for minutes.
                    config=Config(
                        connect_timeout=DEFAULT_CONNECT_TIMEOUT,
                        read_timeout=DEFAULT_READ_TIMEOUT,
                        retries={"mode": "standard", "total_max_attempts": STS_ATTEMPTS},
                    ),
                    endpoint_url=self.sts_endpoint_url
                    or options.get("endpoint_url")
                    or client_kwargs.get("endpoint_url"),
                    region_name=self.region or client_kwargs.get("region_name") or "us-east-1",
                    aws_access_key_id=options.get("key") or client_kwargs.get("aws_access_key_id"),
                    aws_secret_access_key=options.get("secret") or client_kwargs.get("aws_secret_access_key"),
                    aws_session_token=options.get("token") or client_kwargs.get("aws_session_token"),
                )
            return self._client

    def to_dict(self) -> dict[str, Any]:
        """Serialize by reference: the role and settings, never a credential."""
        return default_to_dict(
            self,
            role_arn=self.role_arn,
            duration=self.duration.total_seconds(),
            renew_before=self.renew_before.total_seconds(),
            sts_endpoint_url=self.sts_endpoint_url,
            region=self.region,
            tenant_tag=self.tenant_tag,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AssumeRoleCredentials:
        """Deserialize what `to_dict` made."""
        parameters = data.get("init_parameters", {})
        for name in ("duration", "renew_before"):
            if isinstance(parameters.get(name), int | float):
                parameters[name] = timedelta(seconds=parameters[name])
        return default_from_dict(cls, data)
