"""
The obstore engine on Azure Blob Storage (``az://``, ``abfs://``): adlfs's storage options as `AzureStore` settings.

`azure_settings` translates what adlfs users pass (or refuses it, `unsupported_azure_options`); `AzureObstoreIO` is
`ObstoreIO` with one `AzureStore` per container, Azure's "exists" answer and a delete that tolerates missing blobs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

import obstore
from obstore.exceptions import AlreadyExistsError
from obstore.fsspec import FsspecStore
from obstore.store import AzureStore

from haystack_integrations.offload.stores.azure_keys import check_key_transport, key_refusal
from haystack_integrations.offload.stores.exit_wait import wait_at_exit
from haystack_integrations.offload.stores.failures import StorageRequestError, status_failure
from haystack_integrations.offload.stores.io import Engine
from haystack_integrations.offload.stores.obstore_io import _NOT_CACHED, ObstoreIO, _mapped_errors, describe_failure

if TYPE_CHECKING:
    from obstore.store import AzureConfig, ClientConfig, RetryConfig

__all__ = [
    "AzureObstoreIO",
    "AzureSettings",
    "azure_settings",
    "strip_azure_url",
    "unsupported_azure_options",
    "with_cpk_key",
    "with_sas_only",
]

# adlfs options that tune adlfs's own caching, file objects and upload concurrency: nothing here goes through them, so
# they are accepted (the same storage_options serve both engines) and have no effect.
_ADLFS_ONLY = frozenset(
    {
        "assume_container_exists",
        "blocksize",
        "default_cache_type",
        "default_fill_cache",
        "listings_expiry_time",
        "max_concurrency",
        "max_paths",
        "skip_instance_cache",
        "socket_timeout",
        "use_listings_cache",
    }
)
# storage option -> AzureConfig key.
_CONFIG_NAMES = {
    "account_name": "account_name",
    "account_key": "account_key",
    "client_id": "client_id",
    "client_secret": "client_secret",
    "tenant_id": "tenant_id",
}
_UNDERSTOOD = frozenset(
    {*_CONFIG_NAMES, "connection_string", "sas_token", "anon", "account_host", "connection_timeout", "read_timeout"}
)
# Understood at one value only: the primary location (adlfs's default), the latest version of each blob.
_ONLY_AT = {"location_mode": "primary", "version_aware": False}
# adlfs reads these when the option is not given (its own environment names, not all of which object_store reads).
_ENVIRONMENT = {
    "account_name": "AZURE_STORAGE_ACCOUNT_NAME",
    "account_key": "AZURE_STORAGE_ACCOUNT_KEY",
    "connection_string": "AZURE_STORAGE_CONNECTION_STRING",
    "sas_token": "AZURE_STORAGE_SAS_TOKEN",
    "client_id": "AZURE_STORAGE_CLIENT_ID",
    "client_secret": "AZURE_STORAGE_CLIENT_SECRET",
    "tenant_id": "AZURE_STORAGE_TENANT_ID",
}
_UNSUPPORTED_HINT = 'the obstore engine cannot honour it; leave it out, or use engine="fsspec" (adlfs)'


@dataclass(frozen=True)
class AzureSettings:
    """What every `AzureStore` of one `AzureObstoreIO` is built with (secrets included: never logged)."""

    config: dict[str, Any] = field(default_factory=dict, repr=False)  # keys and SAS tokens: never in a repr
    client_options: dict[str, Any] = field(default_factory=dict)
    retry_config: dict[str, Any] = field(default_factory=dict)
    # What signs instead of the config's credentials: a tenant's SAS (`with_sas_only`).
    credential_provider: Callable[[], dict[str, Any]] | None = field(default=None, repr=False)

    def provider(self) -> dict[str, Any]:
        """`AzureStore`'s ``credential_provider`` argument, if any."""
        return {"credential_provider": self.credential_provider} if self.credential_provider is not None else {}


def unsupported_azure_options(storage_options: Mapping[str, Any]) -> list[str]:
    """
    Name the adlfs storage options the obstore engine cannot honour (by name and plain value, secrets unresolved).

    Refused: ``credential`` (an azure-identity object), ``request_session``, ``timeout`` (Azure's server-side
    operation timeout), ``location_mode`` other than ``"primary"``, ``version_aware=True``, and any name adlfs does not
    take either.

    :param storage_options: Options written for adlfs.
    :returns: Their names; empty when all are understood.
    """
    unknown = []
    for name, value in storage_options.items():
        if name in _ONLY_AT:
            if value is not None and value != _ONLY_AT[name]:
                unknown.append(f"{name}={value!r}")
        elif name not in _UNDERSTOOD and name not in _ADLFS_ONLY:
            unknown.append(name)
    return unknown


