"""
Credentials per tenant on Azure Blob Storage: a directory-scoped service SAS (``sr=d``) on ``<root>/<tenant>``, signed
with the account key or a user delegation key, cached per tenant and renewed before it expires; and the storage
options that make a tenant's adlfs or obstore client send that SAS and nothing else.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from haystack.core.serialization import default_from_dict, default_to_dict
from haystack.utils import Secret, deserialize_secrets_inplace

from haystack_integrations.offload.errors import StorageError, StoragePermissionError
from haystack_integrations.offload.stores.options import require_tls

# Read, add, create, write, delete, list: what a tenant's store does below its directory; no move, ownership or ACLs.
DEFAULT_PERMISSIONS = "racwdl"
# Azurite's development account and key (documented by Microsoft, the same in every Azurite; object_store has it too).
DEVELOPMENT_ACCOUNT = "devstoreaccount1"
DEVELOPMENT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
# adlfs's and object_store's names for credentials in storage options: none reaches a tenant's client.
_CREDENTIAL_OPTIONS = frozenset(
    {"account_key", "sas_token", "credential", "client_id", "client_secret", "tenant_id", "anon", "connection_string"}
)
_ENVIRONMENT = {
    "account_name": "AZURE_STORAGE_ACCOUNT_NAME",
    "account_key": "AZURE_STORAGE_ACCOUNT_KEY",
    "connection_string": "AZURE_STORAGE_CONNECTION_STRING",
}
# A user delegation key lives at most 7 days (Azure's limit); one serves every tenant's SAS.
_DELEGATION_LIFETIME = datetime.timedelta(days=1)


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def directory_depth(directory: str) -> int:
    """The ``sdd`` of a directory SAS: how many segments its path has (``"prod/acme"``: 2)."""
    return len([segment for segment in directory.strip("/").split("/") if segment])


def directory_sas(
    account: str,
    container: str,
    directory: str,
    *,
    expiry: datetime.datetime,
    account_key: str | None = None,
    delegation_key: Any = None,
    permission: str = DEFAULT_PERMISSIONS,
    https_only: bool = True,
) -> str:
    """
    A directory-scoped service SAS (``sr=d``, ``sdd`` its depth) on ``<container>/<directory>``, made by
    azure-storage-blob's own `generate_blob_sas` (``is_directory=True``).

    :param account: The storage account's name.
    :param container: The container.
    :param directory: The directory inside it, without slashes at either end (``"prod/acme"``).
    :param expiry: When the SAS stops being valid.
    :param account_key: The account key to sign with (a service SAS); or
    :param delegation_key: a ``UserDelegationKey`` (a user delegation SAS).
    :param permission: The permissions (``sp``).
    :param https_only: Whether the SAS is valid over HTTPS only (``spr=https``); False also allows HTTP (an emulator).
    :returns: The SAS's query string, without a leading ``?``.
    :raises ValueError: If the directory is empty (that SAS would be the whole container's) or no key is given.
    """
    from azure.storage.blob import generate_blob_sas

    if not directory_depth(directory):
        raise ValueError("A directory SAS needs a directory: the container's root is not one tenant's.")
    if account_key is None and delegation_key is None:
        raise ValueError("A directory SAS is signed with an account key or a user delegation key.")
    return generate_blob_sas(
        account,
        container,
        directory.strip("/"),
        account_key=account_key,
        user_delegation_key=delegation_key,
        permission=permission,
        expiry=expiry,
        protocol="https" if https_only else "https,http",
        is_directory=True,
        sdd=directory_depth(directory),
    )


@dataclass(frozen=True)
class TenantSas:
    """One tenant's SAS and when it is due for renewal (a new object each renewal: its client is made again)."""

    sas: str
    scope: str
    expiry: datetime.datetime
    renew_at: datetime.datetime

    def due(self) -> bool:
        """Whether the SAS is due for renewal."""
        return _utcnow() >= self.renew_at

    def storage_options(self) -> dict[str, Any]:
        """The SAS as adlfs's option (the tenant's options are built by `tenant_sas_options`)."""
        return {"sas_token": self.sas}

    def __repr__(self) -> str:
        return f"TenantSas(scope={self.scope!r}, expiry={self.expiry.isoformat()})"  # never the signature


@dataclass(frozen=True)
class _Account:
    """What the store's options say about its account: name, blob endpoint, key (if any)."""

    name: str
    endpoint: str
    key: str | None


def _connection_fields(options: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    given = options.get("connection_string") or environ.get(_ENVIRONMENT["connection_string"]) or ""
    if not isinstance(given, str):
        given = given.resolve_value() if isinstance(given, Secret) else str(given)
    return {
        name.strip(): value.strip()
        for name, _, value in (part.partition("=") for part in str(given).split(";"))
        if value.strip()
    }


def _account(options: Mapping[str, Any], environ: Mapping[str, str]) -> _Account:
    """The account the store's options (secrets resolved) name, its blob endpoint, and its key if they give one."""
    fields = _connection_fields(options, environ)
    development = fields.get("UseDevelopmentStorage", "").lower() == "true"
    name = str(
        options.get("account_name")
        or fields.get("AccountName")
        or (DEVELOPMENT_ACCOUNT if development else "")
        or environ.get(_ENVIRONMENT["account_name"])
        or ""
    )
    if not name:
        raise ValueError(
            "credentials=DirectorySasCredentials() signs for the store's account: give account_name or a "
            "connection_string."
        )
    key = options.get("account_key") or fields.get("AccountKey") or (DEVELOPMENT_KEY if development else None)
    key = key or environ.get(_ENVIRONMENT["account_key"])
    if development:
        base = fields.get("DevelopmentStorageProxyUri") or environ.get("AZURITE_BLOB_STORAGE_URL")
        endpoint = f"{(base or 'http://127.0.0.1:10000').rstrip('/')}/{name}"
    elif fields.get("BlobEndpoint"):
        endpoint = fields["BlobEndpoint"]
    elif options.get("account_host"):
        endpoint = f"https://{options['account_host']}"
    else:
        suffix = fields.get("EndpointSuffix", "core.windows.net")
        endpoint = f"{fields.get('DefaultEndpointsProtocol', 'https')}://{name}.blob.{suffix}"
    return _Account(name, endpoint.rstrip("/"), str(key) if key else None)


def tenant_sas_options(options: Mapping[str, Any], sas: TenantSas, environ: Mapping[str, str]) -> dict[str, Any]:
    """
    A tenant client's storage options: every credential of the worker's left out, the tenant's SAS in a connection
    string with the account's endpoint (what adlfs uses alone when given one, and what the obstore engine reads).

    :param options: The store's storage options, secrets resolved.
    :param sas: The tenant's SAS.
    :param environ: The environment (where adlfs finds what the options leave out).
    :returns: The options.
    """
    account = _account(options, environ)
    result = {name: value for name, value in options.items() if name not in _CREDENTIAL_OPTIONS}
    result.pop("account_host", None)  # the endpoint is in the connection string
    result["account_name"] = account.name
    result["connection_string"] = (
        f"AccountName={account.name};BlobEndpoint={account.endpoint};SharedAccessSignature={sas.sas}"
    )
    return result


class DirectorySasCredentials:
    """
    Credentials per tenant on ``az://``, ``abfs://`` and ``abfss://`` stores: a directory-scoped service SAS
    (``sr=d``) on ``<container>/<root>/<tenant>`` with read, add, create, write, delete and list permissions.

    Give it to a store (``FsspecToolResultStore("az://container/prod", credentials=DirectorySasCredentials())``):
    every store derived for a tenant sends that tenant's SAS and no other credential (never the account key), so
    Azure refuses what the scope checks would; the root store (the operator's purge, inventory) keeps the worker's
    credentials. A SAS is made locally (no request) with the account key, or else with a user delegation key asked
    for once with the worker's Azure AD credential; each is cached per tenant and renewed `renew_before` it expires.

    Layout: one container, a directory per tenant below the root. Azure documents directory SAS for accounts with a
    hierarchical namespace (Data Lake Storage); `require_namespace` checks that the account has one, once, before the
    first SAS is made, and refuses a flat-namespace account with a clear error. Azure's 2026 SDKs also sign directory
    SAS for flat-namespace accounts; turn the check off to use that (not verified against Azure here).

    :param account_key: The account key to sign with; None: the store's own (``account_key``, a connection string's
        ``AccountKey``, ``AZURE_STORAGE_ACCOUNT_KEY``), else a user delegation key obtained with the worker's Azure
        AD credential (the store's ``credential``, service principal options, or azure-identity's default chain;
        it needs the Storage Blob Delegator role or more).
    :param lifetime: How long each SAS is valid.
    :param renew_before: Renew each SAS this long before it expires (less than `lifetime`).
    :param permission: The SAS's permissions (``sp``), a subset of Azure's letters.
    :param require_namespace: Refuse an account without a hierarchical namespace (one Get Account Information
        request, with the worker's credentials, per credentials object).
    """

    def __init__(
        self,
        account_key: Secret | None = None,
        *,
        lifetime: datetime.timedelta = datetime.timedelta(hours=1),
        renew_before: datetime.timedelta = datetime.timedelta(minutes=10),
        permission: str = DEFAULT_PERMISSIONS,
        require_namespace: bool = True,
    ) -> None:
        if lifetime <= datetime.timedelta(0) or lifetime > datetime.timedelta(days=7):
            raise ValueError("lifetime must be more than 0 and at most 7 days (a user delegation key's limit).")
        if not datetime.timedelta(0) <= renew_before < lifetime:
            raise ValueError("renew_before must be at least 0 and less than lifetime.")
        if not permission or set(permission) - set("racwdl"):
            raise ValueError(f"permission {permission!r} must be letters of 'racwdl' (read, add, create, ...).")
        if account_key is not None and not isinstance(account_key, Secret):
            raise ValueError("account_key must be a haystack Secret (Secret.from_env_var('AZURE_STORAGE_KEY')).")
        self.account_key = account_key
        self.lifetime = lifetime
        self.renew_before = renew_before
        self.permission = permission
        self.require_namespace = require_namespace
        self.calls = 0  # SAS made, for tests and benchmarks
        self.delegation_keys = 0  # user delegation keys asked for
        self.namespace_checks = 0  # Get Account Information requests sent
        self._tokens: dict[str, TenantSas] = {}
        self._guard = threading.Lock()
        self._checked = False
        self._delegation: Any = None

    def check(self, options: Mapping[str, Any], environ: Mapping[str, str]) -> None:
        """
        Refuse what cannot work, before anything is sent.

        :param options: The store's storage options (secrets unresolved are read as far as plain strings tell).
        :param environ: The environment.
        :raises ValueError: If no account is named, or SAS would go over plain HTTP to another machine.
        """
        if any(isinstance(options.get(name), Secret) for name in ("connection_string", "account_name")):
            return  # read at first use, secrets resolved
        account = _account(options, environ)
        require_tls(account.endpoint, sends="credentials=DirectorySasCredentials() sends each tenant's SAS")

    def current(self, bucket: str, prefix: str) -> TenantSas | None:
        """The SAS for ``<bucket>/<prefix>``, while it is not due for renewal."""
        token = self._tokens.get(f"{bucket}/{prefix}")
        return token if token is not None and not token.due() else None

    def credentials_for(self, tenant: str, *, bucket: str, prefix: str, base_options: Mapping[str, Any]) -> TenantSas:
        """
        The tenant's SAS: the cached one, or a new one when it is missing or due.

        Blocking when it asks Azure (the namespace check, a user delegation key): the store calls it in a worker
        thread. Signing itself sends nothing.

        :param tenant: The tenant id (its directory is `prefix`).
        :param bucket: The store's container.
        :param prefix: The tenant's directory inside it (``"prod/acme"``).
        :param base_options: The store's storage options, secrets resolved.
        :returns: The SAS, fresh.
        :raises StoragePermissionError: If Azure refused the worker's credentials.
        :raises StorageError: If the account has no hierarchical namespace (`require_namespace`), or Azure could not
            be reached.
        :raises ValueError: If the endpoint is plain ``http://`` on another machine.
        """
        import os

        scope = f"{bucket}/{prefix}"
        with self._guard:
            token = self._tokens.get(scope)
            if token is not None and not token.due():
                return token
            account = _account(base_options, os.environ)
            # A connection string given as a Secret is read here first: its endpoint is checked as `check` does.
            require_tls(account.endpoint, sends="credentials=DirectorySasCredentials() sends each tenant's SAS")
            key = self.account_key.resolve_value() if self.account_key is not None else account.key
            if self.require_namespace and not self._checked:
                self._check_namespace(base_options, account)
            now = _utcnow()
            expiry = now + self.lifetime
            delegation = None
            if not key:
                delegation = self._delegation_key(base_options, account, now)
                expiry = min(expiry, _parse_time(delegation.signed_expiry))
            sas = directory_sas(
                account.name,
                bucket,
                prefix,
                expiry=expiry.replace(microsecond=0),
                account_key=key,
                delegation_key=delegation,
                permission=self.permission,
                https_only=account.endpoint.startswith("https://"),
            )
            self.calls += 1
            life = expiry - now
            renew_at = expiry - self.renew_before if life > self.renew_before else now + life / 2
            token = TenantSas(sas, scope, expiry, renew_at)
            self._tokens[scope] = token
            return token

    def _check_namespace(self, options: Mapping[str, Any], account: _Account) -> None:
        # Called under the guard: one check per credentials object, whichever tenant comes first.
        with _azure_failures("check the account's hierarchical namespace"), _worker_client(options, account) as client:
            self.namespace_checks += 1
            answer = client.get_account_information()
        if answer.get("is_hns_enabled") is False:
            raise StorageError(
                f"Azure account {account.name!r} has no hierarchical namespace: the directory SAS of "
                "credentials=DirectorySasCredentials() need one (a Data Lake Storage account). Use such an account, "
                "or require_namespace=False where Azure signs directory SAS for flat-namespace accounts."
            )
        self._checked = True

    def _delegation_key(self, options: Mapping[str, Any], account: _Account, now: datetime.datetime) -> Any:
        # Called under the guard. Renewed when it would not cover a whole SAS lifetime more.
        key = self._delegation
        if key is not None and _parse_time(key.signed_expiry) - now > self.lifetime:
            return key
        with _azure_failures("get a user delegation key"), _worker_client(options, account) as client:
            self.delegation_keys += 1
            key = client.get_user_delegation_key(now - datetime.timedelta(minutes=5), now + _DELEGATION_LIFETIME)
        self._delegation = key
        return key

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize by reference: the settings, and the account key as a Secret (an environment variable's name).

        :raises ValueError: If the account key is a token Secret (Haystack serializes environment Secrets only).
        """
        return default_to_dict(
            self,
            account_key=self.account_key.to_dict() if self.account_key is not None else None,
            lifetime=self.lifetime.total_seconds(),
            renew_before=self.renew_before.total_seconds(),
            permission=self.permission,
            require_namespace=self.require_namespace,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DirectorySasCredentials:
        """Deserialize what `to_dict` made (`data` is left as it was)."""
        data = copy.deepcopy(data)
        parameters = data.setdefault("init_parameters", {})
        for name in ("lifetime", "renew_before"):
            if isinstance(parameters.get(name), int | float):
                parameters[name] = datetime.timedelta(seconds=parameters[name])
        deserialize_secrets_inplace(parameters, keys=["account_key"])
        return default_from_dict(cls, data)


def _parse_time(value: Any) -> datetime.datetime:
    if isinstance(value, datetime.datetime):
        return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
    return datetime.datetime.strptime(str(value), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


@contextlib.contextmanager
def _azure_failures(doing: str) -> Iterator[None]:
    """Azure SDK errors from a worker's request as ours: refusals as permission errors, the rest as storage errors."""
    from azure.core.exceptions import AzureError, ClientAuthenticationError, HttpResponseError

    try:
        yield
    except (AzureError, ValueError) as error:
        status = error.status_code if isinstance(error, HttpResponseError) else None
        refused = isinstance(error, ClientAuthenticationError) or status in (401, 403)
        message = f"Could not {doing} with the worker's Azure credentials: {status or type(error).__name__}."
        raise (StoragePermissionError if refused else StorageError)(message) from error


def _worker_client(options: Mapping[str, Any], account: _Account) -> Any:
    """
    A blob service client at the account's endpoint with the worker's own credentials, in adlfs's order: the store's
    ``credential``, the account key, the connection string's SAS, a service principal, else azure-identity's default
    chain. Its retries are bounded.
    """
    import os

    from azure.storage.blob import BlobServiceClient

    credential: Any = options.get("credential")
    if credential is None and account.key:
        credential = {"account_name": account.name, "account_key": account.key}
    sas = _connection_fields(options, os.environ).get("SharedAccessSignature") or options.get("sas_token")
    if credential is None and sas:
        credential = str(sas).lstrip("?")
    if credential is None and options.get("client_id") and options.get("client_secret") and options.get("tenant_id"):
        from azure.identity import ClientSecretCredential

        credential = ClientSecretCredential(
            str(options["tenant_id"]), str(options["client_id"]), str(options["client_secret"])
        )
    if credential is None:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    return BlobServiceClient(
        account.endpoint, credential=credential, retry_total=2, connection_timeout=10, read_timeout=30
    )
