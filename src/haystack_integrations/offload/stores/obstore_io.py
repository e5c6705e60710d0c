"""
The obstore engine: S3 through obstore (Rust's ``object_store``), one request per write, whole read or page.

It serves the storage options s3fs takes where it can (`obstore_settings`) and classifies obstore's failures itself
(`_mapped_errors`); the design is in docs/design.md.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, cast

try:
    import obstore
    from obstore.exceptions import (
        AlreadyExistsError,
        GenericError,
        InvalidPathError,
        PermissionDeniedError,
        UnauthenticatedError,
    )
    from obstore.fsspec import FsspecStore
    from obstore.store import S3Store
except ImportError as error:  # pragma: no cover - tests/stores/test_obstore_engine.py hides obstore to see this
    raise ImportError(
        'The obstore engine (engine="obstore") needs obstore. Install it with: pip install "offload-haystack[s3]"'
    ) from error

from haystack_integrations.offload.stores.aws import BotocoreCredentials, botocore_available, bucket_region
from haystack_integrations.offload.stores.exit_wait import wait_at_exit
from haystack_integrations.offload.stores.failures import MissingCredentialsError, StorageRequestError, answer_failure
from haystack_integrations.offload.stores.io import (
    MULTIPART_PART_BYTES,
    MULTIPART_PARTS_IN_FLIGHT,
    MULTIPART_THRESHOLD,
    Children,
    Chunk,
    Engine,
    Listed,
    drained,
)

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config, S3CredentialProvider

__all__ = [
    "ObstoreIO",
    "ObstoreSettings",
    "describe_failure",
    "obstore_settings",
    "strip_s3_url",
    "unsupported_options",
]

# s3fs options that tune s3fs's own caching and file objects: nothing here reads through them, so they are accepted
# (the same storage_options serve both engines) and have no effect.
_S3FS_ONLY = frozenset(
    {
        "cache_regions",
        "default_block_size",
        "default_cache_type",
        "default_fill_cache",
        "fixed_upload_size",
        "listings_expiry_time",
        "max_concurrency",
        "max_paths",
        "skip_instance_cache",
        "use_listings_cache",
    }
)
# storage option -> S3Config key.
_CONFIG_NAMES = {
    "key": "access_key_id",
    "username": "access_key_id",
    "secret": "secret_access_key",
    "password": "secret_access_key",
    "token": "session_token",
    "endpoint_url": "endpoint",
    "requester_pays": "request_payer",
}
# client_kwargs entry -> S3Config key.
_CLIENT_KWARGS_NAMES = {
    "region_name": "region",
    "endpoint_url": "endpoint",
    "aws_access_key_id": "access_key_id",
    "aws_secret_access_key": "secret_access_key",
    "aws_session_token": "session_token",
}
# s3_additional_kwargs entry -> S3Config key.
_ADDITIONAL_NAMES = {"ServerSideEncryption": "server_side_encryption", "SSEKMSKeyId": "sse_kms_key_id"}
# SSE-C, as botocore takes it (the algorithm, the raw key): object_store wants "sse-c" and the key in base64.
_SSE_C_NAMES = frozenset({"SSECustomerAlgorithm", "SSECustomerKey"})
# config_kwargs (botocore Config) entries understood: timeouts, retries, region, addressing style, pool size (reqwest's
# pool is not capped: the size bounds the idle connections kept per host, never the requests in flight).
# Where object_store asks for credentials when none are configured: the EC2 metadata service (its token, then the
# role's) and the ECS/EKS container endpoints. A failure naming one of them means no credentials were found.
_CREDENTIAL_SOURCES = re.compile(r"/latest/api/token|/latest/meta-data/iam/|169\.254\.170\.2|AWS_CONTAINER_CREDENTIALS")
_CONFIG_KWARGS = frozenset({"connect_timeout", "read_timeout", "retries", "region_name", "s3", "max_pool_connections"})
_TOP_LEVEL = frozenset({*_CONFIG_NAMES, "anon", "use_ssl", "client_kwargs", "config_kwargs", "s3_additional_kwargs"})
_EXPLICIT_CREDENTIALS = ("access_key_id", "secret_access_key", "session_token", "skip_signature")
_UNSUPPORTED_HINT = 'the obstore engine cannot honour it; leave it out, or use engine="fsspec" (s3fs)'

# Out of fsspec's instance cache (which keys a filesystem by its arguments and keeps it for the life of the process):
# a tenant's client goes with its handle, else each tenant ever served kept ~21 KiB. The handle keeps the one it uses.
# (A keyword the metaclass takes, absent from obstore's typed signature.)
_NOT_CACHED: dict[str, Any] = {"skip_instance_cache": True}


@dataclass(frozen=True)
class ObstoreSettings:
    """What every `S3Store` of one `ObstoreIO` is built with."""

    config: dict[str, Any] = field(default_factory=dict)
    client_options: dict[str, Any] = field(default_factory=dict)
    retry_config: dict[str, Any] = field(default_factory=dict)
    credential_provider: BotocoreCredentials | None = None
    # No region anywhere and AWS's own endpoint: ask S3 for each bucket's region before its first request.
    region_from_bucket: bool = False


def unsupported_options(storage_options: Mapping[str, Any]) -> list[str]:
    """
    Name the storage options the obstore engine cannot honour (looking at names only, so `Secret`s stay unresolved).

    :param storage_options: Options written for s3fs.
    :returns: Their paths, e.g. ``["profile", "config_kwargs['proxies']"]``; empty when all are understood.
    """
    understood = _TOP_LEVEL | _S3FS_ONLY | ({"profile"} if botocore_available() else set())
    unknown = [name for name in storage_options if name not in understood]
    for section, known in (
        ("client_kwargs", set(_CLIENT_KWARGS_NAMES) | {"verify"}),
        ("config_kwargs", set(_CONFIG_KWARGS)),
        ("s3_additional_kwargs", set(_ADDITIONAL_NAMES) | _SSE_C_NAMES),
    ):
        unknown += [f"{section}[{name!r}]" for name in storage_options.get(section) or {} if name not in known]
    return unknown


def _sse_c_config(additional: Mapping[str, Any]) -> dict[str, str]:
    key = additional.get("SSECustomerKey")
    if key is None:
        return {}
    if additional.get("SSECustomerAlgorithm", "AES256") != "AES256":
        raise ValueError("s3_additional_kwargs['SSECustomerAlgorithm'] must be 'AES256' (the only SSE-C algorithm).")
    raw = key.encode() if isinstance(key, str) else bytes(key)
    return {"server_side_encryption": "sse-c", "sse_customer_key_base64": base64.b64encode(raw).decode()}


def obstore_settings(
    storage_options: Mapping[str, Any], *, retrying: bool, attempt_timeout: float | None
) -> ObstoreSettings:
    """
    Translate s3fs storage options (with secrets resolved) into obstore's settings.

    Understood: ``key``/``secret``/``token`` (and s3fs's ``username``/``password`` aliases), ``anon``,
    ``endpoint_url``, ``use_ssl``, ``requester_pays``; ``client_kwargs``: ``region_name``, ``endpoint_url``, the
    ``aws_*`` credentials, ``verify=False``; ``config_kwargs``: ``connect_timeout``, ``read_timeout``, ``retries``,
    ``region_name``, ``s3={"addressing_style": ...}``, ``max_pool_connections`` (idle connections kept per host);
    ``s3_additional_kwargs``: ``ServerSideEncryption``, ``SSEKMSKeyId``, ``SSECustomerAlgorithm`` and
    ``SSECustomerKey`` (SSE-C, the raw key as botocore takes it); ``profile`` (through botocore, as is
    ``AWS_PROFILE`` when no keys are given). s3fs's caching options are accepted and have no effect. What is left out
    comes from the environment, as obstore reads it.

    :param storage_options: Options written for s3fs, secrets resolved.
    :param retrying: Whether a `RetryPolicy` retries the store's calls: obstore's own retries are then off (unless
        ``config_kwargs["retries"]`` says otherwise), as botocore's are for s3fs.
    :param attempt_timeout: The policy's time limit per attempt, in seconds: it becomes the client's request timeout,
        which bounds sync and async calls alike. None keeps obstore's (30 seconds).
    :returns: The settings.
    :raises ValueError: If an option cannot be honoured (see `unsupported_options`).
    """
    unknown = unsupported_options(storage_options)
    if unknown:
        raise ValueError(f"Storage option(s) {', '.join(unknown)} not supported: {_UNSUPPORTED_HINT}.")
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    retry: dict[str, Any] = {}
    for name, target in _CONFIG_NAMES.items():
        if storage_options.get(name) is not None:
            config[target] = storage_options[name]
    client_kwargs = dict(storage_options.get("client_kwargs") or {})
    for name, target in _CLIENT_KWARGS_NAMES.items():
        if client_kwargs.get(name) is not None:
            config[target] = client_kwargs[name]
    verify = client_kwargs.get("verify")
    if verify is not None and verify is not False:
        # A CA bundle path (or True) would need reading the file here; obstore takes PEM text (root_certificate).
        if verify is not True:
            raise ValueError(f"Storage option client_kwargs['verify'] as a CA bundle path: {_UNSUPPORTED_HINT}.")
    elif verify is False:
        client["allow_invalid_certificates"] = True
    additional = storage_options.get("s3_additional_kwargs") or {}
    for name, target in _ADDITIONAL_NAMES.items():
        if additional.get(name) is not None:
            config[target] = additional[name]
    config.update(_sse_c_config(additional))
    if storage_options.get("anon"):
        config["skip_signature"] = True
    if isinstance(storage_options.get("requester_pays"), bool):
        config["request_payer"] = storage_options["requester_pays"]
    endpoint = config.get("endpoint") or _environment_endpoint()
    if storage_options.get("use_ssl") is False or (isinstance(endpoint, str) and endpoint.startswith("http://")):
        client["allow_http"] = True

    botocore = dict(storage_options.get("config_kwargs") or {})
    for name in ("connect_timeout", "read_timeout"):
        if botocore.get(name) is not None:
            client[name] = timedelta(seconds=float(botocore[name]))
    if botocore.get("region_name") is not None:
        config.setdefault("region", botocore["region_name"])
    addressing = (botocore.get("s3") or {}).get("addressing_style")
    if addressing in {"virtual", "path"}:
        config["virtual_hosted_style_request"] = addressing == "virtual"
    retries = botocore.get("retries")
    if isinstance(retries, Mapping) and ("total_max_attempts" in retries or "max_attempts" in retries):
        # botocore: total_max_attempts counts the first attempt, max_attempts only the retries.
        total = retries.get("total_max_attempts")
        retry["max_retries"] = max(0, int(total) - 1) if total is not None else max(0, int(retries["max_attempts"]))
    elif retrying:
        retry["max_retries"] = 0  # the store retries (`retry.retried`); stacked retries would multiply
    if botocore.get("max_pool_connections") is not None:
        client["pool_max_idle_per_host"] = str(int(botocore["max_pool_connections"]))
    if attempt_timeout is not None:
        client["timeout"] = timedelta(seconds=attempt_timeout)
    credentials = _profile_credentials(storage_options, config)
    if credentials is not None and credentials.region is not None:
        config.setdefault("region", credentials.region)
    from_bucket = "region" not in config and endpoint is None and not _environment_region()
    return ObstoreSettings(config, client, retry, credentials, from_bucket)


def _profile_credentials(storage_options: Mapping[str, Any], config: Mapping[str, Any]) -> BotocoreCredentials | None:
    """botocore's session for a named profile, or for ``AWS_PROFILE`` when neither options nor environment give keys."""
    if any(name in config for name in _EXPLICIT_CREDENTIALS):
        return None
    profile = storage_options.get("profile")
    if profile is not None:
        return BotocoreCredentials(str(profile))
    if os.environ.get("AWS_PROFILE") and not os.environ.get("AWS_ACCESS_KEY_ID") and botocore_available():
        return BotocoreCredentials(None)
    return None


def _environment_region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")


def _environment_endpoint() -> str | None:
    # What obstore itself reads when no endpoint is given (AWS_ENDPOINT_URL_S3 first, as the AWS SDKs do).
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"):
        if os.environ.get(name):
            return os.environ[name]
    return None


def strip_s3_url(url: str) -> str:
    """
    The ``bucket/prefix`` of an ``s3://`` or ``s3a://`` URL, as s3fs's ``_strip_protocol`` gives it (s3fs not needed).

    :param url: The store's URL.
    :returns: The path, without the protocol and trailing slashes.
    """
    for protocol in ("s3://", "s3a://"):
        if url.startswith(protocol):
            return url[len(protocol) :].rstrip("/")
    return url.rstrip("/")


# obstore's exceptions carry no fields, only a message ending in object_store's Debug output; these read it.
_STATUS = re.compile(r"status code: (\d{3})")
_S3_CODE = re.compile(r"<Code>(\w+)</Code>|\(code: (\w+)\)")
_HTTP_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")
# object_store's HttpErrorKind: what went wrong on the wire (Unknown is not retried).
_NETWORK_CAUSES = {
    "Connect": "connection failed",
    "Request": "connection failed",
    "Interrupted": "connection reset",
    "Timeout": "timeout",
    "Decode": "answer cut short",
}


def describe_failure(error: BaseException) -> tuple[int | None, str, str | None] | None:
    """
    Read what an obstore exception says happened: the HTTP status, S3's error code, the network failure.

    :param error: Any exception.
    :returns: ``(status, code, network cause)``, or None if `error` is not obstore's. The network cause is a short
        description ("connection reset", "timeout", ...) when the request failed on the wire, else None.
    """
    if not isinstance(error, obstore.exceptions.BaseError):
        return None
    message = str(error)
    status = _STATUS.search(message)
    code = _S3_CODE.search(message)
    kind = _HTTP_KIND.search(message)
    return (
        int(status.group(1)) if status else None,
        (code.group(1) or code.group(2)) if code else "",
        _NETWORK_CAUSES.get(kind.group(1)) if kind else None,
    )


class _mapped_errors:
    """
    Raise obstore's failures as this engine's kinds, chained: "exists", "missing" and "refused" as built-in exceptions,
    an HTTP answer or a wire failure as `StorageRequestError`; anything else (a bad key) as it is.
    """

    # A class, not a generator: it wraps every request, and a generator's context manager costs microseconds more.
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: object
    ) -> Literal[False]:
        if error is not None:
            _raise_mapped(error)
        return False


