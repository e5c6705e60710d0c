"""The engine for async fsspec filesystems (gcsfs, adlfs, ...), and the base of the s3fs engine."""

import asyncio
import os
import sys
import types
from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

from fsspec.asyn import AsyncFileSystem

from haystack_integrations.offload.stores.failures import (
    LASTING,
    StorageRequestError,
    causes_of,
    network_failure,
    status_failure,
)
from haystack_integrations.offload.stores.io import Chunk, Engine, Listed, info_time
from haystack_integrations.offload.stores.loop_local import LoopLocal
from haystack_integrations.offload.stores.options import redacted_url

T = TypeVar("T")
P = ParamSpec("P")


# The Azure SDK's own retry policy (ExponentialRetry: 3 retries, 15 s then 18 s then 24 s apart) inside ours made a
# stopped endpoint take 60.5 s to fail; with none, our retry loop (retry.py) alone decides how often and how long.
_AZURE_SDK_RETRY_SETTINGS = ("total_retries", "connect_retries", "read_retries", "status_retries")


AZURE_PROTOCOLS = frozenset({"az", "abfs", "abfss"})
GCS_PROTOCOLS = frozenset({"gs", "gcs"})
CLOUD_PROTOCOLS = AZURE_PROTOCOLS | GCS_PROTOCOLS


def cloud_location(protocol: str, root_path: str, options: Mapping[str, Any]) -> str:
    """
    An Azure or GCS store as an operator names it: its container or bucket, and the endpoint (``az://results at
    http://127.0.0.1:10000/devstoreaccount1``, ``gs://results at Google``); never credentials.

    :param protocol: ``az``, ``abfs``, ``abfss``, ``gs`` or ``gcs``.
    :param root_path: The store's root, its first segment the container or bucket.
    :param options: The store's storage options (secrets unresolved: only plain strings are read).
    :returns: The location.
    """
    place = f"{protocol}://{root_path.split('/', 1)[0]}"
    endpoint = ""
    if protocol in AZURE_PROTOCOLS:
        given = options.get("connection_string")
        connection = given if isinstance(given, str) else os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
        fields = dict(part.split("=", 1) for part in connection.split(";") if "=" in part)
        account = (
            options.get("account_name") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME") or fields.get("AccountName")
        )
        host = options.get("account_host")
        if fields.get("BlobEndpoint"):
            endpoint = fields["BlobEndpoint"]
        elif isinstance(host, str) and host:
            endpoint = f"https://{host}"
        elif isinstance(account, str) and account:
            endpoint = f"https://{account}.blob.core.windows.net"
    else:
        given = options.get("endpoint_url")
        endpoint = given if isinstance(given, str) else os.environ.get("STORAGE_EMULATOR_HOST", "")
    return (
        f"{place} at {redacted_url(endpoint) if endpoint else ('Azure' if protocol in AZURE_PROTOCOLS else 'Google')}"
    )


def without_client_retries(fs: T) -> T:
    """
    Turn off the retries an SDK makes under a filesystem the store built, so only the store's retry policy retries.

    adlfs takes no retry option: its Azure client's retry policy (one object, shared by every container and blob
    client made from the service client) is set to retry nothing. gcsfs's retrying decorator is bypassed for this
    instance's requests. Other filesystems are returned as they are. The store makes these instances outside fsspec's
    instance cache, so no other code of the process is handed one with its retries off.

    :param fs: A filesystem the store made from its URL and storage options (never one a caller passed in).
    :returns: `fs`.
    """
    gcsfs = sys.modules.get("gcsfs")
    if gcsfs is not None and isinstance(fs, gcsfs.GCSFileSystem):
        # gcsfs retries every request up to 6 times (1, 2, 4, 8, 16 s apart: a stopped endpoint took 34 s per
        # attempt of ours), fixed when its class was defined; this instance sends each request once instead.
        once = getattr(type(fs)._request, "__wrapped__", None)
        if once is not None:
            fs._request = types.MethodType(once, fs)
        return fs
    service_client = getattr(fs, "service_client", None) if "adlfs" in sys.modules else None
    config = getattr(service_client, "_config", None)
    policy = getattr(config, "retry_policy", None)
    if policy is not None:
        for setting in _AZURE_SDK_RETRY_SETTINGS:
            if hasattr(policy, setting):
                setattr(policy, setting, 0)
    return fs


