"""
What is in a store, object by object: results, documents (history, approvals, audit), unfinished writes, and the rest.

One walk of a scope with the store's `find_objects`, each object classified by its name; deletes go through the
store's `delete_objects`.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from haystack_integrations.offload.stores import FsspecToolResultStore
from haystack_integrations.offload.stores.layout import place
from haystack_integrations.offload.stores.names import is_temporary_name, parse_object_name
from haystack_integrations.offload.stores.scope import validate_scope_id
from haystack_integrations.offload.types import RangedResults

ObjectKind = Literal["result", "document", "temporary", "other"]
DELETE_BATCH = 1000


@dataclass(frozen=True)
class StoredObject:
    """One object below the root, classified by its path."""

    path: str
    """The object's path relative to the root (``<tenant>/<session>/<name>`` for results)."""
    size: int
    kind: ObjectKind
    tenant: str | None = None
    session: str | None = None
    namespace: str | None = None
    """For documents: the namespace (``history``, ``approvals``, ``audit``, ...)."""
    created: datetime | None = None
    """For results: when they were written (from the name; no request needed)."""
    tool_name: str | None = None


def classify(relative: str, size: int) -> StoredObject:
    """
    Classify one object from its path relative to the store's root.

    :param relative: The path below the root.
    :param size: The object's size in bytes.
    :returns: The classified object (``other`` when it is neither a result, a document nor a temporary file of a
        valid session).
    """
    placed = place(relative)
    if placed is None:
        return StoredObject(path=relative, size=size, kind="other")
    tenant, session = placed.tenant, placed.session
    if is_temporary_name(placed.name):
        return StoredObject(path=relative, size=size, kind="temporary", tenant=tenant, session=session)
    if placed.namespace is not None and not placed.name.startswith("."):
        return StoredObject(
            path=relative, size=size, kind="document", tenant=tenant, session=session, namespace=placed.namespace
        )
    parsed = parse_object_name(placed.name) if placed.namespace is None else None
    if parsed is None:
        return StoredObject(path=relative, size=size, kind="other", tenant=tenant, session=session)
    return StoredObject(
        path=relative,
        size=size,
        kind="result",
        tenant=tenant,
        session=session,
        created=parsed.created,
        tool_name=parsed.tool_name,
    )


def scan(root: FsspecToolResultStore, *, tenant: str | None = None, session: str | None = None) -> list[StoredObject]:
    """
    List every object of the root store, or of one tenant or session (one LIST, paginated by the backend).

    :param root: An unscoped store (the operator's view of every tenant).
    :param tenant: Limit the walk to this tenant.
    :param session: Limit the walk to this session of `tenant`.
    :returns: The objects, sorted by path.
    :raises ValueError: If `root` is scoped, or `session` is given without `tenant`.
    :raises InvalidScopeIdError: If an id is not a safe path segment.
    :raises StorageError: If the backend fails (a missing bucket, a bad endpoint).
    :raises StoragePermissionError: If the credentials are refused.
    """
    require_root(root)
    below = scope_below(tenant, session)
    scope = root.for_session(*below) if len(below) == 2 else root.for_tenant(*below) if below else root
    prefix = "".join(f"{segment}/" for segment in below)
    found = scope.find_objects()
    return sorted((classify(prefix + path, size) for path, size in found.items()), key=lambda item: item.path)


@dataclass(frozen=True)
class LayoutReading:
    """A URL read as a tenant's or a session's prefix inside a root's layout (see `read_inside_layout`)."""

    root_url: str
    tenant: str
    session: str | None
    objects: list[StoredObject]
    """The objects, classified with paths relative to `root_url` (as a scan of that root's scope gives them)."""


def read_inside_layout(url: str, objects: list[StoredObject]) -> LayoutReading | None:
    """
    Whether a URL scanned as a root is rather a tenant's or a session's prefix of the root above it.

    Only when the scan found nothing of this library's as a root (every object ``other``): then each object is
    classified again as if the URL were ``<parent>/<tenant>`` or ``<grandparent>/<tenant>/<session>``, and the reading
    that makes the most of them results, documents or temporary files wins (none does: None). A root that holds
    results of its own is always a root.

    :param url: The URL scanned, e.g. ``s3://bucket/prod/acme/chat-1``.
    :param objects: What `scan` found below it as a root.
    :returns: The reading, or None to keep the URL as a root.
    """
    if not objects or any(item.kind != "other" for item in objects):
        return None
    best: tuple[int, LayoutReading] | None = None
    for depth in (1, 2):
        parent, *ids = url.rstrip("/").rsplit("/", depth)
        if len(ids) != depth or not parent or parent.endswith(":") or parent.endswith(":/"):
            continue
        try:
            scope_below(ids[0], ids[1] if depth == 2 else None)
        except ValueError:
            continue
        prefix = "".join(f"{segment}/" for segment in ids)
        again = sorted((classify(prefix + item.path, item.size) for item in objects), key=lambda item: item.path)
        own = sum(item.kind != "other" for item in again)
        if own and (best is None or own > best[0]):
            best = (own, LayoutReading(parent, ids[0], ids[1] if depth == 2 else None, again))
    return best[1] if best is not None else None