def _connection_fields(connection_string: str) -> dict[str, str]:
    return dict(part.strip().split("=", 1) for part in connection_string.split(";") if "=" in part)


def _from_connection_string(connection_string: str) -> dict[str, Any]:
    """AzureConfig entries from a connection string (account, key or SAS, blob endpoint), as Azure's SDK reads it."""
    fields = _connection_fields(connection_string)
    if fields.get("UseDevelopmentStorage", "").lower() == "true":
        # object_store's emulator mode: Azurite's account and key, at AZURITE_BLOB_STORAGE_URL or 127.0.0.1:10000.
        return {"use_emulator": True}
    config: dict[str, Any] = {}
    if fields.get("AccountName"):
        config["account_name"] = fields["AccountName"]
    if fields.get("AccountKey"):
        config["account_key"] = fields["AccountKey"]
    if fields.get("SharedAccessSignature"):
        config["sas_key"] = fields["SharedAccessSignature"].lstrip("?")
    if fields.get("BlobEndpoint"):
        config["endpoint"] = fields["BlobEndpoint"].rstrip("/")
    elif fields.get("EndpointSuffix") and config.get("account_name"):
        scheme = fields.get("DefaultEndpointsProtocol", "https")
        config["endpoint"] = f"{scheme}://{config['account_name']}.blob.{fields['EndpointSuffix']}"
    return config


def azure_settings(
    storage_options: Mapping[str, Any], *, retrying: bool, attempt_timeout: float | None
) -> AzureSettings:
    """
    Translate adlfs storage options (with secrets resolved) into `AzureStore` settings.

    Understood: ``account_name``, ``account_key``, ``sas_token``, ``connection_string`` (``AccountName``,
    ``AccountKey``, ``SharedAccessSignature``, ``BlobEndpoint``, ``EndpointSuffix``, ``UseDevelopmentStorage``),
    ``client_id``/``client_secret``/``tenant_id`` (a service principal), ``anon`` (unsigned requests),
    ``account_host`` (the endpoint's host), ``connection_timeout`` and ``read_timeout`` (azure-core's, in seconds:
    object_store's connect and per-read timeouts); adlfs's environment variables
    (``AZURE_STORAGE_CONNECTION_STRING``, ...) where an option is not given, as adlfs reads them. adlfs's caching and
    block options are accepted and have no effect. With no credentials at all, object_store asks the machine's managed
    identity (adlfs asks azure-identity's whole default chain).

    :param storage_options: Options written for adlfs, secrets resolved.
    :param retrying: Whether a `RetryPolicy` retries the store's calls: obstore's own retries are then off.
    :param attempt_timeout: The policy's time limit per attempt, in seconds: the client's request timeout.
    :returns: The settings.
    :raises ValueError: If an option cannot be honoured (see `unsupported_azure_options`), or no account is named.
    """
    unknown = unsupported_azure_options(storage_options)
    if unknown:
        raise ValueError(f"Storage option(s) {', '.join(unknown)} not supported: {_UNSUPPORTED_HINT}.")
    given = {name: storage_options.get(name) or os.environ.get(variable) for name, variable in _ENVIRONMENT.items()}
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    if given["connection_string"]:
        config.update(_from_connection_string(str(given["connection_string"])))
    for name, target in _CONFIG_NAMES.items():
        # An option given beside a connection string wins, as in adlfs (which uses the string alone when it has one,
        # but fills its account name from the options).
        if storage_options.get(name) is not None or (given[name] and target not in config):
            config[target] = given[name]
    if given["sas_token"]:
        config["sas_key"] = str(given["sas_token"]).lstrip("?")
    anon = storage_options.get("anon")
    if anon is None:
        anon = os.environ.get("AZURE_STORAGE_ANON", "false").lower() not in {"false", "0", "f", ""}
    if anon:
        config["skip_signature"] = True
    if storage_options.get("account_host"):
        config["endpoint"] = f"https://{storage_options['account_host']}"
    if not config.get("account_name") and not config.get("use_emulator"):
        raise ValueError("The obstore engine needs the Azure account: give account_name or a connection_string.")
    if str(config.get("endpoint", "")).startswith("http://"):
        client["allow_http"] = True
    if storage_options.get("connection_timeout") is not None:
        client["connect_timeout"] = timedelta(seconds=float(storage_options["connection_timeout"]))
    if storage_options.get("read_timeout") is not None:
        # Per read, as azure-core's: an answer withheld fails after it, not after the whole attempt's time.
        client["read_timeout"] = timedelta(seconds=float(storage_options["read_timeout"]))
    if retrying:
        retry: dict[str, Any] = {"max_retries": 0}  # the store retries (`retry.retried`); stacked retries multiply
    else:
        retry = {}
    if attempt_timeout is not None:
        client["timeout"] = timedelta(seconds=attempt_timeout)
    return AzureSettings(config, client, retry)