def _cloud_sdk_failure(link: BaseException) -> OSError | None:
    # Azure's SDK (under adlfs) and gcsfs leave "refused", "missing" and "exists" in an HTTP status; classify them
    # here, where S3's engines read their client's answer (s3fs_io.py, obstore_io.py).
    azure = sys.modules.get("azure.core.exceptions")
    if azure is not None:
        if isinstance(link, azure.HttpResponseError):
            status = getattr(link, "status_code", None)
            return status_failure(status if isinstance(status, int) else None, str(link.error_code or ""))
        if isinstance(link, (azure.ServiceRequestTimeoutError, azure.ServiceResponseTimeoutError)):
            return StorageRequestError("timeout", transient=True)
        if isinstance(link, azure.ServiceRequestError):
            return StorageRequestError("connection failed", transient=True)
        if isinstance(link, azure.ServiceResponseError):
            return StorageRequestError("answer cut short", transient=True)
    gcsfs_retry = sys.modules.get("gcsfs.retry")
    if gcsfs_retry is not None:
        if isinstance(link, gcsfs_retry.HttpError):
            code = getattr(link, "code", None)
            return status_failure(code if isinstance(code, int) else None, "")
        # gcsfs's validate_response turns a 403 into a bare OSError("Forbidden: <url>\n<message>"), a 502 into
        # requests' ProxyError; 404 and 412 it raises as FileNotFoundError and FileExistsError itself.
        if type(link) is OSError and str(link).startswith("Forbidden: "):
            return status_failure(403, "")
        requests_errors = sys.modules.get("requests.exceptions")
        if requests_errors is not None and isinstance(link, requests_errors.ProxyError):
            return status_failure(502, "")
    return None