def roots_below(objects: list[StoredObject], *, deepest: int = 3, shown: int = 5) -> list[str]:
    """
    The prefixes below a URL that look like roots of this library: its ``other`` objects that are results or
    documents once their first segments are taken as the root (``prod/acme/chat-1/<result>`` below a bucket).

    :param objects: What `scan` found, relative to the URL.
    :param deepest: How many leading segments a root may have.
    :param shown: How many prefixes to return at most (the ones holding the most objects first).
    :returns: The prefixes, each ending in ``/``.
    """
    held: dict[str, int] = {}
    for item in objects:
        if item.kind != "other":
            continue
        parts = item.path.split("/")
        for depth in range(1, min(deepest, len(parts) - 3) + 1):
            prefix, rest = "/".join(parts[:depth]) + "/", "/".join(parts[depth:])
            if classify(rest, item.size).kind != "other":
                held[prefix] = held.get(prefix, 0) + 1
                break
    return sorted(held, key=lambda prefix: (-held[prefix], prefix))[:shown]


def delete(
    root: FsspecToolResultStore,
    objects: Iterable[StoredObject],
    *,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """
    Delete objects found by `scan`, in the backend's batches. Objects classified ``other`` are refused.

    Deleting a ``temporary`` file whose write is still running makes that write fail; select them by age
    (`names.is_stale_temporary`) unless the session is over.

    :param root: The store `scan` walked.
    :param objects: What to delete.
    :param on_batch: Called with the number of objects after each batch (for progress bars).
    :returns: How many objects were deleted (asked to be; a missing one is not an error).
    :raises ValueError: If an object is not a result or a document.
    :raises StorageError: If the backend fails; objects of earlier batches stay deleted.
    """
    require_root(root)
    chosen = list(objects)
    if any(item.kind == "other" for item in chosen):
        raise ValueError(
            "Only results, documents and temporary files are deleted; objects this library did not write are kept."
        )
    done = 0
    for start in range(0, len(chosen), DELETE_BATCH):
        batch = chosen[start : start + DELETE_BATCH]
        root.delete_objects(item.path for item in batch)
        done += len(batch)
        if on_batch is not None:
            on_batch(len(batch))
    return done


def read_object(root: RangedResults, path: str, start: int, end: int) -> tuple[bytes, int]:
    """
    Read a byte range of one result by its path below the root (what `cat` prints).

    :param root: An unscoped store that reads ranges (`FsspecToolResultStore`, or any `RangedResults`).
    :param path: ``<tenant>/<session>/<result name>``.
    :param start: First byte.
    :param end: One past the last byte.
    :returns: The bytes and the result's total size.
    :raises InvalidReferenceError: If `path` does not name a result (the store refuses it, reading nothing).
    :raises ResultNotFoundError: If there is no such result.
    """
    return root.read_range_and_size(path, start, end)


def require_root(root: FsspecToolResultStore) -> None:
    """
    :param root: The store an operator command was given.
    :raises ValueError: If it is scoped to a tenant or session: operator commands work on the root.
    """
    if root.scope:
        raise ValueError("Operator commands work on the root store; pass the root URL, not a scoped store.")


def scope_below(tenant: str | None, session: str | None) -> list[str]:
    """
    :param tenant: A tenant, or None for the whole root.
    :param session: A session of `tenant`, or None.
    :returns: The scope's path segments below the root, validated.
    :raises ValueError: If a session is given without its tenant.
    :raises InvalidScopeIdError: If an id is not a safe path segment.
    """
    if session is not None and tenant is None:
        raise ValueError("A session belongs to a tenant: give the tenant too.")
    below = []
    if tenant is not None:
        below.append(validate_scope_id(tenant, field="tenant"))
    if session is not None:
        below.append(validate_scope_id(session, field="session"))
    return below
