"""
Retention: how long results stay readable (per store, overridable per tenant), and ending a session.

Every result's object name carries its creation time (`names.py`), so expiry costs no request: `read` refuses an
expired result before sending anything, `list` leaves it out, and ``purge(expired=True)`` deletes every expired
result in the store's scope with one LIST and batched deletes. Expired results also stop counting against quotas.

Retention in the store is a promise to readers ("after 7 days a result is gone"); pair it with the bucket's
lifecycle rule (``infra/``), which deletes old objects even if no purge runs.

`end_session` is for the application: when a conversation ends (the user closes it, the account is deleted), it
deletes that session's results at once, without waiting for their time to live.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator

from haystack_integrations.offload.stores.scope import validate_scope_id

if TYPE_CHECKING:
    from haystack_integrations.offload.stores.fsspec_store import FsspecToolResultStore


class Retention(BaseModel):
    """
    How long results stay readable: a time to live for the store, and per-tenant exceptions.

    A result older than its tenant's time to live is refused by `read` with `ResultExpiredError` (the model is told
    the result expired), left out of `list`, and deleted by ``purge(expired=True)``.

    ```python
    from datetime import timedelta
    from haystack_integrations.offload import FsspecToolResultStore, Retention

    results = FsspecToolResultStore(
        "s3://acme-agent-results/prod",
        retention=Retention(ttl=timedelta(days=30), tenants={"trial-org": timedelta(days=1), "archive-org": None}),
    )
    results.purge(expired=True)  # e.g. nightly, from a scheduled job or `offload-haystack purge`
    ```

    Multi-user use: set it on the root store; every session store derived from it applies its tenant's time to live.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttl: timedelta | None = Field(default=None, description="Time to live of every result; None keeps them.")
    tenants: dict[str, timedelta | None] = Field(
        default_factory=dict, description="Per-tenant time to live, replacing `ttl` (None keeps that tenant's)."
    )

    @field_validator("ttl")
    @classmethod
    def _positive(cls, ttl: timedelta | None) -> timedelta | None:
        if ttl is not None and ttl <= timedelta(0):
            raise ValueError("A time to live must be positive.")
        return ttl

    @field_validator("tenants")
    @classmethod
    def _valid_tenants(cls, tenants: Mapping[str, timedelta | None]) -> dict[str, timedelta | None]:
        for tenant, ttl in tenants.items():
            validate_scope_id(tenant, field="tenant")
            cls._positive(ttl)
        return dict(tenants)

    def ttl_for(self, tenant: str | None) -> timedelta | None:
        """
        :param tenant: The tenant, or None for results outside any tenant.
        :returns: The tenant's time to live (its own, else the store's), or None when its results are kept.
        """
        if tenant is not None and tenant in self.tenants:
            return self.tenants[tenant]
        return self.ttl

    def expired(self, created: datetime, tenant: str | None, *, now: datetime | None = None) -> bool:
        """
        :param created: When the result was written (timezone-aware).
        :param tenant: Its tenant.
        :param now: The time to judge at; the current time by default.
        :returns: Whether the result has outlived its time to live.
        """
        ttl = self.ttl_for(tenant)
        return ttl is not None and created + ttl <= (now or datetime.now(UTC))


def end_session(store: FsspecToolResultStore, *, documents: bool = False) -> int:
    """
    Delete a session's results now, when the application ends the session.

    ```python
    from haystack_integrations.offload import end_session

    end_session(results.for_session(tenant=user.org_id, session=chat_id))
    ```

    :param store: A session store (from `for_session`).
    :param documents: Also delete the session's documents (approval requests and decisions, claims, audit, history).
        By default they are kept: they record what happened, and the bucket's lifecycle rule removes them in time.
    :returns: How many objects were deleted.
    :raises ValueError: If `store` is not scoped to a session.
    :raises StorageError: If the backend fails; what was not deleted yet stays.
    """
    _require_session(store)
    deleted = store.purge()
    if documents:
        deleted += store._delete_documents()
    return deleted


async def end_session_async(store: FsspecToolResultStore, *, documents: bool = False) -> int:
    """
    Async `end_session`.

    :param store: A session store.
    :param documents: Also delete the session's documents.
    :returns: How many objects were deleted.
    :raises ValueError: If `store` is not scoped to a session.
    :raises StorageError: If the backend fails.
    """
    _require_session(store)
    deleted = await store.purge_async()
    if documents:
        deleted += await store._delete_documents_async()
    return deleted


def _require_session(store: FsspecToolResultStore) -> None:
    if store.session is None:
        raise ValueError("end_session needs a session store: pass root.for_session(tenant, session).")


def document_paths(found: Mapping[str, int], scope_path: str) -> builtins.list[str]:
    """
    Pick the documents (``.<namespace>/<name>``) out of a listing of a session's directory.

    :param found: Paths and sizes from the listing.
    :param scope_path: The session's directory.
    :returns: The documents' paths.
    """
    prefix = scope_path.rstrip("/") + "/"
    paths = []
    for path in found:
        parts = path[len(prefix) :].split("/") if path.startswith(prefix) else []
        if len(parts) == 2 and parts[0].startswith(".") and len(parts[0]) > 1 and not parts[1].startswith("."):
            paths.append(path)
    return paths
