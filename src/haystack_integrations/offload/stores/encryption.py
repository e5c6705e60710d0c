"""Keys per tenant (S3 SSE-C, GCS CSEK, Azure CPK): one 256-bit key per tenant and store, from a master secret."""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

from haystack.core.serialization import default_from_dict, default_to_dict
from haystack.utils import Secret, deserialize_secrets_inplace

from haystack_integrations.offload.stores import log_redaction

# Domain separation: the same master secret used elsewhere derives unrelated keys.
HKDF_SALT = b"offload-haystack/sse-c/v1"
KEY_BYTES = 32
# Where a store hands the key to the provider in a header (GCS, Azure), the endpoint must take it over TLS.
KEY_SENT = "encryption= sends each tenant's key in its requests"
MIN_MASTER_SECRET_CHARACTERS = 32
"""The shortest master secret `TenantKeys` accepts, for a server to check its setting at start-up."""


def hkdf_sha256(secret: bytes, *, salt: bytes, info: bytes, length: int = KEY_BYTES) -> bytes:
    """
    HKDF with SHA-256 (RFC 5869): extract a pseudorandom key from `secret`, then expand it to `length` bytes.

    :param secret: The input keying material.
    :param salt: The extract step's salt.
    :param info: What the key is for (here: the tenant id).
    :param length: How many bytes to derive (at most 255 * 32).
    :returns: The derived key.
    """
    pseudorandom = hmac.new(salt, secret, hashlib.sha256).digest()
    derived, block, counter = b"", b"", 1
    while len(derived) < length:
        block = hmac.new(pseudorandom, block + info + bytes([counter]), hashlib.sha256).digest()
        derived += block
        counter += 1
    return derived[:length]


def aes256_key_headers(key: bytes, names: tuple[str, str, str]) -> dict[str, str]:
    """
    The headers that hand a provider an AES-256 key of the customer's (GCS's ``x-goog-encryption-*``, Azure's
    ``x-ms-encryption-*``).

    :param key: The 32-byte key.
    :param names: The provider's algorithm, key and key-SHA-256 header names.
    :returns: The algorithm, the key and its SHA-256, both in standard base64.
    """
    algorithm, encoded, digest = names
    return {
        algorithm: "AES256",
        encoded: base64.b64encode(key).decode(),
        digest: base64.b64encode(hashlib.sha256(key).digest()).decode(),
    }


class TenantKeys:
    """
    Keys per tenant: AES-256 keys the object store encrypts each tenant's objects with and keeps none of (S3's SSE-C;
    on ``gs://``, GCS's customer-supplied keys, and on ``az://``, Azure's customer-provided keys, each derived with a
    salt of its own: ``stores/gcs_keys.py``, ``stores/azure_keys.py``).

    Give it to a store (``FsspecToolResultStore(url, encryption=TenantKeys(Secret.from_env_var("MASTER_KEY")))``):
    every request in a tenant's scope (its results and documents, whichever store sends it, the root's operator
    commands included) carries that tenant's key, so the tenant's objects cannot be read without it, even with read
    access to the whole bucket. Each key is ``HKDF-SHA256(master secret, salt=HKDF_SALT, info=tenant id)``: nothing is
    stored, and anyone holding the master secret can derive every tenant's key. Losing the master secret makes every
    tenant's data unreadable; see docs/security.md for what forgetting keys means for versions and backups.

    :param master_secret: The master secret: at least 32 characters, e.g. ``secrets.token_urlsafe(48)``. A `Secret`
        from an environment variable serializes by name; a token `Secret` cannot be serialized.
    """

    def __init__(self, master_secret: Secret) -> None:
        if not isinstance(master_secret, Secret):
            raise TypeError("master_secret must be a haystack Secret, e.g. Secret.from_env_var('OFFLOAD_MASTER_KEY').")
        self.master_secret = master_secret
        # botocore logs each request's headers, the tenant's key among them, at DEBUG.
        log_redaction.install()

    def key_for(self, tenant: str, *, salt: bytes = HKDF_SALT) -> bytes:
        """
        The tenant's 32-byte key.

        :param tenant: The tenant id, as the store's scope names it.
        :param salt: What the key is for: `HKDF_SALT` (S3's SSE-C), or another store's own salt (GCS's, Azure's), so
            the key one provider is handed opens nothing at another.
        :returns: The key.
        :raises ValueError: If the master secret is missing or shorter than 32 characters.
        """
        master = self.master_secret.resolve_value()
        if not isinstance(master, str) or len(master) < MIN_MASTER_SECRET_CHARACTERS:
            raise ValueError(
                f"The SSE-C master secret must be at least {MIN_MASTER_SECRET_CHARACTERS} characters "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(48))')."
            )
        return hkdf_sha256(master.encode(), salt=salt, info=tenant.encode())

    def storage_options(self, tenant: str) -> dict[str, Any]:
        """The s3fs ``s3_additional_kwargs`` that send the tenant's key (the obstore engine reads the same names)."""
        return {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": self.key_for(tenant)}

    def to_dict(self) -> dict[str, Any]:
        """Serialize by reference: the master secret's environment variable, never a key."""
        return default_to_dict(self, master_secret=self.master_secret.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TenantKeys:
        """Deserialize what `to_dict` made."""
        deserialize_secrets_inplace(data.get("init_parameters", {}), keys=["master_secret"])
        return default_from_dict(cls, data)

    def __repr__(self) -> str:
        return f"TenantKeys(master_secret={self.master_secret.type.value} secret)"
