"""
A result as an object in storage, for `FsspecToolResultStore`: the name and bytes a write sends, what a read gives back
and whether it may (retention), and the records a listing gives, in listing order.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from haystack_integrations.offload.errors import InvalidReferenceError, ResultExpiredError
from haystack_integrations.offload.stores.chunks import ContentChunks
from haystack_integrations.offload.stores.io import MULTIPART_THRESHOLD
from haystack_integrations.offload.stores.layout import parse_reference
from haystack_integrations.offload.stores.names import ContentKind, listing_order, new_object_name, parse_object_name
from haystack_integrations.offload.stores.records import StoredResult
from haystack_integrations.offload.stores.translate import storage_errors

if TYPE_CHECKING:
    from haystack_integrations.offload.stores.fsspec_store import FsspecToolResultStore

# Results larger than this are written from chunks (S3 sends one PUT below it anyway: io.MULTIPART_THRESHOLD).
STREAMED_WRITE_BYTES = MULTIPART_THRESHOLD


def prepare_write(
    store: FsspecToolResultStore, key: str, content: object, tool_name: str | None
) -> tuple[str, str, bytes | ContentChunks]:
    """The path, reference and data of a new result; refuses a write no store could make, before any I/O."""
    # `content` is checked here: callers (and the model's tools) may pass anything.
    if len(store._scope) == 1:
        raise ValueError("A tenant-scoped store does not write; write through for_session(tenant, session).")
    if not isinstance(key, str):
        raise TypeError(f"key must be a string, got {type(key).__name__}.")
    if tool_name is not None and not isinstance(tool_name, str):
        raise TypeError(f"tool_name must be a string or None, got {type(tool_name).__name__}.")
    kind: ContentKind
    data: bytes | ContentChunks
    # A large result is sent from chunks as they are encoded, so the write never holds a second whole copy.
    if isinstance(content, str):
        # surrogatepass: a string with lone surrogates still round-trips exactly instead of failing the write.
        kind = "text"
        streamed = len(content) > STREAMED_WRITE_BYTES
        data = ContentChunks(content) if streamed else content.encode("utf-8", "surrogatepass")
    elif isinstance(content, bytes):
        kind = "bytes"
        data = ContentChunks(content) if len(content) > STREAMED_WRITE_BYTES else content
    elif isinstance(content, bytearray | memoryview):
        # Copied: the caller may change it while a write-behind upload is still reading it.
        data, kind = bytes(content), "bytes"
    else:
        raise TypeError(f"content must be str or bytes, got {type(content).__name__}.")
    name = new_object_name(key=key, kind=kind, tool_name=tool_name)
    return f"{store._scope_path()}/{name}", name, data


def size_of(data: bytes | ContentChunks) -> int:
    """How many bytes a write sends."""
    return data.nbytes if isinstance(data, ContentChunks) else len(data)


def decoded(segments: tuple[str, ...], data: bytes) -> str | bytes:
    """What a read returns: text for a result written as text, else the bytes."""
    parsed = parse_object_name(segments[-1])
    if parsed is not None and parsed.kind == "text":
        return data.decode("utf-8", "surrogatepass")
    return data


async def readable_path_async(store: FsspecToolResultStore, reference: object) -> tuple[str, tuple[str, ...]]:
    """
    Resolve a reference for reading, once a write of it in flight has landed, refusing an expired result: its name
    settles a live one at no cost, and the storage's clock (one HEAD) one whose name says expired, whose writer's clock
    may be wrong.
    """
    path, segments = store._path_of(reference)
    await store._handle.in_flight.wait_for(path)
    if store.retention is None:
        return path, segments
    parsed = parse_object_name(segments[-1])
    if parsed is None:
        return path, segments
    tenant = store._tenant_of(segments)
    now = datetime.now(UTC)
    if store.retention.live_by_name(parsed.created, tenant, now=now):
        return path, segments
    with storage_errors("read the result", reference=str(reference)):
        stored = await store._handle.request("modified", path, lambda io: io.modified_async(path))
    created = parsed.created if stored is None else stored
    if store.retention.expired(created, tenant, now=now):
        message = store.retention.expiry_message(reference, created, tenant, now=now, by_storage=stored is not None)
        raise ResultExpiredError(message)
    return path, segments


def records_of(
    store: FsspecToolResultStore, found: dict[str, int], *, include_expired: bool = False
) -> list[StoredResult]:
    """The results of a listing of the store's scope, newest first (`listing_key`)."""
    prefix = store._scope_path() + "/"
    now = datetime.now(UTC)
    records = []
    for path, size in found.items():
        # Backends list by string prefix; the separator keeps a sibling prefix ('t/ab' for 't/a') out.
        if not path.startswith(prefix):
            continue
        relative = path[len(prefix) :]
        try:
            segments = parse_reference(relative, scope_depth=len(store._scope))
        except InvalidReferenceError:
            continue  # not a result: a temporary file, an approval record, something an operator put there
        parsed = parse_object_name(segments[-1])
        if parsed is None:
            continue
        if (
            not include_expired
            and store.retention is not None
            and store.retention.expired(parsed.created, store._tenant_of(segments), now=now)
        ):
            continue  # unreadable: listing it would only send the model to an error
        records.append(
            StoredResult(
                reference=relative,
                kind=parsed.kind,
                size=size,
                created=parsed.created,
                tool_name=parsed.tool_name,
                key=parsed.key,
            )
        )
    records.sort(key=listing_key)
    return records


def record_of(reference: str, segments: tuple[str, ...], size: int) -> StoredResult:
    """The record of one result, from its reference's segments and its size."""
    parsed = parse_object_name(segments[-1])
    if parsed is None:  # parse_reference already checked the name; this keeps mypy and future edits honest
        raise InvalidReferenceError(f"The reference {reference!r} does not name a stored result.")
    return StoredResult(
        reference=reference,
        kind=parsed.kind,
        size=size,
        created=parsed.created,
        tool_name=parsed.tool_name,
        key=parsed.key,
    )


def listing_key(record: StoredResult) -> tuple[timedelta, tuple[bool, str], str]:
    """Newest first; within one time, in the order a session's listing gives names (`names.listing_order`)."""
    return _LATEST - record.created, listing_order(record.reference.rpartition("/")[2]), record.reference


_LATEST = datetime.max.replace(tzinfo=UTC)


def check_range(start: int, end: int) -> None:
    """Refuse a negative or reversed byte range."""
    if start < 0 or end < start:
        raise ValueError(f"Invalid byte range [{start}, {end}): start must be >= 0 and end >= start.")