def with_cpk_key(settings: AzureSettings, key: bytes) -> AzureSettings:
    """
    The settings of a tenant's `AzureStore`: object_store sends its ``encryption_key`` (Azure's customer-provided key)
    on each Put Blob, Put Block, Put Block List, Get Blob and Get Blob Properties, and on no listing or delete.

    :param settings: The store's settings (`azure_settings`).
    :param key: The tenant's 32-byte key (`azure_keys.tenant_cpk_key`).
    :returns: The settings with the key.
    :raises ValueError: If the key would go over plain HTTP to another machine (object_store does not refuse it).
    """
    config = settings.config
    emulator = os.environ.get("AZURITE_BLOB_STORAGE_URL") or "http://127.0.0.1:10000"
    check_key_transport(emulator if config.get("use_emulator") else config.get("endpoint") or "https://azure")
    return dataclasses.replace(settings, config={**config, "encryption_key": base64.b64encode(key).decode()})


# AzureConfig keys that sign with something other than a SAS (object_store prefers an account key to a SAS).
_NOT_SAS = frozenset(
    {"account_key", "client_id", "client_secret", "tenant_id", "bearer_token", "skip_signature", "use_emulator"}
)


def with_sas_only(settings: AzureSettings) -> AzureSettings:
    """
    The settings of a tenant's `AzureStore` signing with its SAS (`azure_sas.tenant_sas_options`) and nothing else.

    The SAS goes as a credential provider: object_store reads the environment itself (``AZURE_STORAGE_ACCOUNT_KEY``,
    a service principal's variables) and prefers any of those to a configured SAS, never to a provider. The client is
    made again when the SAS is renewed, so the provider's answer does not expire.

    :param settings: The tenant's settings, with its SAS (``sas_key``) and the account's endpoint.
    :returns: The settings with the SAS as their only credential.
    :raises ValueError: If they carry no SAS.
    """
    config = settings.config
    sas = config.get("sas_key")
    if not sas:
        raise ValueError("A tenant's Azure client signs with its SAS, and these settings have none.")
    kept = {name: value for name, value in config.items() if name not in _NOT_SAS and name != "sas_key"}
    answer = {"sas_token": str(sas), "expires_at": None}
    return dataclasses.replace(settings, config=kept, credential_provider=lambda: answer)


def strip_azure_url(url: str) -> str:
    """
    The ``container/prefix`` of an ``az://``, ``abfs://`` or ``abfss://`` URL, as adlfs's ``_strip_protocol`` gives it
    (adlfs not needed): an ``abfs://container@account.dfs.core.windows.net/prefix`` keeps its container.

    :param url: The store's URL.
    :returns: The path, without the protocol, account host and trailing slashes.
    """
    path = url.split("://", 1)[1] if "://" in url else url
    container, slash, rest = path.partition("/")
    return f"{container.split('@', 1)[0]}{slash}{rest}".rstrip("/")


