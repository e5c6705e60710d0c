"""
Credentials per tenant on Google Cloud Storage: the worker's token exchanged at Google's STS for one downscoped by a
Credential Access Boundary to the tenant's prefix, cached per tenant and renewed before it expires.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from haystack.core.serialization import default_from_dict, default_to_dict

from haystack_integrations.offload.errors import StoragePermissionError
from haystack_integrations.offload.stores.options import require_tls

if TYPE_CHECKING:
    from google.auth.credentials import Credentials as GoogleCredentials

    from haystack_integrations.offload.stores.gcs_tokens import DownscopedToken

# The scope Google's STS needs on the token it downscopes.
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
# Read, write, list and delete objects (and abort uploads); no bucket settings. Credential Access Boundaries take
# predefined roles; this is the one Google's own examples of a prefix boundary use.
DEFAULT_ROLE = "roles/storage.objectAdmin"
LIST_PREFIX = "storage.googleapis.com/objectListPrefix"
# gcsfs's own token settings that are not credentials to downscope.
_NOT_A_SOURCE = frozenset({"anon", "cache", "browser"})


def _cel_string(value: str) -> str:
    """A CEL string literal: a root or bucket with a quote in it cannot end the condition's string early."""
    if any(ord(character) < 32 or ord(character) == 127 for character in value):
        raise ValueError("A bucket or root with control characters cannot be named in an access boundary.")
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def tenant_access_boundary(bucket: str, prefix: str, *, role: str = DEFAULT_ROLE) -> dict[str, Any]:
    """
    The Credential Access Boundary for one tenant: `role`'s permissions on the objects below ``<bucket>/<prefix>/``,
    and listings of that prefix only.

    :param bucket: The bucket.
    :param prefix: The tenant's prefix inside it, without slashes at either end (``"prod/acme"``).
    :param role: The predefined role whose permissions the token may use there.
    :returns: The boundary, as Google's STS takes it in the exchange's ``options``.
    """
    objects = f"projects/_/buckets/{bucket}/objects/{prefix}/"
    expression = (
        f"resource.name.startsWith({_cel_string(objects)}) || "
        f"api.getAttribute('{LIST_PREFIX}', '').startsWith({_cel_string(prefix + '/')})"
    )
    return {
        "accessBoundary": {
            "accessBoundaryRules": [
                {
                    "availableResource": f"//storage.googleapis.com/projects/_/buckets/{bucket}",
                    "availablePermissions": [f"inRole:{role}"],
                    "availabilityCondition": {"title": "offload-haystack tenant prefix", "expression": expression},
                }
            ]
        }
    }


