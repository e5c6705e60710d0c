"""
Small documents kept beside a scope's results: approval requests and decisions, claims, audit events, history.

They live under namespace directories (such as ``.audit/``) inside the store's scope, never listed as results.
`create` is a conditional write, the basis for exactly-once claims and optimistic concurrency on history.
"""

from __future__ import annotations

import builtins
import re
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

from haystack_integrations.offload.errors import (
    CreateOutcomeUnknownError,
    DocumentExistsError,
    InvalidReferenceError,
    ResultNotFoundError,
    StorageError,
)
from haystack_integrations.offload.stores.sync_api import synced
from haystack_integrations.offload.stores.translate import storage_errors

if TYPE_CHECKING:
    from haystack_integrations.offload.stores.io import Requests
    from haystack_integrations.offload.stores.quotas import Reservation

P = ParamSpec("P")
T = TypeVar("T")

_NAMESPACE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_DOCUMENT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}")


def writer_token() -> str:
    """
    A token unique to one writer's create (128 random bits), to put in every document created with `create`.

    :returns: 32 hex digits.
    """
    return secrets.token_hex(16)


def _checked_name(name: object) -> str:
    if not isinstance(name, str) or not _DOCUMENT_NAME.fullmatch(name):
        shown = repr(name)[:80]
        raise InvalidReferenceError(
            f"Document name {shown} is not allowed: use 1-200 of A-Z a-z 0-9 . _ - and do not start with '.'."
        )
    return name


