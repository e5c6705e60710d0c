"""The s3fs engine: S3 held to one request per write, whole read or page, each loop with its own client."""

import asyncio
import contextlib
import errno
import functools
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from fsspec.asyn import AsyncFileSystem

from haystack_integrations.offload.errors import StorageError, StoragePermissionError
from haystack_integrations.offload.stores.async_fsspec_io import AsyncFilesystemIO
from haystack_integrations.offload.stores.failures import MissingCredentialsError, StorageRequestError, answer_failure
from haystack_integrations.offload.stores.io import (
    MULTIPART_PART_BYTES,
    MULTIPART_PARTS_IN_FLIGHT,
    MULTIPART_THRESHOLD,
    Children,
    Chunk,
    Listed,
    aware,
    drained,
    info_time,
)
from haystack_integrations.offload.stores.loop_local import CrossLoopLock, LoopLocal

logger = logging.getLogger(__name__)

# DeleteObjects takes at most 1000 keys per request.
_S3_DELETE_BATCH = 1000
# A multipart upload is aborted at most this many times while parts still show up (see `S3IO._abort_upload`).
_ABORT_ATTEMPTS = 5


class S3IO(AsyncFilesystemIO):
    """
    S3 through s3fs, held to one request per write, whole read or page.

    A write from chunks (`put_chunks`) above `MULTIPART_THRESHOLD` is a multipart upload through s3fs's client (as
    s3fs's own ``_pipe_file`` does it for large ``bytes``), its parts made from the chunks as they come, so the whole
    content never exists twice; a failed or cancelled upload is aborted.
    """

    def _failure_of_link(self, link: BaseException) -> OSError | None:
        # botocore's answer: its status decides, S3's error code refines (s3fs maps "missing", "exists" and "refused"
        # to built-in exceptions, which `failure_of` leaves as they are before reaching this link).
        botocore_errors = sys.modules.get("botocore.exceptions")
        if botocore_errors is not None and isinstance(link, botocore_errors.NoCredentialsError):
            return MissingCredentialsError(errno.EACCES, "No credentials found.")
        if botocore_errors is not None and isinstance(link, botocore_errors.ClientError):
            response = getattr(link, "response", None) or {}
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = str(response.get("Error", {}).get("Code") or "")
            return answer_failure(status if isinstance(status, int) else None, code)
        cause = _wire_failure(link)
        if cause is not None:
            return StorageRequestError(cause, transient=True)
        return super()._failure_of_link(link)

    async def _put_chunks(self, fs: AsyncFileSystem, path: str, chunks: Iterable[Chunk]) -> None:
        parts = _parts(chunks, MULTIPART_PART_BYTES)
        head, rest = _leading(parts, MULTIPART_THRESHOLD)
        if rest is None:
            # Up to MULTIPART_THRESHOLD: one PUT (joining the parts is a copy of at most that much).
            await self._put(fs, path, b"".join(head))
            return
        await self._multipart_upload(fs, path, drained(head, rest))

    async def _multipart_upload(self, fs: AsyncFileSystem, path: str, parts: Iterable[bytes]) -> None:
        bucket, key, _ = fs.split_path(path)
        upload_id = (await fs._call_s3("create_multipart_upload", Bucket=bucket, Key=key))["UploadId"]
        sent: list[dict[str, Any]] = []

        async def send(number: int, body: bytes) -> None:
            answer = await fs._call_s3(
                "upload_part", Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
            )
            sent.append({"PartNumber": number, "ETag": answer["ETag"]})

        running: set[asyncio.Future[None]] = set()
        try:
            for number, body in enumerate(parts, start=1):
                # At most MULTIPART_PARTS_IN_FLIGHT parts in memory at once; the first failure stops the upload.
                while len(running) >= MULTIPART_PARTS_IN_FLIGHT:
                    finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    for task in finished:
                        task.result()
                running.add(asyncio.ensure_future(send(number, body)))
                del body  # the task holds it; nothing here should keep a sent part alive
            while running:
                finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    task.result()
            sent.sort(key=lambda part: int(part["PartNumber"]))
            await fs._call_s3(
                "complete_multipart_upload",
                Bucket=bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": sent},
            )
        except BaseException:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await self._abort_upload(fs, bucket, key, upload_id)
            raise
        finally:
            fs.invalidate_cache(path)

    async def _abort_upload(self, fs: AsyncFileSystem, bucket: str, key: str, upload_id: str) -> None:
        # Uploaded parts are billed until aborted, and a part request cancelled on our side may still land after the
        # abort (AWS: abort again until ListParts shows none). Bounded: what is left goes to the lifecycle rule.
        for attempt in range(_ABORT_ATTEMPTS):
            with contextlib.suppress(Exception):
                await fs._call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload_id)
            try:
                listed = await fs._call_s3("list_parts", Bucket=bucket, Key=key, UploadId=upload_id)
            except FileNotFoundError:
                return  # NoSuchUpload: aborted, no part left
            except Exception:
                listed = None  # could not look: abort again
            if listed is not None and not listed.get("Parts"):
                return
            await asyncio.sleep(0.05 * 2**attempt)
        logger.warning(
            "Could not abort the multipart upload of %s/%s: its parts are left to the lifecycle rule.", bucket, key
        )

    async def _put_exclusive(self, fs: AsyncFileSystem, path: str, data: bytes) -> None:
        # Always one PUT, whatever the size: s3fs sends a large conditional create as a multipart upload, and some
        # servers (Ceph RGW) ignore If-None-Match on CompleteMultipartUpload. The status decides "exists": s3fs
        # raises FileExistsError only when the 412's body names the condition, which RGW's does not.
        bucket, key, _ = fs.split_path(path)
        try:
            await fs._call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except OSError as error:
            if s3_status(error) == 412:
                raise FileExistsError(errno.EEXIST, "The object already exists.") from error
            raise
        finally:
            fs.invalidate_cache(path)

    async def _size(self, fs: AsyncFileSystem, path: str) -> int:
        # One HEAD, never s3fs's listing cache: another worker may have written or deleted the key since we listed.
        return int((await fs._info(path, refresh=True))["size"])

    async def _modified(self, fs: AsyncFileSystem, path: str) -> datetime | None:
        # One HEAD, never the listing cache (as `_size`); S3 stamps the time with its own clock.
        return aware((await fs._info(path, refresh=True))["LastModified"])

    async def _get(self, fs: AsyncFileSystem, path: str) -> bytes:
        # With s3fs's default max_concurrency (10), `_cat_file` first HEADs the object to plan parallel ranged reads.
        # A tool result is read whole in one GET.
        return bytes(await fs._cat_file(path, max_concurrency=1))

    async def _get_range_and_size(self, fs: AsyncFileSystem, path: str, start: int, end: int) -> tuple[bytes, int]:
        # The total size comes back in the ranged GET's own Content-Range header ("bytes 0-9999/209715200"), so a page
        # with its "of N bytes" costs one request, not a HEAD and a GET.
        if end > start:
            bucket, key, _ = fs.split_path(path)
            try:
                response = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
            except OSError as error:
                if not _is_unsatisfiable_range(error):
                    raise
                # 416: the range starts at or past the end (or the object is empty); only the size is left to learn.
            else:
                try:
                    data = bytes(await response["Body"].read())
                finally:
                    response["Body"].close()
                total = _content_range_total(response.get("ContentRange"))
                if total is not None:
                    return data, total
                # No Content-Range: the server ignored the Range header and sent the whole object.
                return data[start:end], len(data)
        return b"", await self._size(fs, path)

    async def _delete(self, fs: AsyncFileSystem, paths: list[str]) -> None:
        for start in range(0, len(paths), _S3_DELETE_BATCH):
            batch = paths[start : start + _S3_DELETE_BATCH]
            bucket = fs.split_path(batch[0])[0]
            objects = [{"Key": fs.split_path(path)[1]} for path in batch]
            # s3fs's `_bulk_delete` drops per-key errors; a purge that silently keeps data is worse than one that fails.
            try:
                response = await fs._call_s3(
                    "delete_objects", Bucket=bucket, Delete={"Objects": objects, "Quiet": True}
                )
            except PermissionError:
                response = {"Errors": [{"Code": "AccessDenied"}]}  # RGW refuses the whole batch (a 403)
            errors = response.get("Errors") or []
            refused = _refused_keys(errors, [item["Key"] for item in objects])
            if refused:
                # Refused as a whole (see Engine.delete_async): one DeleteObject per key, authorised on its own.
                for key in refused:
                    await fs._call_s3("delete_object", Bucket=bucket, Key=key)
                errors = []
            if errors:
                codes = sorted({str(error.get("Code")) for error in errors})
                message = f"{len(errors)} of {len(batch)} objects could not be deleted ({', '.join(codes)})."
                if "AccessDenied" in codes:
                    raise StoragePermissionError(message)
                raise StorageError(message)
            for path in batch:
                fs.invalidate_cache(path)

    async def _find(self, fs: AsyncFileSystem, path: str) -> dict[str, int]:
        return {name: listed.size for name, listed in (await self._find_detailed(fs, path)).items()}

    async def _find_detailed(self, fs: AsyncFileSystem, path: str) -> dict[str, Listed]:
        # One LIST per 1000 keys, and nothing else: s3fs's own find, finding no key, asks for the prefix itself (a
        # HEAD of `path` without its "/"), which a tenant's session policy refuses (403) and which costs a request.
        bucket, key, _ = fs.split_path(path)
        arguments: dict[str, Any] = {"Bucket": bucket, "Prefix": key.rstrip("/") + "/" if key else ""}
        found: dict[str, Listed] = {}
        while True:
            response = await fs._call_s3("list_objects_v2", **arguments)
            for item in response.get("Contents", []):
                found[f"{bucket}/{item['Key']}"] = Listed(int(item.get("Size") or 0), info_time(item))
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return found
            arguments["ContinuationToken"] = token

    async def children_async(self, path: str) -> Children:
        """A LIST with a delimiter, one per 1000 subdirectories and objects: nothing deeper is listed."""
        return await self._run_async(self._children, path)

    async def _children(self, fs: AsyncFileSystem, path: str) -> Children:
        bucket, key, _ = fs.split_path(path)
        arguments: dict[str, Any] = {"Bucket": bucket, "Prefix": key.rstrip("/") + "/" if key else "", "Delimiter": "/"}
        directories: list[str] = []
        objects: dict[str, int] = {}
        while True:
            response = await fs._call_s3("list_objects_v2", **arguments)
            directories.extend(f"{bucket}/{item['Prefix'].rstrip('/')}" for item in response.get("CommonPrefixes", []))
            objects.update(
                (f"{bucket}/{item['Key']}", int(item.get("Size") or 0)) for item in response.get("Contents", [])
            )
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return Children(sorted(directories), objects)
            arguments["ContinuationToken"] = token


