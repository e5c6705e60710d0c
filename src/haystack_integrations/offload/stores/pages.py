"""
Listings that cost a page: one LIST (``start-after`` and ``max-keys`` on S3) instead of a walk of a whole scope.

`list_after_async` lists the objects below a directory that sort after a key, at most a number of them (up to 1000 in
one request on either S3 engine; other engines walk and filter); `session_page_async` builds a page of a session's
results on it, newest first, with the reference to continue after.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from haystack_integrations.offload.stores.io import Engine
from haystack_integrations.offload.stores.names import NEWEST_FIRST_MARK, is_legacy_name, listing_order

# S3 returns at most this many keys per LIST.
S3_PAGE_KEYS = 1000
# Legacy names (counting up) all sort after this, and every newest-first name before it.
_LEGACY_FROM = NEWEST_FIRST_MARK + "~"

Entry = tuple[str, int]
"""A listed object: its full path and its size."""
Lister = Callable[[str | None, int | None], Awaitable[builtins.list[Entry]]]
"""Lists a directory's objects after a full path (None: from the start), at most a number of them (None: all)."""


async def list_after_async(io: Engine, path: str, start_after: str | None, limit: int | None) -> list[Entry]:
    """
    The objects below the directory `path` that sort after `start_after`, in lexical order, at most `limit`.

    :param io: The engine.
    :param path: The directory, without a trailing separator.
    :param start_after: A full path; only objects sorting after it are listed. None: from the first.
    :param limit: The most objects to return; None for all. On S3 up to 1000 objects are one LIST.
    :returns: Full paths and sizes, in lexical order.
    """
    # Engine support sits here, not in the engines' modules, so `Engine.find_async` keeps its contract; an engine
    # this module does not know lists through its find_async and filters (a walk of the directory, as before).
    # Imported here: each engine's module imports its client library, which may not be installed.
    from haystack_integrations.offload.stores.obstore_io import ObstoreIO
    from haystack_integrations.offload.stores.s3fs_io import S3IO

    if isinstance(io, ObstoreIO):
        listed = await _obstore_after_async(io, path, start_after, limit)
        if listed is not None:
            return listed
        if io.fallback is None:  # pragma: no cover - _obstore_after_async raised then
            raise RuntimeError("unreachable")
        io = io.fallback()
        if isinstance(io, S3IO):
            return await io._run_async(_s3fs_after, path, start_after, limit)
    elif isinstance(io, S3IO):
        return await io._run_async(_s3fs_after, path, start_after, limit)
    found = await io.find_async(path)
    entries = sorted((name, _size(value)) for name, value in found.items() if start_after is None or name > start_after)
    return entries if limit is None else entries[:limit]


def _size(value: object) -> int:
    # find_async gives sizes; a listing with times (size, modified) gives its size first.
    if isinstance(value, tuple):
        return int(value[0])
    if isinstance(value, int):
        return value
    return int(getattr(value, "size", 0))


async def _obstore_after_async(io: Any, path: str, start_after: str | None, limit: int | None) -> list[Entry] | None:
    import obstore
    from obstore.exceptions import InvalidPathError

    from haystack_integrations.offload.stores.obstore_io import _mapped_errors

    store, key = await io._located_async(path)
    bucket = path.partition("/")[0]
    offset = start_after.partition("/")[2] if start_after is not None else None
    entries: list[Entry] = []
    try:
        with _mapped_errors():
            # object_store asks S3 for the next page only when the stream is read past this one: a page of up to
            # 1000 keys read here is one LIST (with start-after).
            chunk = S3_PAGE_KEYS if limit is None else max(1, min(limit, S3_PAGE_KEYS))
            stream = obstore.list(store, key or None, offset=offset, chunk_size=chunk)
            async for batch in stream:
                # Azure has no start-after (only its own continuation markers): object_store lists from the first key
                # there, so the offset is applied here too (a no-op on S3, which applied it already).
                entries.extend(
                    (f"{bucket}/{meta['path']}", int(meta["size"]))
                    for meta in batch
                    if offset is None or meta["path"] > offset
                )
                if limit is not None and len(entries) >= limit:
                    break
    except InvalidPathError:
        if io.fallback is None:
            raise
        return None
    return entries if limit is None else entries[:limit]