class SyncRunner(Protocol):
    """Runs an async method for its sync twin, as the store does for its own (`stores.sync_api`)."""

    def __call__(self, operation: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Wait for `operation(*args, **kwargs)` and return its result."""
        ...


@dataclass(frozen=True)
class DocumentHost:
    """What documents need of the store they sit beside, lent by it: its scope, engine calls, quota and checks."""

    scope_path: Callable[[], str]
    request: Requests
    run_sync: SyncRunner
    # Counts a document's bytes against the quota: charged by default, refused past it when the flag is set.
    charge: Callable[[int, bool], Awaitable[Reservation | None]]
    require_exclusive_creates: Callable[[], Awaitable[None]]


class SessionDocuments:
    """
    Bytes documents in one namespace of a store's scope, with plain and conditional (create-only) writes.

    Get one with `FsspecToolResultStore.documents(namespace)`. Like the store, it holds no per-request state and
    shares the store's client, so creating one per request is cheap.

    ```python
    approvals = store.for_session("acme", "chat-42").documents("approvals")
    approvals.create("call_123.claim", b"{}")   # exactly one worker succeeds
    ```
    """

    def __init__(self, host: DocumentHost, namespace: str) -> None:
        """
        :param host: What the store whose scope the documents belong to lends them (`FsspecToolResultStore.documents`).
        :param namespace: A lower-case name such as ``"approvals"``; becomes the directory ``.<namespace>``.
        :raises ValueError: If the namespace is not a short lower-case identifier.
        """
        if not _NAMESPACE.fullmatch(namespace):
            raise ValueError(f"Document namespace {namespace!r} must match {_NAMESPACE.pattern}.")
        self.host = host
        self.namespace = namespace

    def _directory(self) -> str:
        return f"{self.host.scope_path()}/.{self.namespace}"

    def _path(self, name: object) -> str:
        return f"{self._directory()}/{_checked_name(name)}"

    def _label(self, name: object) -> str:
        return f"{self.namespace}/{name}"

    def _run_sync(self, operation: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T:
        return self.host.run_sync(operation, *args, **kwargs)  # where the store's own sync calls run

    # Each operation is written once, async; its sync twin waits for it (`stores.sync_api`).

    async def put_async(self, name: str, data: bytes, *, enforce_quota: bool = False) -> None:
        """
        Write a document, replacing any previous version (one PUT on S3).

        :param name: The document's name within the namespace.
        :param data: Its content.
        :param enforce_quota: Refuse the write if it would pass the store's quota. By default it is charged to the
            quota but never refused (see the module documentation).
        :raises StorageError: If the backend fails.
        :raises QuotaExceededError: If `enforce_quota` is set and the write would pass a quota; nothing was sent.
        """
        path, data = self._path(name), bytes(data)
        reservation = await self.host.charge(len(data), enforce_quota)
        try:
            with storage_errors(f"write document {self._label(name)!r}", reference=None):
                await self.host.request("put", path, lambda io: io.put_async(path, data))
        finally:
            _settle(reservation)

    put = synced(put_async)

    async def create_async(self, name: str, data: bytes, *, enforce_quota: bool = False) -> None:
        """
        Write a document only if it does not exist yet; atomic across processes and machines.

        `data` must be unique to this writer (carry a `writer_token`): "already exists" is resolved by reading the
        document back, and the same bytes mean the create was our own, landed by a transmission whose reply was lost.

        :param name: The document's name within the namespace.
        :param data: Its content, unique to this create.
        :param enforce_quota: Refuse the create if it would pass the store's quota. By default it is charged to the
            quota but never refused (see the module documentation).
        :raises DocumentExistsError: If another writer's document is there.
        :raises CreateOutcomeUnknownError: If whether the create landed could not be told (retryable).
        :raises ExclusiveCreatesUnsupportedError: If the backend does not refuse a second exclusive create (checked
            once per process: `FsspecToolResultStore.check_exclusive_creates`); nothing was written.
        :raises StorageError: If the backend fails.
        :raises QuotaExceededError: If `enforce_quota` is set and the create would pass a quota; nothing was sent.
        """
        path, data = self._path(name), bytes(data)
        await self.host.require_exclusive_creates()
        reservation = await self.host.charge(len(data), enforce_quota)
        try:
            with storage_errors(f"create document {self._label(name)!r}", reference=None):
                await self.host.request("put_exclusive", path, lambda io: io.put_exclusive_async(path, data))
        except DocumentExistsError as exists:
            try:
                found = await self.get_async(name)
            except (ResultNotFoundError, StorageError) as error:
                raise _unknown(self._label(name)) from error
            if found != data:
                raise exists
        finally:
            _settle(reservation)

    create = synced(create_async)

    async def get_async(self, name: str) -> bytes:
        """
        Read a document (one GET on S3).

        :param name: The document's name within the namespace.
        :returns: Its content.
        :raises ResultNotFoundError: If there is no such document.
        """
        path = self._path(name)
        with storage_errors(f"read document {self._label(name)!r}", reference=self._label(name)):
            return await self.host.request("get", path, lambda io: io.get_async(path))

    get = synced(get_async)

    async def list_async(self) -> builtins.list[str]:
        """
        List the namespace's document names in sorted order (a LIST on S3).

        :returns: The names; empty if the namespace has none.
        """
        with storage_errors(f"list documents in {self.namespace!r}", reference=None):
            directory = self._directory()
            found = await self.host.request("find", directory, lambda io: io.find_async(directory))
        prefix = self._directory() + "/"
        names = (path[len(prefix) :] for path in found if path.startswith(prefix))
        return sorted(name for name in names if _DOCUMENT_NAME.fullmatch(name))

    list = synced(list_async)

    async def delete_async(self, name: str) -> None:
        """
        Delete a document; a missing one is not an error.

        :param name: The document's name within the namespace.
        """
        path = self._path(name)
        with storage_errors(f"delete document {self._label(name)!r}", reference=None):
            await self.host.request("delete", path, lambda io: io.delete_async([path]))

    delete = synced(delete_async)


def _settle(reservation: Reservation | None) -> None:
    # Landed or not, the write keeps counting until the next listing (a failed write may have landed).
    if reservation is not None:
        reservation.settle()


def _unknown(label: str) -> CreateOutcomeUnknownError:
    # "Exists" but unreadable, or gone again (purged in between): we cannot tell whose it was. Retrying is safe, since
    # a retry of the same bytes is recognised as ours.
    return CreateOutcomeUnknownError(
        f"Could not tell whether creating document {label!r} succeeded: it exists but could not be read back."
    )
