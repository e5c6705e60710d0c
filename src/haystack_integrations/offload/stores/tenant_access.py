"""What a tenant's requests sign and encrypt with (its STS credentials, its key), and what each store can enforce."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from haystack_integrations.offload.stores.azure_keys import azure_endpoint
from haystack_integrations.offload.stores.azure_keys import check_key_transport as check_azure_key_transport
from haystack_integrations.offload.stores.azure_sas import DirectorySasCredentials, TenantSas, tenant_sas_options
from haystack_integrations.offload.stores.credentials import AssumeRoleCredentials, TemporaryCredentials
from haystack_integrations.offload.stores.encryption import TenantKeys
from haystack_integrations.offload.stores.gcs_credentials import DownscopedCredentials
from haystack_integrations.offload.stores.gcs_keys import check_key_transport

if TYPE_CHECKING:
    from haystack_integrations.offload.stores.gcs_tokens import DownscopedToken

    # What a tenant's client signs with, made by one of the `TenantCredentials`.
    TenantSigning = TemporaryCredentials | DownscopedToken | TenantSas

# Credentials per tenant, each store's own kind: STS's on S3, downscoped tokens on GCS, directory SAS on Azure.
TenantCredentials = AssumeRoleCredentials | DownscopedCredentials | DirectorySasCredentials

# What carries credentials in s3fs storage options: left out of a client signing as a tenant.
_CREDENTIAL_OPTIONS = frozenset({"key", "secret", "token", "username", "password", "profile", "anon"})
_CREDENTIAL_CLIENT_KWARGS = frozenset({"aws_access_key_id", "aws_secret_access_key", "aws_session_token"})
# Server-side encryption settings SSE-C cannot be combined with.
ENCRYPTION_KWARGS = frozenset({"ServerSideEncryption", "SSEKMSKeyId", "SSECustomerAlgorithm", "SSECustomerKey"})


@dataclass(frozen=True)
class TenantIsolation:
    """How a store keeps tenants apart in the object store itself: credentials per tenant, keys per tenant, or both."""

    credentials: TenantCredentials | None = None
    keys: TenantKeys | None = None

    def __bool__(self) -> bool:
        return self.credentials is not None or self.keys is not None


def check_isolation(
    protocol: str, isolation: TenantIsolation, *, from_url: bool, options: Mapping[str, Any], environ: Mapping[str, str]
) -> None:
    """
    Refuse tenant isolation a store cannot enforce, before it sends anything.

    :param protocol: The store's protocol.
    :param isolation: Its credentials and keys per tenant.
    :param from_url: Whether the store builds its own clients (not a filesystem object it was given).
    :param options: Its storage options.
    :param environ: The environment (where gcsfs may find its endpoint).
    :raises ValueError: For credentials per tenant off S3, GCS and Azure or of another store's kind, keys per tenant
        off S3, GCS and Azure, either on a filesystem object; SSE-C with S3's other server-side encryption settings;
        GCS or Azure keys, or Azure SAS, sent over plain HTTP to another host.
    """
    if not isolation:
        return
    s3 = protocol in ("s3", "s3a")
    azure = protocol in ("az", "abfs", "abfss")
    credentials = isolation.credentials
    kind = AssumeRoleCredentials if s3 else DirectorySasCredentials if azure else DownscopedCredentials
    fitting = credentials is None or isinstance(credentials, kind)
    if not from_url or not (s3 or protocol in ("gs", "gcs") or azure) or not fitting:
        raise ValueError(
            "credentials= apply to s3:// stores built from a URL (AssumeRoleCredentials), gs:// ones "
            "(DownscopedCredentials) and az:// (abfs://) ones (DirectorySasCredentials), encryption= to s3://, gs:// "
            "and az:// (abfs://) ones."
        )
    if isinstance(credentials, DownscopedCredentials):
        credentials.check(options)
    elif isinstance(credentials, DirectorySasCredentials):
        credentials.check(options, environ)
    clashing = sorted(ENCRYPTION_KWARGS & set(options.get("s3_additional_kwargs") or {}))
    if isolation.keys is not None and s3 and clashing:
        raise ValueError(f"encryption= (SSE-C per tenant) cannot be combined with s3_additional_kwargs {clashing}.")
    if isolation.keys is not None and azure:
        check_azure_key_transport(azure_endpoint(options, environ))
    elif isolation.keys is not None and not s3:
        check_key_transport(options, environ)


def tenant_prefix(root_path: str, tenant: str) -> tuple[str, str]:
    """The bucket, and the tenant's prefix inside it (``("bucket", "prod/acme")``): what its credentials may reach."""
    bucket, _, root = root_path.partition("/")
    return bucket, f"{root}/{tenant}" if root else tenant