def _refused_keys(errors: list[dict[str, Any]], asked: list[str]) -> list[str]:
    """
    The keys of a batch delete refused as a whole, to delete one by one; empty when the errors say anything else.

    moto answers 200 with each key refused; RGW answers 403 (here an error without a key): then every key asked. A
    key named that was not asked for is a wrong answer, never something to delete.
    """
    if not errors or any(error.get("Code") != "AccessDenied" for error in errors):
        return []
    named = [error.get("Key") for error in errors]
    if not all(named):
        return asked
    return [str(key) for key in named] if set(named) <= set(asked) else []


def _parts(chunks: Iterable[Chunk], part_bytes: int) -> Iterator[bytes]:
    """
    Group `chunks` into parts of `part_bytes` to ``2 * part_bytes`` bytes (the last may be smaller), copying little.

    A `bytes` chunk that makes a part by itself is passed on as it is (an encoded text chunk of `part_bytes` or more
    does); a larger one is cut into ``part_bytes`` slices; smaller pieces are joined (one copy of one part). Parts are
    `bytes`: aiohttp warns about (and the suite fails on) large `bytearray` bodies.
    """
    pieces: list[memoryview] = []
    size = 0
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        for start in range(0, view.nbytes, part_bytes):
            piece = view[start : start + part_bytes]
            pieces.append(piece)
            size += piece.nbytes
            if size >= part_bytes:
                yield _joined(pieces)
                pieces, size = [], 0
    if pieces:
        yield _joined(pieces)


