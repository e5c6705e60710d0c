"""`FsspecToolResultStore` to and from a dictionary: its URL, options (secrets as references), scope and settings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from haystack.core.errors import SerializationError
from haystack.core.serialization import default_from_dict, default_to_dict

from haystack_integrations.offload.stores.azure_sas import DirectorySasCredentials
from haystack_integrations.offload.stores.credentials import AssumeRoleCredentials
from haystack_integrations.offload.stores.encryption import TenantKeys
from haystack_integrations.offload.stores.gcs_credentials import DownscopedCredentials
from haystack_integrations.offload.stores.options import deserialize_options, serialize_options
from haystack_integrations.offload.stores.quotas import Quota
from haystack_integrations.offload.stores.retention import Retention
from haystack_integrations.offload.stores.retry import RetryPolicy

if TYPE_CHECKING:
    from haystack_integrations.offload.stores.fsspec_store import FsspecToolResultStore


def store_to_dict(store: FsspecToolResultStore) -> dict[str, Any]:
    """`FsspecToolResultStore.to_dict` (see there)."""
    if store._filesystem is not None:
        raise SerializationError(
            "A store built on a filesystem object cannot be serialized; build it from url and storage_options."
        )
    return default_to_dict(
        store,
        url=store.url,
        storage_options=serialize_options(store.storage_options),
        tenant=store.tenant,
        session=store.session,
        quota=store.quota.model_dump(mode="json") if store.quota is not None else None,
        retention=store.retention.model_dump(mode="json") if store.retention is not None else None,
        retry=store.retry.model_dump(mode="json") if store.retry is not None else None,
        engine=store.engine,
        credentials=_credentials_dict(store),
        encryption=_encryption_dict(store),
    )


def _credentials_dict(store: FsspecToolResultStore) -> dict[str, Any] | None:
    if store.credentials is None:
        return None
    try:
        return store.credentials.to_dict()
    except ValueError as error:  # a google-auth credentials object as the source, a token Secret: not serializable
        token = "secret" in str(error).lower()
        hint = "Use Secret.from_env_var." if token else "Leave source=None and name them in token=."
        raise SerializationError(f"{error} {hint}") from error


def _encryption_dict(store: FsspecToolResultStore) -> dict[str, Any] | None:
    if store.encryption is None:
        return None
    try:
        return store.encryption.to_dict()
    except ValueError as error:  # a token Secret: the master secret itself would go into the dictionary
        raise SerializationError(
            "The store's SSE-C master secret is a token Secret; use Secret.from_env_var to serialize the store."
        ) from error


def store_from_dict(cls: type[FsspecToolResultStore], data: dict[str, Any]) -> FsspecToolResultStore:
    """`FsspecToolResultStore.from_dict` (see there)."""
    init_parameters = data.get("init_parameters", {})
    if init_parameters.get("storage_options"):
        init_parameters["storage_options"] = deserialize_options(init_parameters["storage_options"])
    for name, model in (("quota", Quota), ("retention", Retention), ("retry", RetryPolicy)):
        if isinstance(init_parameters.get(name), dict):
            init_parameters[name] = model.model_validate(init_parameters[name])
    if isinstance(init_parameters.get("credentials"), dict):
        credentials = init_parameters["credentials"]
        kinds = (DownscopedCredentials, DirectorySasCredentials)
        kind = next((k for k in kinds if str(credentials.get("type", "")).endswith(f".{k.__name__}")), None)
        init_parameters["credentials"] = (kind or AssumeRoleCredentials).from_dict(credentials)
    if isinstance(init_parameters.get("encryption"), dict):
        init_parameters["encryption"] = TenantKeys.from_dict(init_parameters["encryption"])
    return default_from_dict(cls, data)
