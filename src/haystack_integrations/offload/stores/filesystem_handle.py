"""
The filesystem and I/O engine a root store and every store derived from it share, and each tenant's own client.
"""

from __future__ import annotations

import errno
import importlib.util
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import fsspec
from fsspec import AbstractFileSystem

from haystack_integrations.offload import metrics
from haystack_integrations.offload.stores.async_fsspec_io import (
    AZURE_PROTOCOLS,
    CLOUD_PROTOCOLS,
    GCS_PROTOCOLS,
    cloud_location,
    without_client_retries,
)
from haystack_integrations.offload.stores.azure_keys import tenant_cpk_key
from haystack_integrations.offload.stores.azure_keys import with_customer_key as with_azure_key
from haystack_integrations.offload.stores.engines import (
    close_engine_async,
    engine_for,
)
from haystack_integrations.offload.stores.failures import (
    EncryptionKeyMissingError,
    EncryptionKeyRefusedError,
    StorageRequestError,
    mark_location,
)
from haystack_integrations.offload.stores.gcs_keys import tenant_csek_headers, with_customer_key
from haystack_integrations.offload.stores.io import Engine
from haystack_integrations.offload.stores.options import (
    redacted_url,
    resolve_secrets,
    with_default_timeouts,
)
from haystack_integrations.offload.stores.pending import InFlightWrites
from haystack_integrations.offload.stores.quotas import (
    QuotaTracker,
)
from haystack_integrations.offload.stores.retry import RetryPolicy, RetryStats, retried, s3_client_options
from haystack_integrations.offload.stores.s3fs_io import SharedSessions, s3_io_with_loop_clients
from haystack_integrations.offload.stores.tenant_access import (
    TenantIsolation,
    TenantSigner,
    tenant_of_path,
    tenant_options,
)

if TYPE_CHECKING:
    from haystack_integrations.offload.stores.tenant_access import TenantSigning

# botocore's default pool of 10 connections would cap a busy server at 10 S3 requests in flight.
DEFAULT_S3_MAX_POOL_CONNECTIONS = 128

# The engine calls that read one object: a 400 to them from S3 is an SSE-C refusal (see `FilesystemHandle.request`).
_OBJECT_READS = frozenset({"get", "get_range", "size", "modified"})

T = TypeVar("T")


# How many tenants' clients a root store keeps, with credentials or keys per tenant (the least recently used go).
DEFAULT_TENANT_CLIENTS = 64

_logger = logging.getLogger(__name__)


