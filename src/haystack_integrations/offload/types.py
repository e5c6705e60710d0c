"""
What the upper layers (tools, hooks, approvals, operations, server) need of a store, as small Protocols.

`FsspecToolResultStore` satisfies all of them; every layer above the store depends on these, never on the concrete
class.
"""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from haystack_integrations.offload.stores.pending import PendingWrite
    from haystack_integrations.offload.stores.records import StoredResult


@runtime_checkable
class TaggedWrites(Protocol):
    """A store whose writes record the tool that produced a result, with an async twin that never blocks the loop."""

    def write(self, *, key: str, content: str | bytes, tool_name: str | None = None) -> str:
        """Store one result; return its reference."""
        ...

    async def write_async(self, *, key: str, content: str | bytes, tool_name: str | None = None) -> str:
        """Async `write`."""
        ...


@runtime_checkable
class AsyncWrites(Protocol):
    """
    A store with an async twin of Haystack's ``write`` that does not take a tool name (a third-party store's shape).

    A runtime check sees method names only, so every `TaggedWrites` store passes it too (and is checked for
    `TaggedWrites` the same way): whether ``tool_name`` may be passed is a parameter, which no runtime Protocol
    check compares.
    """

    async def write_async(self, *, key: str, content: str | bytes) -> str:
        """Async Haystack ``write``: store one result and return its reference."""
        ...


@runtime_checkable
class WriteBehind(Protocol):
    """A store that can name a result's reference before its bytes are stored (write-behind offloading)."""

    async def begin_write_async(self, *, key: str, content: str | bytes, tool_name: str | None = None) -> PendingWrite:
        """Start storing one result; the upload goes on after this returns."""
        ...


@runtime_checkable
class RangedResults(Protocol):
    """A store that reads part of a result and tells its total size (one ranged GET on S3, a seek on disk)."""

    def read_range_and_size(self, reference: str, start: int, end: int) -> tuple[bytes, int]:
        """Bytes ``start`` to ``end`` (exclusive, cut short at the end) and the result's size in bytes."""
        ...

    async def read_range_and_size_async(self, reference: str, start: int, end: int) -> tuple[bytes, int]:
        """Async `read_range_and_size`."""
        ...


@runtime_checkable
class ListableResults(Protocol):
    """A store that lists the results in its scope, newest first."""

    def list(self, *, limit: int | None = None) -> builtins.list[StoredResult]:
        """The results' metadata, newest first, at most ``limit``."""
        ...

    async def list_async(self, *, limit: int | None = None) -> builtins.list[StoredResult]:
        """Async `list`."""
        ...


class Documents(Protocol):
    """
    Small named documents beside a scope's results: approvals, claims, audit, history.

    `create` is conditional: it raises `DocumentExistsError` when another writer created the name first, and never
    for its own create whose reply was lost (see `stores.documents`).
    """

    def put(self, name: str, data: bytes, *, enforce_quota: bool = False) -> None:
        """Write (or overwrite) a document."""
        ...

    async def put_async(self, name: str, data: bytes, *, enforce_quota: bool = False) -> None:
        """Async `put`."""
        ...

    def create(self, name: str, data: bytes, *, enforce_quota: bool = False) -> None:
        """Write a document only if no document of that name exists."""
        ...

    async def create_async(self, name: str, data: bytes, *, enforce_quota: bool = False) -> None:
        """Async `create`."""
        ...

    def get(self, name: str) -> bytes:
        """A document's bytes; `ResultNotFoundError` if there is none."""
        ...

    async def get_async(self, name: str) -> bytes:
        """Async `get`."""
        ...

    def list(self) -> builtins.list[str]:
        """The names of the namespace's documents."""
        ...

    async def list_async(self) -> builtins.list[str]:
        """Async `list`."""
        ...

    def delete(self, name: str) -> None:
        """Delete a document; deleting one that does not exist is not an error."""
        ...

    async def delete_async(self, name: str) -> None:
        """Async `delete`."""
        ...


@runtime_checkable
class SessionDocumentSource(Protocol):
    """
    A store scoped to one tenant's session that hands out the documents kept beside its results, by namespace.

    What durable approvals and their audit need of a store (unrelated to Haystack's ``DocumentStore`` of retrievable
    ``Document`` objects).
    """

    @property
    def tenant(self) -> str | None:
        """The tenant this store is scoped to, if any."""
        ...

    @property
    def session(self) -> str | None:
        """The session this store is scoped to, if any."""
        ...

    def documents(self, namespace: str) -> Documents:
        """The documents of one namespace (``approvals``, ``audit``, ``history``...) in this scope."""
        ...


__all__ = [
    "AsyncWrites",
    "Documents",
    "ListableResults",
    "RangedResults",
    "SessionDocumentSource",
    "TaggedWrites",
    "WriteBehind",
]