def _joined(pieces: list[memoryview]) -> bytes:
    # One piece covering a whole bytes object is that object: no copy.
    if len(pieces) == 1 and isinstance(pieces[0].obj, bytes) and pieces[0].nbytes == len(pieces[0].obj):
        return pieces[0].obj
    return b"".join(pieces)


def _leading(parts: Iterator[bytes], limit: int) -> tuple[list[bytes], Iterator[bytes] | None]:
    """
    The first parts while they total at most `limit` bytes, and the rest (None when there is no more).

    Decides between one PUT and a multipart upload without knowing the total: at most `limit` plus one part is read
    ahead.
    """
    head: list[bytes] = []
    size = 0
    for part in parts:
        head.append(part)
        size += len(part)
        if size > limit:
            return head, parts
    return head, None


def _content_range_total(content_range: object) -> int | None:
    """Return the total size from a ``Content-Range: bytes 0-9/100`` value, or None when absent or unknown (``*``)."""
    if not isinstance(content_range, str) or "/" not in content_range:
        return None
    total = content_range.rsplit("/", 1)[1].strip()
    return int(total) if total.isdigit() else None


def s3_status(error: BaseException) -> int | None:
    """
    The HTTP status behind an s3fs error (s3fs maps several statuses to one errno, and some by the body's text).

    :param error: An exception s3fs raised, chained to botocore's ``ClientError``.
    :returns: The status, or None if the error carries no S3 answer.
    """
    response = getattr(error.__cause__, "response", None) or getattr(error, "response", None) or {}
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def _is_unsatisfiable_range(error: OSError) -> bool:
    """Whether s3fs's error is S3's 416 InvalidRange (s3fs maps it to a plain EINVAL, shared with other codes)."""
    response = getattr(error.__cause__, "response", None) or {}
    return bool(s3_status(error) == 416 or response.get("Error", {}).get("Code") == "InvalidRange")