class FilesystemHandle:
    """
    The filesystem and I/O strategy shared by a root store and every store derived from it.

    Created on first use, once, so constructors do no I/O and every request reuses one client and connection pool.
    Creating it does no network I/O either (s3fs connects on its first request), so it is safe on an event loop.

    With credentials or keys per tenant, each tenant has a handle of its own, with its own client. The root keeps the
    `tenant_clients` most recently used; the one it lets go (evicted) has its client closed once the requests using
    it are done, and forwards any later request of a store still holding it to the tenant's current handle. A client
    replaced by renewed credentials is closed the same way. Requests count their client's users (`_lease_async`) so
    no client is closed under a request; what is due to close is closed by the next request's task, on its loop.
    """

    def __init__(
        self,
        protocol: str,
        root_path: str,
        storage_options: dict[str, Any],
        filesystem: AbstractFileSystem | None,
        retry: RetryPolicy | None,
        engine: str,
        *,
        isolation: TenantIsolation | None = None,
        tenant: str | None = None,
        signs_as_tenant: bool = False,
        root: FilesystemHandle | None = None,
    ) -> None:
        self._protocol = protocol
        self._engine = engine
        self._root_path = root_path
        self._storage_options = storage_options
        self._filesystem = filesystem
        self._io: Engine | None = None
        self._resolved_root: str | None = None
        self._location: str | None = None
        self._lock = threading.Lock()
        self._retry = retry
        # A tenant's handle counts retries, quotas and writes in flight with its root's.
        self._root = root
        self.retry_stats: RetryStats = root.retry_stats if root is not None else RetryStats()
        self._quota_tracker: QuotaTracker | None = None
        self.in_flight: InFlightWrites = root.in_flight if root is not None else InFlightWrites()
        # With tenant isolation: the tenant whose key this handle's client sends (None: the root's), whether it signs
        # as that tenant too (a store's tenant scope) or with the worker's credentials (the root's operator requests),
        # and the root's handles per tenant, made on first use.
        self._isolation = isolation or TenantIsolation()
        self._tenant = tenant
        self._signer = (
            TenantSigner(self._isolation.credentials, tenant, root_path, lambda: resolve_secrets(storage_options))
            if signs_as_tenant and self._isolation.credentials is not None and tenant is not None
            else None
        )
        self._signs_as_tenant = signs_as_tenant
        # The root's tenant handles, least recently used first, and how many it keeps.
        self._tenant_handles: OrderedDict[tuple[str, bool], FilesystemHandle] = OrderedDict()
        self.tenant_clients = DEFAULT_TENANT_CLIENTS
        self._evicted = False
        # Requests using each of this handle's clients (by id), and the replaced ones some request still uses.
        self._users: dict[int, int] = {}
        self._retiring: dict[int, Engine] = {}
        # Clients no request uses any more, closed by the next request of the root or any of its tenants.
        self._to_close: list[Engine] = root._to_close if root is not None else []
        self._closing_lock: threading.Lock = root._closing_lock if root is not None else threading.Lock()
        # On s3fs, the root's tenant clients share one botocore session (and loader: the S3 model, loaded once), one
        # for clients signing as their tenant, one for those signing as the worker (whose session may hold a profile).
        self._s3_sessions: dict[bool, SharedSessions] = {}

    def _create_locked(self) -> None:
        # Called with the lock held.
        if self._io is None:
            fs = self._filesystem
            io: Engine | None = None
            if fs is None:
                options = resolve_secrets(self._storage_options)
                keys = self._isolation.keys
                if self._tenant is not None:
                    options = tenant_options(
                        options,
                        signing=self._signing_credentials(),
                        # GCS's key goes in its requests' headers (below), not in S3's options.
                        key=keys.storage_options(self._tenant) if keys and self._protocol in {"s3", "s3a"} else None,
                    )
                if self._protocol in {"s3", "s3a"}:
                    options = with_default_timeouts(options)
                # Azure's key goes in its requests' headers too: each of its engines adds them (azure_keys.py).
                azure_key: bytes | None = None
                if keys and self._tenant and self._protocol in AZURE_PROTOCOLS:
                    azure_key = tenant_cpk_key(keys, self._tenant)
                if self._engine == "obstore" and self._protocol in AZURE_PROTOCOLS:
                    fallback = self._adlfs_fallback(options)
                    io = _obstore_azure_io(
                        options, self._retry, fallback=fallback, key=azure_key, sas_only=self._signer is not None
                    )
                    fs = io.fs
                elif self._engine == "obstore":
                    io = _obstore_io(options, self._retry, fallback=self._s3fs_fallback(options))
                    fs = io.fs
                elif self._protocol in {"s3", "s3a"}:
                    io = self._s3fs_io(options)
                    fs = io.fs
                else:
                    # Azure's SDK and gcsfs retry inside our retry loop unless told not to (async_fsspec_io.py): on
                    # an instance of our own, not one fsspec's cache would hand the application's code too.
                    own = {"skip_instance_cache": True} if self._protocol in CLOUD_PROTOCOLS else {}
                    fs = without_client_retries(fsspec.filesystem(self._protocol, **options, **own))
                    if self._protocol in GCS_PROTOCOLS:
                        # gcsfs has no option for customer-supplied keys: a tenant's client adds its key's headers to
                        # its objects' requests, and every client tells GCS's refusals of a key apart (gcs_keys.py).
                        key_headers = tenant_csek_headers(keys, self._tenant) if keys and self._tenant else None
                        fs = with_customer_key(fs, key_headers)
                    elif self._protocol in AZURE_PROTOCOLS:
                        # adlfs passes no customer-provided key to the Azure SDK: a policy on the client adds it.
                        fs = with_azure_key(fs, azure_key)
            self._io = io or engine_for(fs)

    def for_tenant(self, tenant: str) -> FilesystemHandle:
        """The handle of a store scoped to `tenant`: its client signs as the tenant and sends its key, as configured."""
        return self._tenant_handle(tenant, signs_as_tenant=True)

    def _tenant_handle(self, tenant: str, *, signs_as_tenant: bool) -> FilesystemHandle:
        key = (tenant, signs_as_tenant)
        evicted = []
        with self._lock:
            handle = self._tenant_handles.get(key)
            if handle is not None:
                self._tenant_handles.move_to_end(key)
                return handle
            handle = FilesystemHandle(
                self._protocol,
                self._root_path,
                self._storage_options,
                None,
                self._retry,
                self._engine,
                isolation=self._isolation,
                tenant=tenant,
                signs_as_tenant=signs_as_tenant,
                root=self,
            )
            self._tenant_handles[key] = handle
            while len(self._tenant_handles) > max(1, self.tenant_clients):
                evicted.append(self._tenant_handles.popitem(last=False)[1])
        for old in evicted:
            old._evict()
        return handle

    def live_tenant_handles(self) -> int:
        """How many tenant handles the root keeps (at most `tenant_clients`)."""
        return len(self._tenant_handles)

    def _touch(self, handle: FilesystemHandle) -> None:
        # A tenant store held across requests uses its handle without asking the root: each request keeps it recent.
        key = (handle._tenant or "", handle._signs_as_tenant)
        with self._lock:
            if self._tenant_handles.get(key) is handle:
                self._tenant_handles.move_to_end(key)

    def _current(self) -> FilesystemHandle:
        """An evicted handle's successor: the root's handle for the same tenant (made again if need be)."""
        if self._root is None or self._tenant is None:  # pragma: no cover - only tenant handles are evicted
            raise RuntimeError("only a tenant's handle is evicted")
        return self._root._tenant_handle(self._tenant, signs_as_tenant=self._signs_as_tenant)

    def _evict(self) -> None:
        self._evicted = True
        self._retire_io()

    def _retire_io(self) -> None:
        """Let the current client go: closed now if no request uses it, else when its last request ends."""
        with self._lock:
            io, self._io = self._io, None
            if io is None:
                return
            if self._users.get(id(io)):
                self._retiring[id(io)] = io
                return
        self._close_later(io)

    def _close_later(self, io: Engine) -> None:
        with self._closing_lock:
            self._to_close.append(io)

    async def _lease_async(self) -> Engine:
        """The client for one request, counted as in use until `_release`."""
        if self._signer is not None:
            await self._renew_credentials_async()
        with self._lock:
            self._create_locked()
            io = self._io
            if io is None:  # pragma: no cover - _create_locked always sets it; this narrows the type
                raise RuntimeError("filesystem handle was not created")
            self._users[id(io)] = self._users.get(id(io), 0) + 1
        if self._root is not None:
            self._root._touch(self)
        return io

    def _release(self, io: Engine) -> bool:
        """End one request's use of `io`; True if that was the last use of a client let go meanwhile."""
        with self._lock:
            users = self._users[id(io)] - 1
            if users:
                self._users[id(io)] = users
                return False
            del self._users[id(io)]
            retired = self._retiring.pop(id(io), None)
        if retired is None:
            return False
        self._close_later(retired)
        return True

    async def _close_retired_async(self) -> None:
        if not self._to_close:
            return
        with self._closing_lock:
            doomed = list(self._to_close)
            self._to_close.clear()
        for io in doomed:
            try:
                await close_engine_async(io)
            except Exception:  # closing must never fail a request: the pool then goes with the garbage collector
                _logger.warning("Could not close a tenant's storage client.", exc_info=True)

    def _signing_credentials(self) -> TenantSigning | None:
        # Called under the lock, so a sync first use waits for STS in the caller's thread.
        if self._signer is None:
            return None
        try:
            return self._signer.signing_now()
        except Exception as error:
            mark_location(error, self.location())  # a sync first use asks STS outside `request`
            raise

    async def _renew_credentials_async(self) -> None:
        # Cached and fresh: nothing to do. Else one STS call in a worker thread, then a client signing with its answer.
        assert self._signer is not None  # noqa: S101 - only a handle signing as a tenant renews
        try:
            renewed = await self._signer.renew_async()
        except Exception as error:
            mark_location(error, self.location())
            raise
        if renewed:
            self._retire_io()  # made again, with these credentials, on its next use; the old one closed

    def _s3fs_io(self, options: dict[str, Any]) -> Engine:
        options = dict(options)
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("max_pool_connections", DEFAULT_S3_MAX_POOL_CONNECTIONS)
        options["config_kwargs"] = config
        if self._retry is not None:
            options = s3_client_options(options)
        # Async calls use a client on the caller's own loop (made on first use there), sync calls this one.
        return s3_io_with_loop_clients(
            self._s3_filesystem(options),
            lambda: self._s3_filesystem(options, asynchronous=True),
            sessions=self._root._s3_sessions_for(self._signs_as_tenant) if self._root is not None else None,
        )

    def _s3_sessions_for(self, signs_as_tenant: bool) -> SharedSessions:
        # Called by tenant handles while holding their own lock, never this one's.
        with self._closing_lock:
            return self._s3_sessions.setdefault(signs_as_tenant, SharedSessions())

    def _s3fs_fallback(self, options: dict[str, Any]) -> Callable[[], Engine] | None:
        """s3fs, made on first need, for the keys obstore cannot list or delete; None without s3fs."""
        if importlib.util.find_spec("s3fs") is None:
            return None
        return _MadeOnFirstNeed(lambda: self._s3fs_io(options))

    def _adlfs_fallback(self, options: dict[str, Any]) -> Callable[[], Engine] | None:
        """adlfs, made on first need, for the keys obstore cannot list or delete on Azure; None without adlfs."""
        if importlib.util.find_spec("adlfs") is None:
            return None
        own = {"skip_instance_cache": True}  # its retries go off: not on an instance the application may hold
        return _MadeOnFirstNeed(
            lambda: engine_for(without_client_retries(fsspec.filesystem(self._protocol, **options, **own)))
        )

    def _s3_filesystem(self, options: dict[str, Any], *, asynchronous: bool = False) -> AbstractFileSystem:
        if asynchronous:
            # Never from fsspec's instance cache: an asynchronous instance belongs to the loop it was made on.
            fs = fsspec.filesystem(self._protocol, **{**options, "asynchronous": True, "skip_instance_cache": True})
        elif self._tenant is not None:
            # A tenant's client is made again with each renewal of its credentials: fsspec's instance cache would keep
            # every one (and its connection pool) for the life of the process.
            fs = fsspec.filesystem(self._protocol, **{**options, "skip_instance_cache": True})
        else:
            fs = fsspec.filesystem(self._protocol, **options)
        if self._retry is not None:
            # s3fs retries on top of botocore (a class attribute, not an option): one attempt, ours retry.
            fs.retries = 1
        return fs

    def io(self) -> Engine:
        if self._evicted:
            return self._current().io()
        with self._lock:
            self._create_locked()
            io = self._io
        if io is None:  # pragma: no cover - _create_locked always sets it; this narrows the type without assert
            raise RuntimeError("filesystem handle was not created")
        return io

    async def io_async(self) -> Engine:
        """`io`, from a coroutine: a tenant's credentials are asked for in a worker thread, never on the loop."""
        if self._evicted:
            return await self._current().io_async()
        if self._signer is not None:
            await self._renew_credentials_async()
        return self.io()

    async def request(self, operation: str, path: str, call: Callable[[Engine], Awaitable[T]]) -> T:
        """
        Send one engine call, retried under the store's policy when its storage is remote (`retry.retried`).

        :param operation: What the call does, for logs (``"put"``, ``"get"``, ...).
        :param path: The path it concerns, for logs.
        :param call: The engine call, given the engine.
        :returns: What the call returned.
        """
        if self._evicted:
            return await self._current().request(operation, path, call)
        if self._isolation.keys is not None and self._tenant is None:
            # The root's request inside a tenant's scope: that tenant's key, the worker's credentials.
            tenant = tenant_of_path(self._root_path, path)
            if tenant is not None:
                return await self._tenant_handle(tenant, signs_as_tenant=False).request(operation, path, call)
        if self._to_close:
            await self._close_retired_async()
        try:
            io = self._io
            # Only a tenant's client is ever let go (evicted, or replaced by renewed credentials): a request on the
            # root's client, once made, has no use to count.
            leased = io is None or self._root is not None
            if io is None or leased:
                io = await self._lease_async()
            try:
                if self._retry is None or not io.remote:
                    # Memory and local disk do not fail transiently: a retry would only repeat a real failure, later.
                    with metrics.storage_request(operation, timed=io.remote):
                        return await call(io)
                return await retried(io, self._retry, self.retry_stats, operation, path, call, location=self.location())
            finally:
                if leased and self._release(io):
                    await self._close_retired_async()  # this request was the last on a client let go
        except StorageRequestError as error:
            # GCS names a refused key in its answer (its engine raises the refusal itself, gcs_keys.py); S3 does not.
            bare_400 = error.status == 400 and self._protocol in {"s3", "s3a"}
            if bare_400 and self._isolation.keys is not None and self._tenant is not None:
                # S3 answers a wrong or missing SSE-C key with a bare 400 (to a HEAD, with no body at all).
                refused = EncryptionKeyRefusedError(errno.EACCES, f"SSE-C key refused: {error.cause}")
                mark_location(refused, self.location())
                raise refused from error
            if bare_400 and self._isolation.keys is None and operation in _OBJECT_READS:
                # The same bare 400 to a store without keys: the object was written with one (a read sends nothing
                # else S3 could find malformed).
                missing = EncryptionKeyMissingError(errno.EACCES, f"read without an SSE-C key: {error.cause}")
                mark_location(missing, self.location())
                raise missing from error
            mark_location(error, self.location())
            raise
        except Exception as error:
            mark_location(error, self.location())  # the error's `location`, once translated
            raise

    def location(self) -> str:
        """
        The store as an operator names it: the bucket and endpoint on S3 (``s3://bucket at http://host:9000``, or
        ``at AWS``), else the root; never credentials.
        """
        # Worked out once: every request hands it to the retry loop, and nothing it depends on changes.
        if self._location is None:
            self._location = self._worked_out_location()
        return self._location

    def _worked_out_location(self) -> str:
        if self._protocol in {"s3", "s3a"}:
            endpoint = self.backend_key()[2]
            where = f"s3://{self._root_path.split('/', 1)[0]} at {redacted_url(endpoint) if endpoint else 'AWS'}"
            # Only ever this handle's own tenant: a store signing as a tenant reaches no other.
            return f"{where}, signed as tenant {self._tenant!r}" if self._signer is not None else where
        if self._protocol in CLOUD_PROTOCOLS:
            where = cloud_location(self._protocol, self._root_path, self._storage_options)
            token = "SAS" if self._protocol in AZURE_PROTOCOLS else "downscoped token"
            return f"{where}, with tenant {self._tenant!r}'s {token}" if self._signer is not None else where
        return f"{self._protocol}://{self._root_path}"

    def quota_tracker(self) -> QuotaTracker:
        """The quota tracker of every store sharing this handle or its root, created on first use."""
        if self._root is not None:
            return self._root.quota_tracker()
        with self._lock:
            if self._quota_tracker is None:
                self._quota_tracker = QuotaTracker()
            return self._quota_tracker

    def invalidate(self, scope: tuple[str, ...]) -> None:
        """Make quota checks list `scope` again (after deletes and purges)."""
        if self._root is not None:
            self._root.invalidate(scope)
        elif self._quota_tracker is not None:
            self._quota_tracker.invalidate(scope)

    def backend_key(self) -> tuple[str, ...]:
        """What identifies the backend for checks cached per process: engine, protocol, endpoint, bucket."""
        options = self._storage_options
        endpoint = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
        if self._protocol in {"s3", "s3a"}:
            endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            place = self._root_path.split("/", 1)[0]
        else:
            place = self.root_path()
        given = str(id(self._filesystem)) if self._filesystem is not None else ""
        return (self._engine, self._protocol, str(endpoint or ""), place, given)

    def root_path(self) -> str:
        # Known without a client (a tenant's would need its credentials first).
        if self._resolved_root is None:
            root = self._root_path
            if self._protocol in {"file", "local"}:
                # Compare real paths later: a symlink anywhere below the real root is refused.
                root = os.path.realpath(root)
            self._resolved_root = root
        return self._resolved_root