class AzureObstoreIO(ObstoreIO):
    """
    Azure Blob Storage through obstore: `ObstoreIO`'s operations (one request per write, whole read or page), with one
    `AzureStore` per container. A conditional create that finds the blob answers 409 ``BlobAlreadyExists`` on Azure
    (S3's 409 is a write in flight): here it is "exists". ``fs`` is obstore's fsspec filesystem for Azure.
    """

    def __init__(self, settings: AzureSettings, *, fallback: Callable[[], Engine] | None = None) -> None:
        """
        :param settings: What every container's `AzureStore` is built with (see `azure_settings`).
        :param fallback: The engine (adlfs) for keys object_store cannot parse; None: they fail loudly.
        """
        Engine.__init__(
            self,
            FsspecStore(
                "az",
                config=cast("AzureConfig", settings.config),
                client_options=cast("ClientConfig", settings.client_options),
                retry_config=cast("RetryConfig", settings.retry_config),
                **settings.provider(),
                **_NOT_CACHED,
            ),
        )
        self.azure_settings = settings
        self.fallback = fallback
        self._stores: dict[str, Any] = {}
        self._lock = threading.Lock()
        wait_at_exit()  # as ObstoreIO: obstore's threads hand results to event loops

    async def _located_async(self, path: str) -> tuple[Any, str]:
        container, _, key = path.partition("/")
        return self._stores.get(container) or self._store_for(container, None), key

    def _store_for(self, bucket: str, region: str | None) -> Any:
        with self._lock:
            store = self._stores.get(bucket)
            if store is None:
                # No request here: object_store connects on the first call.
                store = AzureStore(
                    bucket,
                    config=cast("AzureConfig", self.azure_settings.config),
                    client_options=cast("ClientConfig", self.azure_settings.client_options),
                    retry_config=cast("RetryConfig", self.azure_settings.retry_config),
                    **self.azure_settings.provider(),
                )
                self._stores[bucket] = store
        return store

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        return _azure_errors(keyed="encryption_key" in self.azure_settings.config)

    # Reads classify their failures as `ObstoreIO`'s do, and Azure's refusals of a key besides.
    async def get_async(self, path: str) -> bytes:
        """One GET."""
        with _key_refusals(keyed="encryption_key" in self.azure_settings.config):
            return await super().get_async(path)

    async def get_range_and_size_async(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        """One ranged GET (a HEAD if the range is empty)."""
        with _key_refusals(keyed="encryption_key" in self.azure_settings.config):
            return await super().get_range_and_size_async(path, start, end)

    async def size_async(self, path: str) -> int:
        """One HEAD."""
        with _key_refusals(keyed="encryption_key" in self.azure_settings.config):
            return await super().size_async(path)

    async def modified_async(self, path: str) -> datetime:
        """One HEAD."""
        with _key_refusals(keyed="encryption_key" in self.azure_settings.config):
            return await super().modified_async(path)

    async def delete_async(self, paths: Iterable[str]) -> None:
        """One Blob Batch per container and 256 blobs; if a blob was missing (Azure fails its part: object_store then
        raises for it alone), one DELETE per blob of that batch, a missing one no error."""
        paths = list(paths)
        for container, (store, keys) in (await self._by_bucket(paths)).items():
            try:
                with _mapped_errors():
                    await obstore.delete_async(store, keys)
            except FileNotFoundError:
                await asyncio.gather(*(_delete_one(store, key) for key in keys))
            except PermissionError:
                if self.fallback is None:
                    raise
                await self.fallback().delete_async([f"{container}/{key}" for key in keys])


async def _delete_one(store: Any, key: str) -> None:
    with contextlib.suppress(FileNotFoundError), _mapped_errors():
        await obstore.delete_async(store, key)


_METHOD = re.compile(r"Error performing (\w+)")


@contextlib.contextmanager
def _key_refusals(*, keyed: bool) -> Iterator[None]:
    """Raise Azure's refusal of a customer-provided key (a 409, `azure_keys.key_refusal`) as one, never retried."""
    try:
        yield
    except StorageRequestError as error:
        cause = error.__cause__
        status, code, _ = (describe_failure(cause) if cause is not None else None) or (None, "", None)
        method = _METHOD.search(str(cause))
        refusal = key_refusal(status, code, method=method.group(1) if method else "", sent_key=keyed)
        if refusal is None:
            raise
        raise refusal from cause


@contextlib.contextmanager
def _azure_errors(*, keyed: bool = False) -> Iterator[None]:
    """`_mapped_errors`, but Azure's 409 ``BlobAlreadyExists`` (a conditional create found the blob) is "exists", and
    its refusal of a customer-provided key a refusal."""
    with _key_refusals(keyed=keyed), _mapped_errors():
        try:
            yield
        except AlreadyExistsError as error:
            # object_store reads any 409 as "exists"; Azure's error code says which 409 it was.
            status, code, _ = describe_failure(error) or (None, "", None)
            raise status_failure(status, code) from error