def s3_io_with_loop_clients(
    fs: AsyncFileSystem, make_client: Callable[[], AsyncFileSystem], *, sessions: "SharedSessions | None" = None
) -> S3IO:
    """
    An `S3IO` whose async calls run on the caller's own loop, each loop with its own client.

    The clients share one aiobotocore session (`SharedSessions`): a new loop's client then skips loading and parsing
    botocore's S3 model and resolving credentials again, which is most of what a first call on a new loop costs. Only
    the client, whose aiohttp connector belongs to its loop, is made per loop.

    :param fs: The s3fs filesystem for sync calls (and calls from fsspec's own loop).
    :param make_client: Builds an ``asynchronous=True`` s3fs filesystem with the same settings, for the running loop.
    :param sessions: The session to share, when several stores' clients share one (a root's tenant clients, whose
        credentials are given per client): their S3 model is then loaded once per process, not once per tenant.
        None: one of this store's own.
    :returns: The I/O.
    """
    sessions = sessions if sessions is not None else SharedSessions()
    # The sync client too, so every client of the store sends PUTs without "Expect: 100-continue" (`SharedAioSession`).
    if getattr(fs, "session", _NO_SESSION_ATTRIBUTE) is None:
        sessions.attach(fs)
    clients: LoopLocal[AsyncFileSystem] = LoopLocal(
        lambda: sessions.attach(make_client()), _close_s3_client, _close_s3_client_now
    )
    return S3IO(fs, loop_clients=clients)


class SharedSessions:
    """
    Gives every client of one store (its sync client and each loop's), or of several (a root's tenant clients), the
    same aiobotocore session, made from the first client's settings.
    """

    def __init__(self) -> None:
        self._session: Any = None
        self._lock = threading.Lock()

    def attach(self, fs: AsyncFileSystem) -> AsyncFileSystem:
        """Set `fs`'s session to the shared one, unless it has one already (a ``session`` storage option)."""
        if getattr(fs, "session", _NO_SESSION_ATTRIBUTE) is not None:
            return fs  # not s3fs, or the caller's own session: used as given
        with self._lock:
            if self._session is None:
                # What s3fs itself would make (its extra keyword arguments, e.g. ``profile``, go to the session).
                self._session = _shared_session_class()(**getattr(fs, "kwargs", {}))
            session = self._session
        fs.session = session
        fs._session_is_owned = False  # so s3fs never replaces it with one of the twin's own
        return fs


_NO_SESSION_ATTRIBUTE = object()


