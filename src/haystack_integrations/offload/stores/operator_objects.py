"""
The operator's view of a store's scope, for `FsspecToolResultStore.find_objects`, `find_children`, `delete_objects`
and `activity_times`: the objects below the scope by their paths relative to it, whatever wrote them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from haystack_integrations.offload.stores.retention import read_activity_times_async
from haystack_integrations.offload.stores.translate import storage_errors

if TYPE_CHECKING:
    from haystack_integrations.offload.stores.fsspec_store import FsspecToolResultStore


async def objects_below_async(store: FsspecToolResultStore) -> dict[str, int]:
    """`FsspecToolResultStore.find_objects_async` (see there)."""
    scope = store._scope_path()
    prefix = scope + "/"
    await store._handle.in_flight.wait_under(prefix)
    with storage_errors("list the store", reference=None):
        found = await store._handle.request("find", scope, lambda io: io.find_async(scope))
    # A sibling prefix ('t/ab' when 't/a' is listed) is not below the scope.
    return {path[len(prefix) :]: size for path, size in found.items() if path.startswith(prefix)}


@dataclass(frozen=True)
class ScopeChildren:
    """What lies directly below a store's scope (`FsspecToolResultStore.find_children`), by name relative to it."""

    directories: list[str]
    """The directories below it, sorted: a root's tenants, a tenant's sessions (and dot-directories of its own)."""
    objects: dict[str, int]
    """The scope's own objects, with their sizes (none in a root or a tenant this library wrote alone)."""


async def children_below_async(store: FsspecToolResultStore) -> ScopeChildren:
    """`FsspecToolResultStore.find_children_async` (see there)."""
    scope = store._scope_path()
    prefix = scope + "/"
    with storage_errors("list the store", reference=None):
        found = await store._handle.request("list", scope, lambda io: io.children_async(scope))
    return ScopeChildren(
        [path[len(prefix) :] for path in found.directories if path.startswith(prefix)],
        {path[len(prefix) :]: size for path, size in found.objects.items() if path.startswith(prefix)},
    )


async def delete_below_async(store: FsspecToolResultStore, paths: Iterable[str]) -> None:
    """`FsspecToolResultStore.delete_objects_async` (see there)."""
    scope = store._scope_path()
    full = [f"{scope}/{checked_relative(path)}" for path in paths]
    try:
        with storage_errors("delete objects", reference=None):
            await store._handle.request("delete", scope, lambda io: io.delete_async(full))
    finally:
        store._handle.invalidate(store._scope)


async def activity_times_below_async(store: FsspecToolResultStore, paths: Iterable[str]) -> dict[str, datetime | None]:
    """`FsspecToolResultStore.activity_times_async` (see there)."""
    relative = [checked_relative(path) for path in paths]
    base = store._scope_path()
    times = await read_activity_times_async(store._handle.request, [f"{base}/{path}" for path in relative])
    return {path: times[f"{base}/{path}"] for path in relative}


def checked_relative(path: str) -> str:
    """A path relative to a scope, refused if it could leave it."""
    # Operators' paths come from find_objects; anything that could leave the scope is a bug or an attack.
    if not isinstance(path, str):
        raise TypeError(f"An object path must be a string, got {type(path).__name__}.")
    if any(segment in {"", ".", ".."} or "\\" in segment or "\0" in segment for segment in path.split("/")):
        raise ValueError(f"{path!r} is not a path relative to the store's scope.")
    return path