class DownscopedCredentials:
    """
    Credentials per tenant on ``gs://`` stores: tokens downscoped by a Credential Access Boundary
    (`tenant_access_boundary`) to ``<root>/<tenant>/``, exchanged at Google's STS from the worker's own.

    Give it to a store (``FsspecToolResultStore("gs://bucket/prod", credentials=DownscopedCredentials())``): every store
    derived for a tenant sends that tenant's token, and Google refuses what the scope checks would; the root store keeps
    the worker's credentials. Tokens are cached per tenant, renewed in a worker thread `renew_before` they expire, one
    exchange per tenant at a time. Needs uniform bucket-level access on the bucket (boundaries do not cover ACLs).

    :param source: The credentials to downscope (google-auth); None: the store's own, as gcsfs's ``token`` storage
        option names them (a google-auth ``Credentials``, a key file, ``"cloud"``), else application default
        credentials. Their principal needs `role` (or more) on the bucket.
    :param role: The predefined role whose permissions a tenant's token may use on its prefix.
    :param renew_before: Renew each token this long before it expires.
    :param sts_endpoint_url: Google's STS token endpoint; None: ``https://sts.<universe_domain>/v1/token``.
    :param universe_domain: The Google Cloud universe.
    """

    def __init__(
        self,
        source: GoogleCredentials | None = None,
        *,
        role: str = DEFAULT_ROLE,
        renew_before: timedelta = timedelta(minutes=10),
        sts_endpoint_url: str | None = None,
        universe_domain: str = "googleapis.com",
    ) -> None:
        if renew_before < timedelta(0):
            raise ValueError("renew_before must be at least 0.")
        if not role.startswith(("roles/", "projects/", "organizations/")):
            raise ValueError(f"role {role!r} is not a role name (e.g. 'roles/storage.objectAdmin').")
        self.source = source
        self.role = role
        self.renew_before = renew_before
        self.sts_endpoint_url = sts_endpoint_url
        self.universe_domain = universe_domain
        self.calls = 0  # exchanges sent to STS, for tests and benchmarks
        self._tokens: dict[str, DownscopedToken] = {}
        self._guard = threading.Lock()
        self._source: GoogleCredentials | None = None
        self._session: Any = None

    @property
    def token_url(self) -> str:
        """The STS endpoint tokens are exchanged at."""
        return self.sts_endpoint_url or f"https://sts.{self.universe_domain}/v1/token"

    def check(self, options: Mapping[str, Any]) -> None:
        """
        Refuse what cannot work, before anything is sent.

        :param options: The store's storage options.
        :raises ValueError: If there are no credentials to downscope (gcsfs's ``token="anon"``, with no `source`), or
            the STS endpoint would receive the worker's token over plain HTTP on another machine.
        """
        token = options.get("token")
        if self.source is None and isinstance(token, str) and token in _NOT_A_SOURCE:
            raise ValueError(
                f"credentials=DownscopedCredentials() downscopes the store's own credentials, and token={token!r} "
                "names none: give source= or a token gcsfs can refresh (a key file, 'google_default', 'cloud')."
            )
        require_tls(
            self.token_url, sends="credentials=DownscopedCredentials() sends the store's token to its STS endpoint"
        )

    def current(self, bucket: str, prefix: str) -> DownscopedToken | None:
        """The token for ``<bucket>/<prefix>``, while it is not due for renewal."""
        token = self._tokens.get(f"{bucket}/{prefix}")
        return token if token is not None and not token.due() else None

    def credentials_for(
        self, tenant: str, *, bucket: str, prefix: str, base_options: Mapping[str, Any]
    ) -> DownscopedToken:
        """
        The tenant's token: the cached one, renewed in place (one exchange at a time) when due.

        Blocking (an HTTPS exchange with STS, maybe a refresh of the source first): the store calls it in a worker
        thread. The same object is returned each time, so a tenant's gcsfs client keeps it across renewals.

        :param tenant: The tenant id (the boundary names its prefix).
        :param bucket: The store's bucket.
        :param prefix: The tenant's prefix inside it (``"prod/acme"``).
        :param base_options: The store's storage options, secrets resolved: where the source comes from.
        :returns: The token, fresh.
        :raises StoragePermissionError: If STS or the source refused.
        :raises StorageError: If STS could not be reached, after its attempts; the next request asks again.
        """
        import google.auth.exceptions

        from haystack_integrations.offload.stores.gcs_tokens import DownscopedToken

        scope = f"{bucket}/{prefix}"
        with self._guard:
            token = self._tokens.get(scope)
            if token is None:
                try:
                    source, session = self._source_and_session(base_options)
                except google.auth.exceptions.GoogleAuthError as error:  # no application default credentials
                    message = f"No credentials to downscope for this tenant: {type(error).__name__}."
                    raise StoragePermissionError(message) from error
                token = DownscopedToken(
                    source,
                    tenant_access_boundary(bucket, prefix, role=self.role),
                    token_url=self.token_url,
                    renew_before=self.renew_before,
                    session=session,
                    counted=self._count,
                )
                self._tokens[scope] = token
        token.refresh(None)  # nothing sent unless due
        return token

    def _count(self) -> None:
        with self._guard:
            self.calls += 1

    def _source_and_session(self, options: Mapping[str, Any]) -> tuple[GoogleCredentials, Any]:
        # Called under the guard. The first store's options name the source for every store sharing this object.
        if self._source is None:
            import requests

            self._source = self.source if self.source is not None else worker_credentials(options)
            self._session = requests.Session()
        return self._source, self._session

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize by reference: the settings, never a credential.

        :raises ValueError: If `source` was given (a credentials object is not serialized): leave it None, and name
            the credentials in the store's storage options or the environment.
        """
        if self.source is not None:
            raise ValueError("DownscopedCredentials with a source= object cannot be serialized.")
        return default_to_dict(
            self,
            role=self.role,
            renew_before=self.renew_before.total_seconds(),
            sts_endpoint_url=self.sts_endpoint_url,
            universe_domain=self.universe_domain,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DownscopedCredentials:
        """Deserialize what `to_dict` made."""
        parameters = data.get("init_parameters", {})
        if isinstance(parameters.get("renew_before"), int | float):
            parameters["renew_before"] = timedelta(seconds=parameters["renew_before"])
        return default_from_dict(cls, data)


def worker_credentials(options: Mapping[str, Any]) -> GoogleCredentials:
    """
    The credentials gcsfs's ``token`` option names, as google-auth credentials with the scope STS needs.

    :param options: The store's storage options, secrets resolved.
    :returns: The credentials (not yet refreshed: that is a network call, made with the first exchange).
    :raises ValueError: If the token names no credentials to downscope.
    """
    import google.auth
    import google.auth.compute_engine
    from google.auth.credentials import Credentials, with_scopes_if_required

    token = options.get("token")
    scopes = [CLOUD_PLATFORM]
    found: Credentials
    if isinstance(token, Credentials):
        found = token
    elif token is None or token == "google_default":  # noqa: S105 - gcsfs's name for a way to find credentials
        found, _ = google.auth.default(scopes=scopes)
    elif token == "cloud":  # noqa: S105 - likewise
        found = google.auth.compute_engine.Credentials()  # type: ignore[no-untyped-call]
    elif isinstance(token, dict):
        found = _key_credentials(token, scopes)
    elif isinstance(token, str) and token not in _NOT_A_SOURCE:
        with open(token, encoding="utf-8") as file:
            found = _key_credentials(json.load(file), scopes)
    else:
        raise ValueError(f"gcsfs's token={token!r} names no credentials to downscope: give source=.")
    scoped: Credentials = with_scopes_if_required(found, scopes)  # type: ignore[no-untyped-call]
    return scoped


def _key_credentials(info: Mapping[str, Any], scopes: list[str]) -> GoogleCredentials:
    """
    A service account's key or an authorized user's credentials, each by its own loader: google-auth deprecates the
    generic ones (any type of configuration, unvalidated); gcsfs's ``token`` names one of these two.
    """
    kind = info.get("type")
    if kind == "service_account":
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_info(info, scopes=scopes)  # type: ignore[no-any-return,no-untyped-call]
    if kind == "authorized_user":
        from google.oauth2 import credentials

        return credentials.Credentials.from_authorized_user_info(info, scopes=scopes)  # type: ignore[no-any-return,no-untyped-call]
    raise ValueError(
        f"gcsfs's token names credentials of type {kind!r}: a service account's key or an authorized user's "
        "credentials are downscoped from a token; give others (external accounts, impersonation) as source=."
    )