def _raise_mapped(error: BaseException) -> None:
    """Raise `error` as `_mapped_errors` maps it, chained; return if it stays as it is."""
    if isinstance(error, AlreadyExistsError):
        # object_store folds AWS's 409 ConditionalRequestConflict (a competing write in flight) into "exists"; only a
        # 412 means the key is taken.
        status, code, _ = describe_failure(error) or (None, "", None)
        if status == 409:
            raise answer_failure(status, code) from error
        raise FileExistsError(errno.EEXIST, "The object already exists.") from error
    if isinstance(error, PermissionDeniedError | UnauthenticatedError):
        raise PermissionError(errno.EACCES, "Access denied.") from error
    if isinstance(error, obstore.exceptions.BaseError):
        if _CREDENTIAL_SOURCES.search(str(error)):
            # object_store found no credentials and asked the instance's or container's role last; that answer (a
            # 403 or 404 from the metadata service) is not S3's.
            raise MissingCredentialsError(errno.EACCES, "No credentials found.") from error
        # Listings and bulk deletes report their failures as generic errors.
        status, code, network = describe_failure(error) or (None, "", None)
        if status == 404 or code in {"NoSuchBucket", "NoSuchKey"}:
            raise FileNotFoundError(errno.ENOENT, "No such bucket or object.") from error
        if status in {401, 403} or code in {"AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId"}:
            raise PermissionError(errno.EACCES, "Access denied.") from error
        if status is not None:
            raise answer_failure(status, code) from error
        if network is not None:
            raise StorageRequestError(network, transient=True) from error
        return
    if type(error).__name__ in {"PanicException", "RustPanic"}:
        # A panic in the Rust code arrives as pyo3's PanicException (a BaseException that every `except Exception` on
        # the way would let through like a KeyboardInterrupt) or, from an async call, as RustPanic. Seen: a
        # DeleteObjects answer naming a key that was not asked for. It is a failed storage call.
        raise OSError(errno.EIO, "The S3 client failed on an answer it could not handle.") from error


