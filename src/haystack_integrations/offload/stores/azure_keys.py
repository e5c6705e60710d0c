"""
Customer-provided keys (CPK) per tenant on Azure Blob Storage: a tenant's key, derived with Azure's own salt, goes as
the three ``x-ms-encryption-*`` headers on each request that reads or writes a blob's data or properties (adlfs: a
policy at the head of its client's pipeline, `with_customer_key`; obstore: object_store's ``encryption_key``), and
Azure's refusals of a key (409 with a CPK error code) are told apart from other failures (`key_refusal`).
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from haystack_integrations.offload.stores.encryption import KEY_SENT, TenantKeys, aes256_key_headers
from haystack_integrations.offload.stores.failures import EncryptionKeyMissingError, EncryptionKeyRefusedError
from haystack_integrations.offload.stores.options import require_tls

# Not S3's nor GCS's salt: a tenant's key is handed to the provider with every request, so a key Microsoft sees must
# open nothing at AWS or Google (or in the same master secret's buckets there), and the other way round.
AZURE_HKDF_SALT = b"offload-haystack/azure-cpk/v1"
KEY_HEADERS = ("x-ms-encryption-algorithm", "x-ms-encryption-key", "x-ms-encryption-key-sha256")
# Azure's error codes (x-ms-error-code) for a key missing from a request for a blob written with one, a key other than
# the blob's, and a key sent for a blob written without one (each seen with 409 in Azure SDKs' recorded sessions).
MISSING_KEY = "BlobUsesCustomerSpecifiedEncryption"
REFUSED_KEY_CODES = frozenset({"BlobCustomerSpecifiedEncryptionMismatch", "BlobDoesNotUseCustomerSpecifiedEncryption"})
# The blob operations that take a key (https://learn.microsoft.com/azure/storage/blobs/encryption-customer-provided-keys),
# by their ``comp`` parameter ("": Put Blob, Get Blob, Get Blob Properties); container, listing, delete, lease and
# batch requests take none (Azure keeps names and system properties under its own keys).
_KEYED_COMPS = frozenset({"", "block", "blocklist", "metadata", "properties", "snapshot", "appendblock", "page"})
_KEYED_METHODS = frozenset({"GET", "HEAD", "PUT"})


def cpk_headers(key: bytes) -> dict[str, str]:
    """
    The request headers that hand Azure a customer-provided AES-256 key.

    :param key: The 32-byte key.
    :returns: The algorithm, the key and its SHA-256, both in standard base64.
    """
    return aes256_key_headers(key, KEY_HEADERS)


def tenant_cpk_key(keys: TenantKeys, tenant: str) -> bytes:
    """
    A tenant's CPK key: derived with Azure's own salt (`AZURE_HKDF_SALT`), unrelated to its S3 and GCS keys.

    :param keys: The store's keys.
    :param tenant: The tenant id.
    :returns: The 32-byte key.
    :raises ValueError: If the master secret is missing or too short.
    """
    return keys.key_for(tenant, salt=AZURE_HKDF_SALT)


def azure_endpoint(options: Mapping[str, Any], environ: Mapping[str, str]) -> str | None:
    """
    The blob endpoint adlfs and obstore reach with these options, as far as plain strings tell it.

    :param options: The store's storage options (a `Secret` connection string is not read here: the client that is
        made with it checks its own endpoint, `check_key_transport`).
    :param environ: The environment (``AZURE_STORAGE_CONNECTION_STRING`` when no connection string is given).
    :returns: The endpoint URL, or None if the options do not say (a secret connection string).
    """
    given = options.get("connection_string")
    if given is not None and not isinstance(given, str):
        return None
    fields = {
        name.strip(): value.strip()
        for name, _, value in (
            part.partition("=") for part in (given or environ.get("AZURE_STORAGE_CONNECTION_STRING") or "").split(";")
        )
        if value
    }
    if fields.get("UseDevelopmentStorage", "").lower() == "true":
        return "http://127.0.0.1:10000"
    if fields.get("BlobEndpoint"):
        return fields["BlobEndpoint"]
    account = fields.get("AccountName") or options.get("account_name") or environ.get("AZURE_STORAGE_ACCOUNT_NAME")
    if fields.get("EndpointSuffix") and account:
        return f"{fields.get('DefaultEndpointsProtocol', 'https')}://{account}.blob.{fields['EndpointSuffix']}"
    host = options.get("account_host")
    return f"https://{host}" if isinstance(host, str) and host else "https://blob.core.windows.net"


def check_key_transport(endpoint: str | None) -> None:
    """
    Refuse to hand tenants' keys to an endpoint over plain HTTP, unless it is on this machine (an emulator, a proxy).

    Azure refuses a key sent without TLS, but only once the key has crossed the network; refused here, it never does
    (the Azure SDK's own ``cpk=`` check is bypassed by the headers `with_customer_key` adds, and object_store has none).

    :param endpoint: The blob endpoint (`azure_endpoint`, or the client's own URL); None: not known yet.
    :raises ValueError: If the endpoint is ``http://`` on another host.
    """
    if endpoint is None:
        return
    require_tls(endpoint if "://" in endpoint else f"https://{endpoint}", sends=KEY_SENT)


def carries_blob_data(method: str, url: str) -> bool:
    """
    Whether an Azure Blob request reads or writes a blob's data, properties or metadata, which Azure encrypts with the
    key: Put Blob, Put Block, Put Block List, Get Blob, Get Blob Properties, Get/Set Blob Metadata, Set Blob Properties.

    :param method: The HTTP method.
    :param url: The request's URL.
    :returns: Whether to send the key.
    """
    if method.upper() not in _KEYED_METHODS:
        return False
    query = parse_qs(urlsplit(url).query, keep_blank_values=True)
    if "restype" in query:  # a container's or the service's own request, or a listing
        return False
    return (query.get("comp") or [""])[0].lower() in _KEYED_COMPS


def key_refusal(status: int | None, code: str, *, method: str, sent_key: bool) -> OSError | None:
    """
    Azure's refusal of a key: the blob was written with another key, with none, or with one this request did not send.

    :param status: The answer's HTTP status.
    :param code: Azure's error code (``x-ms-error-code``), or ``""`` where the client does not show it.
    :param method: The request's HTTP method.
    :param sent_key: Whether the request carried a key.
    :returns: An `EncryptionKeyMissingError` or `EncryptionKeyRefusedError`, or None for any other failure.
    """
    if code == MISSING_KEY and not sent_key:
        return EncryptionKeyMissingError(errno.EACCES, f"read without a customer-provided key: HTTP {status} {code}")
    if code == MISSING_KEY or code in REFUSED_KEY_CODES:
        return EncryptionKeyRefusedError(errno.EACCES, f"customer-provided key refused: HTTP {status} {code}")
    if status == 409 and not code and method.upper() == "HEAD":
        # A HEAD's answer has no body, and object_store does not show its x-ms-error-code header: Get Blob Properties
        # answers 409 for nothing but a key it refuses (S3's bare 400 to a HEAD is read the same way).
        if sent_key:
            return EncryptionKeyRefusedError(errno.EACCES, "customer-provided key refused: HTTP 409 to a HEAD")
        return EncryptionKeyMissingError(errno.EACCES, "read without a customer-provided key: HTTP 409 to a HEAD")
    return None


class _CustomerKeyPolicy:
    """
    The first policy of an adlfs client's pipeline: adds a tenant's key to each request `carries_blob_data` names, and
    raises Azure's refusals of a key (`key_refusal`) before the SDK maps a 409 to "exists" or a retry sees it.

    First, so every later policy sees the headers: the Shared Key signature covers every ``x-ms-`` header, and the
    SDK's loggers redact ``x-ms-encryption-key``.
    """

    def __init__(self, headers: Mapping[str, str] | None, first: Any) -> None:
        self._headers = dict(headers or {})
        self.next = first

    async def send(self, request: Any) -> Any:
        http_request = request.http_request
        sent_key = bool(self._headers) and carries_blob_data(http_request.method, http_request.url)
        if sent_key:
            http_request.headers.update(self._headers)
        response = await self.next.send(request)
        answer = response.http_response
        if answer.status_code in (400, 409):
            code = str(answer.headers.get("x-ms-error-code") or "")
            refusal = key_refusal(answer.status_code, code, method=http_request.method, sent_key=sent_key)
            if refusal is not None:
                await answer.close()  # a download's answer may be streamed: its connection is let go now
                raise refusal
        return response


def with_customer_key(fs: Any, key: bytes | None) -> Any:
    """
    Make an adlfs filesystem the store built send `key` on each request that reads or writes a blob (adlfs passes no
    ``cpk=`` to the Azure SDK), and raise Azure's refusals of a key as ours.

    The policy goes first in the pipeline of the filesystem's service client, which every container and blob client
    adlfs makes from it shares. The store builds this instance itself, outside fsspec's cache, so no other code of the
    process shares it.

    :param fs: An ``AzureBlobFileSystem`` (its retries already off, `without_client_retries`).
    :param key: The tenant's `tenant_cpk_key`; None sends no key (the refusals are still classified).
    :returns: `fs`.
    :raises ValueError: If a key would go over plain HTTP to another machine (`check_key_transport`).
    """
    pipeline = fs.service_client._pipeline
    if key is not None:
        check_key_transport(fs.service_client.url)
    policies = pipeline._impl_policies
    first = policies[0] if policies else None
    if first is None or isinstance(first, _CustomerKeyPolicy):  # pragma: no cover - the SDK always builds policies
        return fs
    policies.insert(0, _CustomerKeyPolicy(cpk_headers(key) if key is not None else None, first))
    return fs