class AsyncFilesystemIO(Engine):
    """
    Async fsspec filesystems: each call runs on the caller's own loop with that loop's client (`loop_clients`), or on
    the filesystem's own loop, awaited from the caller's (``asyncio.wrap_future``), so no loop ever blocks on the
    network or awaits a coroutine bound to another loop.
    """

    remote = True
    # aiobotocore on aiohttp was seen waiting past botocore's read_timeout for an answer that never came.
    needs_attempt_limit = True

    def __init__(self, fs: AsyncFileSystem, *, loop_clients: LoopLocal[AsyncFileSystem] | None = None) -> None:
        """
        :param fs: The async fsspec filesystem to use.
        :param loop_clients: Where a call finds an ``asynchronous=True`` filesystem with the same settings, made for the
            caller's own loop, to use instead of hopping to `fs`'s loop; `None` to always run on `fs`'s loop.
        """
        super().__init__(fs)
        self.async_fs = fs
        self.loop_clients = loop_clients

    async def _run_async(
        self,
        operation: Callable[Concatenate[AsyncFileSystem, P], Coroutine[Any, Any, T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        try:
            clients = self._clients_for_running_loop()
            if clients is not None:
                return await operation(await clients.get(), *args, **kwargs)
            return await self._on_fs_loop(operation(self.async_fs, *args, **kwargs))
        except Exception as error:
            failure = self.failure_of(error)
            if failure is None:
                raise
            raise failure from error

    def failure_of(self, error: Exception) -> OSError | None:
        """
        Classify what a call raised, walking its chain of causes: a failure this engine recognises, or None to let
        `error` through as it is (a missing object, a refused permission, an error no link explains).

        :param error: The exception the filesystem raised.
        :returns: The error to raise instead (a `StorageRequestError`, or a `MissingCredentialsError`), or None.
        """
        for link in causes_of(error):
            if isinstance(link, (StorageRequestError, *LASTING)):
                return None
            failure = self._failure_of_link(link)
            if failure is not None:
                return failure
        return None

    def _failure_of_link(self, link: BaseException) -> OSError | None:
        failure = _cloud_sdk_failure(link)
        if failure is not None:
            return failure
        aiohttp = sys.modules.get("aiohttp")
        if aiohttp is not None:
            if isinstance(link, aiohttp.ClientPayloadError):
                return StorageRequestError("answer cut short", transient=True)
            if isinstance(link, aiohttp.ServerTimeoutError):  # a connection error too: say which (gcsfs's timeouts)
                return StorageRequestError("timeout", transient=True)
            if isinstance(link, aiohttp.ClientConnectionError):
                return StorageRequestError("connection failed", transient=True)
        return network_failure(link)

    def _clients_for_running_loop(self) -> LoopLocal[AsyncFileSystem] | None:
        # fsspec's own loop (a sync call's coroutine, or a caller running there) keeps the filesystem's client.
        if self.loop_clients is not None and self.async_fs.loop is not asyncio.get_running_loop():
            return self.loop_clients
        return None

    async def _on_fs_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self.async_fs.asynchronous:
            # An `asynchronous=True` filesystem belongs to the loop its caller awaits it from (fsspec's contract).
            return await coroutine
        loop = self.async_fs.loop
        if loop is asyncio.get_running_loop():
            return await coroutine
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))

    @staticmethod
    async def _warm_up(fs: AsyncFileSystem) -> None:
        set_session = getattr(fs, "set_session", None)
        if set_session is not None:
            await set_session()

    async def warm_up_async(self) -> None:
        """Create the client async calls from this loop use (s3fs makes it on first request otherwise)."""
        await self._run_async(self._warm_up)

    async def ready_async(self) -> None:
        """
        Create the client calls from the running loop use. On fsspec's loop (every sync call runs there) that is the
        filesystem's own: made here too, or the first sync call's time limit pays for it.
        """
        await self._run_async(self._warm_up)

    async def _put(self, fs: AsyncFileSystem, path: str, data: bytes) -> None:
        await fs._pipe_file(path, data)

    async def _put_chunks(self, fs: AsyncFileSystem, path: str, chunks: Iterable[Chunk]) -> None:
        # Backends other than S3: fsspec has no async streaming write to build on; one whole write.
        await self._put(fs, path, b"".join(chunks))

    async def _put_exclusive(self, fs: AsyncFileSystem, path: str, data: bytes) -> None:
        await fs._pipe_file(path, data, mode="create")

    async def _get(self, fs: AsyncFileSystem, path: str) -> bytes:
        return bytes(await fs._cat_file(path))

    async def _get_range(self, fs: AsyncFileSystem, path: str, start: int, end: int) -> bytes:
        if end <= start:
            return b""
        return bytes(await fs._cat_file(path, start=start, end=end))

    async def _size(self, fs: AsyncFileSystem, path: str) -> int:
        return int((await fs._info(path))["size"])

    async def _modified(self, fs: AsyncFileSystem, path: str) -> datetime | None:
        # Async filesystems name the time differently (s3fs LastModified, gcsfs updated, adlfs last_modified).
        return info_time(await fs._info(path))

    async def _get_range_and_size(self, fs: AsyncFileSystem, path: str, start: int, end: int) -> tuple[bytes, int]:
        size = await self._size(fs, path)
        return (await self._get_range(fs, path, start, end) if start < size else b""), size

    async def _find(self, fs: AsyncFileSystem, path: str) -> dict[str, int]:
        found = await fs._find(path, detail=True)
        return {name: int(info.get("size") or 0) for name, info in found.items() if info.get("type") != "directory"}

    async def _find_detailed(self, fs: AsyncFileSystem, path: str) -> dict[str, Listed]:
        # The listing's own times (s3fs: each LIST page's LastModified), so no object needs a HEAD to be dated.
        found = await fs._find(path, detail=True)
        return {
            name: Listed(int(info.get("size") or 0), info_time(info))
            for name, info in found.items()
            if info.get("type") != "directory"
        }

    async def _delete(self, fs: AsyncFileSystem, paths: list[str]) -> None:
        for path in paths:
            try:
                await fs._rm_file(path)
            except FileNotFoundError:
                continue

    async def put_async(self, path: str, data: bytes) -> None:
        """Async `put`."""
        await self._run_async(self._put, path, data)

    async def put_chunks_async(self, path: str, chunks: Iterable[Chunk]) -> None:
        """Async `put_chunks` (the chunks are iterated on the loop the call runs on)."""
        await self._run_async(self._put_chunks, path, chunks)

    async def put_exclusive_async(self, path: str, data: bytes) -> None:
        """Async `put_exclusive`."""
        await self._run_async(self._put_exclusive, path, data)

    async def get_async(self, path: str) -> bytes:
        """Async `get`."""
        return await self._run_async(self._get, path)

    async def get_range_async(self, path: str, start: int, end: int) -> bytes:
        """Async `get_range`: empty at or past the end, which S3, Azure and GCS refuse with 416."""
        try:
            return await self._run_async(self._get_range, path, start, end)
        except StorageRequestError as error:
            if error.status == 416:
                return b""
            raise

    async def get_range_and_size_async(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        """Async `get_range_and_size`."""
        return await self._run_async(self._get_range_and_size, path, start, end)

    async def size_async(self, path: str) -> int:
        """Async `size`."""
        return await self._run_async(self._size, path)

    async def modified_async(self, path: str) -> datetime | None:
        """Async `modified`."""
        return await self._run_async(self._modified, path)

    async def find_async(self, path: str) -> dict[str, int]:
        """Async `find`."""
        return await self._run_async(self._find, path)

    async def find_detailed_async(self, path: str) -> dict[str, Listed]:
        """Async `find_detailed` (one LIST per 1000 keys on S3, times included)."""
        return await self._run_async(self._find_detailed, path)

    async def delete_async(self, paths: Iterable[str]) -> None:
        """Async `delete`."""
        await self._run_async(self._delete, list(paths))