class _PastTheEnd:
    """
    Swallows a range starting at or past the end (or any range of an empty object): S3's 416, and on Azure
    object_store's own ``StartTooLarge``, raised when the answer is shorter than the range's start; see `ObstoreIO`.
    """

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> bool:
        if not isinstance(error, GenericError):
            return False
        return (describe_failure(error) or (None,))[0] == 416 or "StartTooLarge" in str(error)


class ObstoreIO(Engine):
    """
    S3 through obstore, held to one request per write, whole read or page (see the module documentation).

    Paths are ``bucket/key``, as with s3fs; each bucket gets one `S3Store` (one connection pool), made on first use.
    ``fs`` is obstore's fsspec filesystem over the same settings, for callers that want one (operators' scripts, test
    helpers); the engine never goes through it (its ``pipe_file`` ignores ``mode="create"``).
    """

    remote = True

    def __init__(self, settings: ObstoreSettings, *, fallback: Callable[[], Engine] | None = None) -> None:
        """
        :param settings: What every bucket's `S3Store` is built with (see `obstore_settings`).
        :param fallback: The engine (s3fs) that lists and deletes keys object_store cannot parse (a ``.`` or empty
            segment, never written by this library, but possibly planted by someone else); None: they fail loudly.
        """
        super().__init__(
            FsspecStore(
                "s3",
                config=cast("S3Config", settings.config),
                client_options=cast("ClientConfig", settings.client_options),
                retry_config=cast("RetryConfig", settings.retry_config),
                credential_provider=cast("S3CredentialProvider | None", settings.credential_provider),
                **_NOT_CACHED,
            )
        )
        self.settings = settings
        self.fallback = fallback
        self._stores: dict[str, S3Store] = {}
        self._lock = threading.Lock()
        # obstore's threads hand results to event loops; exit must not finalize while one is doing so.
        wait_at_exit()

    def drop_stores(self) -> None:
        """Forget every bucket's `S3Store` (object_store has no close: its connection pool goes with the store)."""
        with self._lock:
            self._stores.clear()

    async def _located_async(self, path: str) -> tuple[S3Store, str]:
        bucket, _, key = path.partition("/")
        store = self._stores.get(bucket)
        if store is None:
            # The one request a first call may add: the bucket's region, asked in a thread, off the event loop.
            region = await asyncio.to_thread(bucket_region, bucket) if self.settings.region_from_bucket else None
            store = self._store_for(bucket, region)
        return store, key

    def _store_for(self, bucket: str, region: str | None) -> S3Store:
        with self._lock:
            store = self._stores.get(bucket)
            if store is None:
                config = {**self.settings.config, **({"region": region} if region else {})}
                # No request here: object_store connects (and fetches credentials) on the first call.
                store = S3Store(
                    bucket,
                    config=cast("S3Config", config),
                    client_options=cast("ClientConfig", self.settings.client_options),
                    retry_config=cast("RetryConfig", self.settings.retry_config),
                    credential_provider=cast("S3CredentialProvider | None", self.settings.credential_provider),
                )
                self._stores[bucket] = store
        return store

    def _errors(self) -> contextlib.AbstractContextManager[None]:
        """How a write's failures are classified (`_mapped_errors`; Azure's engine reads its 409 otherwise)."""
        return _mapped_errors()

    async def put_async(self, path: str, data: bytes) -> None:
        """One PUT (never multipart, whatever the size)."""
        store, key = await self._located_async(path)
        with self._errors():
            await obstore.put_async(store, key, data, use_multipart=False)

    async def put_chunks_async(self, path: str, chunks: Iterable[Chunk]) -> None:
        """One PUT up to `MULTIPART_THRESHOLD` bytes; above, obstore's multipart upload, fed the chunks as they come."""
        store, key = await self._located_async(path)
        head, rest = _leading_chunks(chunks, MULTIPART_THRESHOLD)
        with self._errors():
            if rest is None:
                await obstore.put_async(store, key, b"".join(head), use_multipart=False)
            else:
                remaining: Iterator[Chunk] = drained(head, rest)
                await obstore.put_async(store, key, remaining, use_multipart=True, **_MULTIPART)

    async def put_exclusive_async(self, path: str, data: bytes) -> None:
        """One PUT with ``If-None-Match: *``; `FileExistsError` if the key exists (S3's 412)."""
        store, key = await self._located_async(path)
        with self._errors():
            await obstore.put_async(store, key, data, mode="create", use_multipart=False)

    async def get_async(self, path: str) -> bytes:
        """One GET."""
        store, key = await self._located_async(path)
        with _mapped_errors():
            return bytes(await (await obstore.get_async(store, key)).bytes_async())

    async def get_range_async(self, path: str, start: int, end: int) -> bytes:
        """One ranged GET; empty past the end."""
        return (await self.get_range_and_size_async(path, start, end))[0] if end > start else b""

    async def get_range_and_size_async(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        """One ranged GET: the bytes, and the total size from its Content-Range (a HEAD if the range is empty or
        past the end, which S3 refuses with 416)."""
        store, key = await self._located_async(path)
        if end > start:
            with _mapped_errors(), _PastTheEnd():
                result = await obstore.get_async(store, key, options={"range": (start, end)})
                return bytes(await result.bytes_async()), result.meta["size"]
        return b"", await self.size_async(path)

    async def size_async(self, path: str) -> int:
        """One HEAD."""
        store, key = await self._located_async(path)
        with _mapped_errors():
            return (await obstore.head_async(store, key))["size"]

    async def modified_async(self, path: str) -> datetime:
        """One HEAD; S3 stamps the time with its own clock."""
        store, key = await self._located_async(path)
        with _mapped_errors():
            return (await obstore.head_async(store, key))["last_modified"]

    async def find_async(self, path: str) -> dict[str, int]:
        """One LIST per 1000 keys below the directory `path`; the fallback engine's if a key there cannot be parsed."""
        store, key = await self._located_async(path)
        try:
            with _mapped_errors():
                found = await obstore.list(store, key or None, chunk_size=1000).collect_async()
        except InvalidPathError:
            if self.fallback is None:
                raise
            return await self.fallback().find_async(path)
        return _listing(path, found)

    async def find_detailed_async(self, path: str) -> dict[str, Listed]:
        """As `find_async`, with each key's LastModified from the same LIST pages (no HEAD)."""
        store, key = await self._located_async(path)
        try:
            with _mapped_errors():
                found = await obstore.list(store, key or None, chunk_size=1000).collect_async()
        except InvalidPathError:
            if self.fallback is None:
                raise
            return await self.fallback().find_detailed_async(path)
        bucket = path.partition("/")[0]
        return {f"{bucket}/{meta['path']}": Listed(int(meta["size"]), meta["last_modified"]) for meta in found}

    async def children_async(self, path: str) -> Children:
        """A LIST with a delimiter, one per 1000 subdirectories and objects; the fallback engine's as `find_async`."""
        store, key = await self._located_async(path)
        try:
            with _mapped_errors():
                found = await obstore.list_with_delimiter_async(store, key or None)
        except InvalidPathError:
            if self.fallback is None:
                raise
            return await self.fallback().children_async(path)
        bucket = path.partition("/")[0]
        return Children(
            sorted(f"{bucket}/{prefix}" for prefix in found["common_prefixes"]),
            {f"{bucket}/{meta['path']}": int(meta["size"]) for meta in found["objects"]},
        )

    async def delete_async(self, paths: Iterable[str]) -> None:
        """One DeleteObjects per bucket and 1000 keys (a missing key is no error); unparsable keys via the fallback."""
        paths = list(paths)
        unparsable = [path for path in paths if not _parsable(path)] if self.fallback is not None else []
        if unparsable and self.fallback is not None:
            await self.fallback().delete_async(unparsable)
            paths = [path for path in paths if _parsable(path)]
        for bucket, (store, keys) in (await self._by_bucket(paths)).items():
            try:
                with _mapped_errors():
                    await obstore.delete_async(store, keys)
            except PermissionError:
                # Refused as a whole (see Engine.delete_async). object_store deletes even one key with
                # DeleteObjects, so the per-key deletes go through s3fs, where it is installed.
                if self.fallback is None:
                    raise
                await self.fallback().delete_async([f"{bucket}/{key}" for key in keys])

    async def _by_bucket(self, paths: Iterable[str]) -> dict[str, tuple[S3Store, list[str]]]:
        batches: dict[str, tuple[S3Store, list[str]]] = {}
        for path in paths:
            store, key = await self._located_async(path)
            batches.setdefault(path.partition("/")[0], (store, []))[1].append(key)
        return batches


# Part size and parts in flight: what a multipart upload holds in memory besides the content (obstore's default, 12
# parts of 5 MiB, buffers 60 MiB).
_MULTIPART: dict[str, Any] = {"chunk_size": MULTIPART_PART_BYTES, "max_concurrency": MULTIPART_PARTS_IN_FLIGHT}


def _parsable(path: str) -> bool:
    """Whether object_store can take the key of `path` (``bucket/key``): no empty, ``.`` or ``..`` segment."""
    return not any(segment in {"", ".", ".."} for segment in path.partition("/")[2].split("/"))


def _leading_chunks(chunks: Iterable[Chunk], limit: int) -> tuple[list[Chunk], Iterator[Chunk] | None]:
    """The first chunks while they total at most `limit` bytes, and an iterator over the rest (None if none left)."""
    iterator = iter(chunks)
    head: list[Chunk] = []
    size = 0
    for chunk in iterator:
        head.append(chunk)
        size += memoryview(chunk).nbytes
        if size > limit:
            return head, iterator
    return head, None


def _listing(path: str, found: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    bucket = path.partition("/")[0]
    return {f"{bucket}/{meta['path']}": int(meta["size"]) for meta in found}
