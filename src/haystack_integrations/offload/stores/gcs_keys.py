"""
Customer-supplied encryption keys (CSEK) per tenant on Google Cloud Storage: gcsfs has no CSEK option, so a tenant's
gcsfs client sends its key's three ``x-goog-encryption-*`` headers on each read and write of an object, and GCS's
refusals of a key (400 with a CSEK reason) are told apart from other failures.
"""

from __future__ import annotations

import errno
import sys
import types
from collections.abc import Mapping
from typing import Any

from haystack_integrations.offload.stores.encryption import KEY_SENT, TenantKeys, aes256_key_headers
from haystack_integrations.offload.stores.failures import EncryptionKeyMissingError, EncryptionKeyRefusedError
from haystack_integrations.offload.stores.options import require_tls

# Not S3's salt: a tenant's key is handed to the provider with every request, so a key Google sees must open nothing
# at AWS (or in the same master secret's S3 buckets anywhere), and the other way round.
GCS_HKDF_SALT = b"offload-haystack/gcs-csek/v1"
KEY_HEADERS = ("x-goog-encryption-algorithm", "x-goog-encryption-key", "x-goog-encryption-key-sha256")
# GCS's JSON API answers 400 with one of these reasons when a key is missing, wrong, or malformed
# (https://cloud.google.com/storage/docs/json_api/v1/status-codes).
MISSING_KEY = "resourceIsEncryptedWithCustomerEncryptionKey"
REFUSED_KEY_REASONS = frozenset(
    {
        "customerEncryptionKeyIsIncorrect",
        "resourceNotEncryptedWithCustomerEncryptionKey",
        "customerEncryptionAlgorithmIsInvalid",
        "customerEncryptionKeyFormatIsInvalid",
        "customerEncryptionKeySha256IsInvalid",
    }
)
_GOOGLE = "https://storage.googleapis.com"


def csek_headers(key: bytes) -> dict[str, str]:
    """
    The request headers that hand GCS a customer-supplied AES-256 key.

    :param key: The 32-byte key.
    :returns: The algorithm, the key and its SHA-256, both in standard base64.
    """
    return aes256_key_headers(key, KEY_HEADERS)


def tenant_csek_headers(keys: TenantKeys, tenant: str) -> dict[str, str]:
    """
    A tenant's CSEK headers: its key derived with GCS's own salt (`GCS_HKDF_SALT`), unrelated to its S3 key.

    :param keys: The store's keys.
    :param tenant: The tenant id.
    :returns: The headers.
    :raises ValueError: If the master secret is missing or too short.
    """
    return csek_headers(keys.key_for(tenant, salt=GCS_HKDF_SALT))


def check_key_transport(options: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """
    Refuse to hand tenants' keys to an endpoint over plain HTTP, unless it is on this machine (an emulator, a proxy).

    GCS refuses a key sent without TLS, but only once the key has crossed the network; refused here, it never does.

    :param options: The store's storage options (``endpoint_url``, as gcsfs reads it).
    :param environ: The environment (gcsfs falls back to ``STORAGE_EMULATOR_HOST``).
    :raises ValueError: If the endpoint is ``http://`` on another host.
    """
    given = options.get("endpoint_url")
    endpoint = given if isinstance(given, str) and given else environ.get("STORAGE_EMULATOR_HOST") or _GOOGLE
    if "://" not in endpoint:
        endpoint = f"http://{endpoint}"  # as gcsfs reads a bare STORAGE_EMULATOR_HOST
    require_tls(endpoint, sends=KEY_SENT)


def carries_object_data(method: str, path: str, args: tuple[Any, ...], params: Mapping[str, Any]) -> bool:
    """
    Whether a gcsfs request reads or writes an object's data or checksums, which GCS encrypts with the key.

    Uploads (simple, resumable, and a resumable upload's chunks), media downloads and an object's metadata take the
    key; listings, deletes and metadata updates do not need it (GCS keeps names and metadata under its own keys).

    :param method: The HTTP method.
    :param path: gcsfs's path: a full URL (uploads, downloads) or a template such as ``"b/{}/o/{}"``.
    :param args: The template's arguments.
    :param params: The query parameters.
    :returns: Whether to send the key.
    """
    if "/upload/storage/v1/b/" in path or "/download/storage/v1/b/" in path or params.get("alt") == "media":
        return True
    return method.upper() == "GET" and path == "b/{}/o/{}" and len(args) == 2


def key_refusal(error: BaseException, *, sent_key: bool) -> OSError | None:
    """
    GCS's refusal of a key, from gcsfs's `HttpError`: the object was written with another key, with none, or with one
    this request did not send.

    :param error: What gcsfs raised.
    :param sent_key: Whether the request carried a key.
    :returns: An `EncryptionKeyMissingError` or `EncryptionKeyRefusedError`, or None for any other failure.
    """
    retry = sys.modules.get("gcsfs.retry")
    if retry is None or not isinstance(error, retry.HttpError) or getattr(error, "code", None) != 400:
        return None
    answer = getattr(error, "_error_response", None) or {}
    reasons = {str(item.get("reason", "")) for item in answer.get("errors") or () if isinstance(item, dict)}
    if MISSING_KEY in reasons and not sent_key:
        return EncryptionKeyMissingError(errno.EACCES, f"read without a customer-supplied key: HTTP 400 {MISSING_KEY}")
    refused = sorted(reasons & (REFUSED_KEY_REASONS | {MISSING_KEY}))
    if refused:
        return EncryptionKeyRefusedError(errno.EACCES, f"customer-supplied key refused: HTTP 400 {refused[0]}")
    return None


def with_customer_key(fs: Any, headers: Mapping[str, str] | None) -> Any:
    """
    Make a gcsfs filesystem the store built send `headers` on each request that reads or writes an object's data
    (`carries_object_data`), and raise GCS's refusals of a key as ours (`key_refusal`).

    The headers go in below gcsfs's ``_call``, whose debug log prints a request's headers: the key is never logged.
    The store builds this instance itself, outside fsspec's cache, so no other code of the process shares it.

    :param fs: A ``GCSFileSystem`` (its retries already off, `without_client_retries`).
    :param headers: The tenant's `tenant_csek_headers`; None sends no key (the refusals are still classified).
    :returns: `fs`.
    """
    inner = fs._request
    key = dict(headers or {})

    async def request(
        self: Any, method: str, path: str, *args: Any, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> Any:
        sent_key = bool(key) and carries_object_data(method, path, args, kwargs)
        if sent_key:
            headers = {**(headers or {}), **key}
        try:
            return await inner(method, path, *args, headers=headers, **kwargs)
        except Exception as error:
            refusal = key_refusal(error, sent_key=sent_key)
            if refusal is None:
                raise
            raise refusal from error

    fs._request = types.MethodType(request, fs)
    return fs