@functools.cache
def _shared_session_class() -> type:
    """An aiobotocore session that clients on several event loops (and threads) may share."""
    from aiobotocore.credentials import AioRefreshableCredentials  # s3fs's dependency: only needed with s3fs
    from aiobotocore.session import AioSession
    from botocore.handlers import add_expect_header

    class SharedAioSession(AioSession):  # type: ignore[misc]
        """
        `AioSession`, made safe to share across loops.

        Client creation is serialized (botocore sessions are not safe to build clients from concurrently: lazily made
        components race), and refreshable credentials, shared by every client, get a `CrossLoopLock` instead of
        their `asyncio.Lock`, which would bind to the first loop that waits on a refresh and fail on any other.

        Its clients send no ``Expect: 100-continue``: aiohttp starts the read timeout only once a body is sent, and
        holds the body until "100 Continue" comes, so a PUT to an endpoint that never answers waited past botocore's
        read_timeout, until the retry policy's attempt limit (obstore sends no such header either).
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._creating_client = CrossLoopLock()
            # Clients copy the session's handlers when made: none of them adds the header.
            self.unregister("before-call.s3", add_expect_header)

        async def _create_client(self, *args: Any, **kwargs: Any) -> Any:
            async with self._creating_client:
                return await super()._create_client(*args, **kwargs)

        async def get_credentials(self) -> Any:
            credentials = await super().get_credentials()
            if isinstance(credentials, AioRefreshableCredentials) and isinstance(
                getattr(credentials, "_refresh_lock", None), asyncio.Lock
            ):
                credentials._refresh_lock = CrossLoopLock()
            return credentials

    return SharedAioSession


async def _close_s3_client(fs: AsyncFileSystem) -> None:
    creator = getattr(fs, "_s3creator", None)  # set by s3fs once the client exists
    if creator is not None:
        await creator.__aexit__(None, None, None)


def _close_s3_client_now(fs: AsyncFileSystem, loop: asyncio.AbstractEventLoop) -> None:
    creator = getattr(fs, "_s3creator", None)
    if creator is not None:
        # s3fs's own finalizer for its sync instances: closes the connection pool without the (closed) loop.
        type(fs).close_session(loop, creator)


async def close_s3_io_async(io: S3IO) -> None:
    """
    Close an `S3IO` its store is done with: every loop's client (`LoopLocal.close_async`) and the sync client, whose
    connection pool belongs to fsspec's loop (closed there; awaited only when that is the running loop).

    :param io: The I/O to close. Its filesystem must be the store's own (never one from fsspec's instance cache).
    """
    if io.loop_clients is not None:
        await io.loop_clients.close_async()
    fs = io.async_fs
    creator = getattr(fs, "_s3creator", None)
    if creator is None:
        return
    fs._s3creator = None
    fs._s3 = None
    loop = getattr(fs, "loop", None)
    running = asyncio.get_running_loop()
    if loop is running:
        await creator.__aexit__(None, None, None)
    elif loop is not None and loop.is_running():
        asyncio.run_coroutine_threadsafe(creator.__aexit__(None, None, None), loop)
    else:
        type(fs).close_session(loop, creator)


def _wire_failure(error: BaseException) -> str | None:
    """What went wrong on the wire, for botocore's own failures; None for any other exception."""
    botocore_errors = sys.modules.get("botocore.exceptions")
    if botocore_errors is not None:
        if isinstance(error, botocore_errors.ReadTimeoutError):
            return "read timeout"
        if isinstance(error, botocore_errors.ConnectTimeoutError):
            return "connect timeout"
        if isinstance(error, botocore_errors.HTTPClientError):
            return "connection failed"
        streaming = tuple(
            getattr(botocore_errors, name)
            for name in ("ResponseStreamingError", "IncompleteReadError")
            if hasattr(botocore_errors, name)
        )
        if streaming and isinstance(error, streaming):
            return "answer cut short"
    botocore_parsers = sys.modules.get("botocore.parsers")
    if botocore_parsers is not None and isinstance(error, botocore_parsers.ResponseParserError):
        # Throttled S3 front ends sometimes answer with broken XML (s3fs retries these for the same reason).
        return "unreadable answer"
    return None