def tenant_of_path(root_path: str, path: str) -> str | None:
    """The tenant whose scope `path` (a full path, as engine calls take) lies in; None for the root's own paths."""
    inside = path.removeprefix(root_path.rstrip("/") + "/")
    if inside == path or "/" not in inside:
        return None
    return inside.split("/", 1)[0]


class TenantSigner:
    """One tenant's credentials (STS's, its GCS token, its Azure SAS) for its client: asked for once, renewed before
    expiry."""

    def __init__(
        self, source: TenantCredentials, tenant: str, root_path: str, base_options: Callable[[], Mapping[str, Any]]
    ) -> None:
        self._source = source
        self._tenant = tenant
        self._bucket, self._prefix = tenant_prefix(root_path, tenant)
        self._base_options = base_options
        self._lock = threading.Lock()
        self.signing: TenantSigning | None = None

    def fetch(self) -> TenantSigning:
        """The tenant's credentials, cached or from STS (blocking: the async path calls it in a worker thread)."""
        return self._source.credentials_for(
            self._tenant, bucket=self._bucket, prefix=self._prefix, base_options=self._base_options()
        )

    def signing_now(self) -> TenantSigning:
        """The credentials the client signs with, asked for in the caller's thread on a sync first use."""
        with self._lock:
            if self.signing is None:
                self.signing = self.fetch()
            return self.signing

    async def renew_async(self) -> bool:
        """
        Make sure the credentials are fresh, asking STS in a worker thread if not.

        :returns: Whether they changed (the tenant's client must then be made again).
        """
        current = self._source.current(self._bucket, self._prefix)
        if current is None:
            current = await asyncio.to_thread(self.fetch)
        with self._lock:
            if current is self.signing:
                return False
            self.signing = current
            return True


def tenant_options(
    options: Mapping[str, Any], *, signing: TenantSigning | None, key: Mapping[str, Any] | None
) -> dict[str, Any]:
    """
    A tenant client's storage options: the worker's credentials replaced by the tenant's, its SSE-C key added.

    :param options: The store's storage options, secrets resolved.
    :param signing: The tenant's credentials (S3's, its GCS token, its Azure SAS); None keeps the worker's (the root's
        operator requests).
    :param key: The tenant's ``s3_additional_kwargs`` for SSE-C (`TenantKeys.storage_options`), if any.
    :returns: The options.
    """
    result = dict(options)
    if isinstance(signing, TenantSas):  # Azure: every credential of the worker's out, the SAS in
        result = tenant_sas_options(options, signing, os.environ)
    elif signing is not None:
        result = {name: value for name, value in result.items() if name not in _CREDENTIAL_OPTIONS}
        if "client_kwargs" in options:  # s3fs's (gcsfs has none)
            result["client_kwargs"] = {
                name: value
                for name, value in (options["client_kwargs"] or {}).items()
                if name not in _CREDENTIAL_CLIENT_KWARGS
            }
        result.update(signing.storage_options())  # s3fs's key, secret and token; gcsfs's token
    if key is not None:
        result["s3_additional_kwargs"] = {**(options.get("s3_additional_kwargs") or {}), **key}
    return result