async def _s3fs_after(fs: Any, path: str, start_after: str | None, limit: int | None) -> list[Entry]:
    bucket, key, _ = fs.split_path(path)
    arguments: dict[str, Any] = {"Bucket": bucket, "Prefix": key.rstrip("/") + "/" if key else ""}
    if start_after is not None:
        arguments["StartAfter"] = fs.split_path(start_after)[1]
    entries: list[Entry] = []
    while True:
        wanted = S3_PAGE_KEYS if limit is None else min(limit - len(entries), S3_PAGE_KEYS)
        response = await fs._call_s3("list_objects_v2", MaxKeys=wanted, **arguments)
        entries.extend((f"{bucket}/{item['Key']}", int(item.get("Size") or 0)) for item in response.get("Contents", []))
        token = response.get("NextContinuationToken")
        if not response.get("IsTruncated") or not token or (limit is not None and len(entries) >= limit):
            return entries
        arguments["ContinuationToken"] = token


@dataclass(frozen=True)
class PageOfNames:
    """A page of result names in listing order, and whether more may follow it."""

    names: list[tuple[str, int]]
    """Names (relative to the session's directory) and sizes, newest first."""
    more: bool


async def session_page_async(
    lister: Lister,
    directory: str,
    *,
    after: str | None,
    limit: int,
    keep: Callable[[str], bool],
) -> PageOfNames:
    """
    The next `limit` results of a session, newest first, after the result named `after`.

    Results named newest first are read a page at a time: the first page of a session holding only those is one
    LIST whatever the session holds. Legacy results (named oldest first, written before) follow them: reaching them
    lists them all (they are no more than were written before the upgrade, and purges only shrink them).

    :param lister: Lists the session's directory after a full path, at most a number of objects.
    :param directory: The session's directory (full path, no trailing separator).
    :param after: The name of the last result of the previous page; None for the first page.
    :param limit: The most results to return.
    :param keep: Whether a name is a result to list (a result name, not expired).
    :returns: The page.
    """
    prefix = directory + "/"
    names: list[tuple[str, int]] = []
    if after is None or not is_legacy_name(after):
        # Dot-directories (session documents) and temporary files sort before the mark: start after it.
        start = prefix + (after if after is not None else NEWEST_FIRST_MARK)
        while True:
            # One more than wanted: whether it comes back says whether another page follows.
            wanted = limit + 1 - len(names)
            entries = await lister(start, wanted)
            for index, (path, size) in enumerate(entries):
                name = path[len(prefix) :] if path.startswith(prefix) else None
                if name is None or "/" in name:
                    continue
                if name >= _LEGACY_FROM:
                    # The listing ran into legacy names: all of them already, when it came back whole.
                    whole = entries[index:] if len(entries) < wanted else None
                    return await _with_legacy_async(lister, prefix, names, None, limit, keep, listed=whole)
                if keep(name):
                    if len(names) == limit:
                        return PageOfNames(names, more=True)
                    names.append((name, size))
            if len(entries) < wanted:
                return PageOfNames(names, more=False)
            if len(names) == limit:
                # Full, and the listing went on past objects that are not results: say more may follow (the next
                # page may be empty) rather than send a LIST to know.
                return PageOfNames(names, more=True)
            start = entries[-1][0]
    return await _with_legacy_async(lister, prefix, names, after, limit, keep)


async def _with_legacy_async(
    lister: Lister,
    prefix: str,
    names: list[tuple[str, int]],
    after: str | None,
    limit: int,
    keep: Callable[[str], bool],
    *,
    listed: list[Entry] | None = None,
) -> PageOfNames:
    # Legacy names count up: the newest is the last listed, so all of them are listed and ordered here.
    if listed is None:
        listed = await lister(prefix + _LEGACY_FROM, None)
    legacy = [
        (path[len(prefix) :], size)
        for path, size in listed
        if path.startswith(prefix) and "/" not in path[len(prefix) :]
    ]
    ordered = sorted(
        ((name, size) for name, size in legacy if keep(name) and (after is None or name < after)),
        key=lambda item: listing_order(item[0]),
    )
    room = limit - len(names)
    return PageOfNames([*names, *ordered[:room]], more=len(ordered) > room)


def sizes_of(found: Mapping[str, object]) -> dict[str, int]:
    """
    :param found: A listing: paths and sizes (or sizes with times).
    :returns: Paths and sizes.
    """
    return {path: _size(value) for path, value in found.items()}