class _MadeOnFirstNeed:
    """An engine made on first call (obstore's s3fs fallback), kept as `made` so closing its owner closes it."""

    def __init__(self, make: Callable[[], Engine]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self.made: Engine | None = None

    def __call__(self) -> Engine:
        with self._lock:
            if self.made is None:
                self.made = self._make()
            return self.made


def strip_protocol(filesystem_class: type[AbstractFileSystem] | None, url: str) -> str:
    if filesystem_class is None:  # the obstore engine, without s3fs (or adlfs) installed
        from haystack_integrations.offload.stores.obstore_io import strip_s3_url

        if url.split("://", 1)[0] in AZURE_PROTOCOLS:
            from haystack_integrations.offload.stores.obstore_azure import strip_azure_url

            return strip_azure_url(url)

        return strip_s3_url(url)
    return str(filesystem_class._strip_protocol(url)).rstrip("/")


def _obstore_io(options: dict[str, Any], retry: RetryPolicy | None, *, fallback: Callable[[], Engine] | None) -> Engine:
    from haystack_integrations.offload.stores.obstore_io import ObstoreIO, obstore_settings

    settings = obstore_settings(
        options, retrying=retry is not None, attempt_timeout=retry.attempt_timeout if retry is not None else None
    )
    return ObstoreIO(settings, fallback=fallback)


def _obstore_azure_io(
    options: dict[str, Any],
    retry: RetryPolicy | None,
    *,
    fallback: Callable[[], Engine] | None,
    key: bytes | None,
    sas_only: bool = False,
) -> Engine:
    from haystack_integrations.offload.stores.obstore_azure import (
        AzureObstoreIO,
        azure_settings,
        with_cpk_key,
        with_sas_only,
    )

    settings = azure_settings(
        options, retrying=retry is not None, attempt_timeout=retry.attempt_timeout if retry is not None else None
    )
    if sas_only:  # a tenant's SAS: no account key or service principal from the environment beside it
        settings = with_sas_only(settings)
    return AzureObstoreIO(with_cpk_key(settings, key) if key is not None else settings, fallback=fallback)
