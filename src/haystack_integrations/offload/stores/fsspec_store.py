"""`FsspecToolResultStore`: a Haystack `ToolResultStore` over any fsspec filesystem, scoped per tenant and session."""

from __future__ import annotations

import asyncio
import builtins
import copy
import os
from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar

import fsspec
from fsspec import AbstractFileSystem
from fsspec.core import split_protocol
from haystack.hooks.tool_result_offloading.types import ToolResultStore

from haystack_integrations.offload.stores.chunks import ContentChunks
from haystack_integrations.offload.stores.documents import DocumentHost, SessionDocuments
from haystack_integrations.offload.stores.encryption import TenantKeys
from haystack_integrations.offload.stores.engines import (
    DEFAULT_ENGINE,
    EngineChoice,
    choose_engine,
)
from haystack_integrations.offload.stores.exclusive_creates import (
    ExclusiveCreateCheck,
    store_exclusive_creates_async,
)
from haystack_integrations.offload.stores.filesystem_handle import (
    DEFAULT_S3_MAX_POOL_CONNECTIONS as DEFAULT_S3_MAX_POOL_CONNECTIONS,
)
from haystack_integrations.offload.stores.filesystem_handle import FilesystemHandle, strip_protocol
from haystack_integrations.offload.stores.layout import parse_reference, scope_path
from haystack_integrations.offload.stores.names import TEMPORARY_GRACE, parse_object_name
from haystack_integrations.offload.stores.operator_objects import (
    ScopeChildren,
    activity_times_below_async,
    children_below_async,
    delete_below_async,
    objects_below_async,
)
from haystack_integrations.offload.stores.options import check_s3_options, redacted_url
from haystack_integrations.offload.stores.pages import list_after_async, session_page_async, sizes_of
from haystack_integrations.offload.stores.pending import PendingWrite
from haystack_integrations.offload.stores.purging import end_session as end_session
from haystack_integrations.offload.stores.purging import end_session_async as end_session_async
from haystack_integrations.offload.stores.purging import purge_scope_async
from haystack_integrations.offload.stores.quotas import (
    Quota,
    Reservation,
)
from haystack_integrations.offload.stores.records import ResultsPage, StoredResult
from haystack_integrations.offload.stores.result_objects import STREAMED_WRITE_BYTES as STREAMED_WRITE_BYTES
from haystack_integrations.offload.stores.result_objects import (
    check_range,
    decoded,
    listing_key,
    prepare_write,
    readable_path_async,
    record_of,
    records_of,
    size_of,
)
from haystack_integrations.offload.stores.retention import (
    Retention,
)
from haystack_integrations.offload.stores.retry import RetryPolicy, RetryStats
from haystack_integrations.offload.stores.scope import check_local_path, check_object_store_path, validate_scope_id
from haystack_integrations.offload.stores.scope_usage import ScopeUsage
from haystack_integrations.offload.stores.store_serialization import store_from_dict, store_to_dict
from haystack_integrations.offload.stores.sync_api import run_on_io_loop, run_on_own_loop, synced
from haystack_integrations.offload.stores.tenant_access import (
    TenantCredentials,
    TenantIsolation,
    check_isolation,
)
from haystack_integrations.offload.stores.translate import storage_errors
from haystack_integrations.offload.stores.usage_marks import MarkedUsage

_EXTRAS_BY_PROTOCOL = {
    "s3": "s3",
    "s3a": "s3",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
    "gs": "gcs",
    "gcs": "gcs",
}
DEFAULT_RETRY = RetryPolicy()

P = ParamSpec("P")
T = TypeVar("T")


class FsspecToolResultStore(ToolResultStore):
    """
    Stores offloaded tool results in object storage, local disk or memory, isolated per tenant and session.

    Any fsspec URL works: ``s3://bucket/prefix`` (s3fs), ``file:///path`` or a plain path, ``memory://name``, and
    other fsspec protocols. Create one root store at start-up, then derive a scoped store per request::

        s3://acme-agent-results/prod/             root store: FsspecToolResultStore("s3://acme-agent-results/prod")
        ├── <tenant>/                             for_tenant("acme"): operators, quotas, purge
        │   └── <session>/                        for_session("acme", "chat-42"): one conversation's results
        │       ├── 20261129T213400123456Z-5f3a9c1e.t.web_search.3_web_search_call_abc.txt
        │       └── 20261129T213401007210Z-09c2d4aa.b.render_chart.3_render_chart_call_def.png
        └── <tenant>/...

    Each object name carries its metadata (creation time, a random nonce, text or bytes, tool name, the writer's
    key made safe), so listing needs no extra reads and two writes never collide. A session store returns the object
    name as the reference: it reveals nothing about the bucket, the prefix or other tenants.

    ```python
    from haystack_integrations.offload import FsspecToolResultStore, offload_context

    results = FsspecToolResultStore("memory://agent-results")          # once, at start-up
    store = results.for_session(tenant="acme", session="chat-42")      # per request
    reference = store.write(key="search_1.txt", content="a very long search result ...")
    assert store.read(reference) == "a very long search result ..."
    hook_context = offload_context(store)  # Agent.run(..., hook_context=hook_context)
    ```

    Multi-user use: share the root store (and its filesystem client) across requests and give each run
    ``offload_context(root.for_session(tenant, session))``. `read` treats every reference as hostile: anything that
    does not name a result inside the store's own scope (other sessions or tenants, URLs, absolute paths, ``..`` in
    any spelling, symlinks out of a local root) raises `InvalidReferenceError` and reads nothing.

    Requests: a write is one PUT, a whole read one GET, `read_range` one ranged GET; none of them lists, HEADs or
    creates directories on S3. Local writes are atomic (temporary file, then rename). Every method has an async twin
    that never blocks the event loop.

    Engine: on a busy multi-user server the S3 client's own CPU adds up, so ``s3://`` goes through Rust's object_store
    (obstore) by default, with the same requests and semantics as s3fs for about a third of its client CPU; where the
    storage options need s3fs, the default uses s3fs and logs why (`engine_choice`).

    Operations: transient failures (5xx, SlowDown, resets, timeouts) are retried under `retry` (`RetryPolicy`; counts
    in `retry_stats`); `quota` (`Quota`) refuses writes that would pass a session's or tenant's limits before sending
    anything; `retention` (`Retention`) makes results expire (refused by `read`, removed by ``purge(expired=True)``).
    `end_session(store)` deletes a session's results when the application ends it.
    """

    supports_binary_content = True

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        filesystem: AbstractFileSystem | None = None,
        tenant: str | None = None,
        session: str | None = None,
        quota: Quota | None = None,
        retention: Retention | None = None,
        retry: RetryPolicy | None = DEFAULT_RETRY,
        engine: str = DEFAULT_ENGINE,
        credentials: TenantCredentials | None = None,
        encryption: TenantKeys | None = None,
    ) -> None:
        """
        Create a store rooted at `url`. No network I/O happens here; the client is created on first use or `warm_up`.

        :param url: Root URL of the store: ``s3://bucket/prefix``, ``file:///path``, a plain path, ``memory://name``
            or any other fsspec URL.
        :param storage_options: Options for the fsspec filesystem (for s3fs: ``endpoint_url``, ``client_kwargs``,
            ``config_kwargs``, ...). Credentials may be given as Haystack `Secret`s; plain-text credentials work but
            make `to_dict` refuse to serialize the store. On S3 the connection pool defaults to
            `DEFAULT_S3_MAX_POOL_CONNECTIONS`.
        :param filesystem: An fsspec filesystem to use instead of creating one from `url` and `storage_options`;
            `url` is then a path on it. Such a store cannot be serialized.
        :param tenant: Scope the store to this tenant (same as `for_tenant`).
        :param session: Scope the store to this session of `tenant` (same as `for_session`).
        :param quota: Per-session and per-tenant limits on results and bytes, checked before each write sends anything.
            None (the default): no limits, and a write is exactly one PUT.
        :param retention: How long results stay readable (per store, overridable per tenant). None: kept until purged.
        :param retry: How transient storage failures are retried (see `RetryPolicy`). On S3 it replaces botocore's and
            s3fs's own retries for the client this store creates (unless `storage_options` sets botocore's
            ``retries``); None leaves retrying entirely to the backend's defaults.
        :param engine: ``"auto"`` (the default): ``"obstore"`` for ``s3://`` URLs whose `storage_options` it can
            honour, else ``"fsspec"`` (logged once, with the reason). ``"fsspec"``: the URL's fsspec backend (s3fs for
            ``s3://``). ``"obstore"``, for ``s3://`` only: the same requests through Rust's object_store, far less CPU
            per request; it takes the same `storage_options` (refusing those it cannot honour), profiles through
            botocore, and the environment; each attempt of the `retry` policy is bounded by its request timeout.
        :param credentials: Credentials per tenant: S3's `AssumeRoleCredentials`, GCS's `DownscopedCredentials`, Azure's
            `DirectorySasCredentials`:
            every store derived for a tenant (`for_tenant`, `for_session`), its documents included, signs with
            credentials that reach only ``<root>/<tenant>/``, so the object store refuses what the scope checks would.
            This root store keeps the storage options' (or the environment's) credentials, which they derive from.
        :param encryption: On S3, GCS and Azure, an encryption key per tenant (`TenantKeys`: SSE-C, or GCS's and Azure's
            customer keys): every request inside a tenant's scope, from whichever store (this root's operator requests
            included), that reads or writes an object sends that tenant's key, and the object store encrypts with it
            and keeps none. Start it on an empty root: objects written without a key are not readable with one.
        :raises ValueError: If the URL has no path (e.g. ``s3://``), is a local path that can only be a mistyped URL
            (``s3:/bucket``, ``s3//bucket``, ``s3:bucket``: the message names the URL meant), `session` is given
            without `tenant`, or `engine` cannot serve the store (unknown; ``"obstore"`` for another protocol, a
            filesystem object, or storage options it cannot honour), or an S3 endpoint (in the storage options, else
            ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``) is not an ``http://`` or ``https://`` URL.
        :raises InvalidScopeIdError: If `tenant` or `session` is not a safe single path segment.
        :raises ImportError: If the backend for the URL's protocol (or obstore, for ``engine="obstore"``) is not
            installed.
        """
        protocol, path = split_protocol(url)
        if protocol in ("s3", "s3a") and filesystem is None:
            check_s3_options(storage_options or {}, os.environ)
        if protocol not in (None, "file", "local", "memory"):
            check_object_store_path(url, path)
        choice = choose_engine(engine, url, storage_options, filesystem)
        if protocol is None and filesystem is None:
            check_local_path(url)  # "s3:/bucket" would otherwise be a local folder named "s3:"
        protocol = protocol or "file"
        if filesystem is not None:
            protocol = filesystem.protocol if isinstance(filesystem.protocol, str) else filesystem.protocol[0]
        filesystem_class: type[AbstractFileSystem] | None
        try:
            filesystem_class = type(filesystem) if filesystem is not None else fsspec.get_filesystem_class(protocol)
        except ImportError as error:
            if choice.engine != "obstore":  # which needs no s3fs
                extra = _EXTRAS_BY_PROTOCOL.get(protocol)
                hint = f' Install it with: pip install "offload-haystack[{extra}]"' if extra else ""
                raise ImportError(f"The backend for '{protocol}://' URLs is not installed.{hint}") from error
            filesystem_class = None
        root_path = strip_protocol(filesystem_class, url)
        if not root_path:
            raise ValueError(
                f"The store URL {redacted_url(url)!r} has no path: give a bucket or a directory, e.g. 's3://bucket'."
            )

        self.url = url
        self.storage_options: dict[str, Any] = dict(storage_options or {})
        self.quota = quota
        self.retention = retention
        self.retry = retry
        self.engine = engine
        self.engine_choice: EngineChoice = choice
        self._filesystem = filesystem
        isolation = TenantIsolation(credentials, encryption)
        from_url = filesystem is None
        check_isolation(protocol, isolation, from_url=from_url, options=self.storage_options, environ=os.environ)
        self.credentials = credentials
        self.encryption = encryption
        self._handle = FilesystemHandle(
            protocol, root_path, self.storage_options, filesystem, retry, choice.engine, isolation=isolation
        )
        self._scope: tuple[str, ...] = ()
        self._scope_directory: tuple[tuple[str, ...], str] | None = None
        if session is not None and tenant is None:
            raise ValueError("A session scope needs a tenant: pass tenant= as well.")
        if tenant is not None:
            self._scope = (validate_scope_id(tenant, field="tenant"),)
        if session is not None:
            self._scope += (validate_scope_id(session, field="session"),)

    # Scopes

    @property
    def scope(self) -> tuple[str, ...]:
        """The store's scope below its root: ``()``, ``(tenant,)`` or ``(tenant, session)``."""
        return self._scope

    @property
    def tenant(self) -> str | None:
        """The tenant this store is scoped to, if any."""
        return self._scope[0] if self._scope else None

    @property
    def session(self) -> str | None:
        """The session this store is scoped to, if any."""
        return self._scope[1] if len(self._scope) > 1 else None

    @property
    def resolved_engine(self) -> str:
        """The engine serving this store's requests: ``"obstore"`` or ``"fsspec"`` (`engine_choice` says why)."""
        return self.engine_choice.engine

    @property
    def retry_stats(self) -> RetryStats:
        """Retries of this store's storage calls, shared with every store derived from the same root."""
        return self._handle.retry_stats

    def for_tenant(self, tenant: str) -> FsspecToolResultStore:
        """
        Return a store scoped to ``<root>/<tenant>/``, sharing this store's client.

        A tenant store lists, inspects, deletes and purges all of the tenant's sessions (references are
        ``<session>/<name>``); it does not write.

        :param tenant: The tenant id, a single safe path segment.
        :returns: The tenant-scoped store.
        :raises InvalidScopeIdError: If `tenant` is not a safe single path segment.
        :raises ValueError: If this store is already scoped.
        """
        return self._scoped(validate_scope_id(tenant, field="tenant"))

    def for_session(self, tenant: str, session: str) -> FsspecToolResultStore:
        """
        Return a store scoped to ``<root>/<tenant>/<session>/``, sharing this store's client.

        Cheap enough to call on every request: it validates the ids and copies a few attributes.

        :param tenant: The tenant id (e.g. the organisation), a single safe path segment.
        :param session: The session id (e.g. the chat), a single safe path segment.
        :returns: The session-scoped store.
        :raises InvalidScopeIdError: If an id is not a safe single path segment; the message names the field.
        :raises ValueError: If this store is already scoped.
        """
        return self._scoped(validate_scope_id(tenant, field="tenant"), validate_scope_id(session, field="session"))

    def _scoped(self, *ids: str) -> FsspecToolResultStore:
        if self._scope:
            raise ValueError(
                f"This store is already scoped to {'/'.join(self._scope)!r}; derive scoped stores from the root store."
            )
        child = copy.copy(self)
        child._scope = ids
        if self.credentials is not None or self.encryption is not None:
            child._handle = self._handle.for_tenant(ids[0])  # the tenant's own client: its credentials, its key
        return child

    def documents(self, namespace: str) -> SessionDocuments:
        """
        Return the small documents kept in `namespace` beside this scope's results (approvals, claims, audit).

        :param namespace: A short lower-case name such as ``"approvals"``.
        :returns: A `SessionDocuments` sharing this store's client and scope.
        :raises ValueError: If the namespace is not a short lower-case identifier.
        """
        host = DocumentHost(
            scope_path=self._scope_path,
            request=self._handle.request,
            run_sync=self._run_sync,
            charge=lambda size, enforce: ScopeUsage(self).charge_document_async(size, enforce=enforce),
            require_exclusive_creates=self._require_exclusive_creates_async,
        )
        return SessionDocuments(host, namespace)

    def check_sync_use(self) -> None:
        """
        Refuse sync use of a store built on a filesystem created with ``asynchronous=True``: its client belongs to the
        loop it was made on, and a sync call has no such loop to wait on. Sync calls above the store ask it too.

        :raises TypeError: If the store's filesystem is asynchronous.
        """
        if getattr(self._filesystem, "asynchronous", False):
            raise TypeError(
                "This store is built on an fsspec filesystem created with asynchronous=True, which has no loop of its "
                "own to wait on: use the *_async functions, or build the store from a URL instead."
            )

    def _run_sync(self, operation: Callable[P, Coroutine[Any, Any, T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run an async method for its sync twin (`stores.sync_api`): the sync API is the async one, waited for."""
        self.check_sync_use()
        io = self._handle.io()
        if io.uses_worker_threads or not io.remote:  # disk or memory: no shared client to hop to
            return run_on_own_loop(operation, *args, **kwargs)
        return run_on_io_loop(operation, *args, **kwargs)

    # Paths

    def _scope_path(self) -> str:
        # Asked by every write and read: joined once per scope (a copy given another scope joins its own).
        made = self._scope_directory
        if made is None or made[0] is not self._scope:
            made = self._scope_directory = (self._scope, scope_path(self._handle.root_path(), self._scope))
        return made[1]

    def _path_of(self, reference: object) -> tuple[str, tuple[str, ...]]:
        segments = parse_reference(reference, scope_depth=len(self._scope))
        return "/".join([self._scope_path(), *segments]), segments

    def _tenant_of(self, segments: tuple[str, ...]) -> str | None:
        # A root store's references start with the tenant; scoped stores know theirs.
        if self.tenant is not None:
            return self.tenant
        return segments[0] if len(segments) == 3 else None

    async def reconcile_usage_async(self, tenant: str | None = None) -> tuple[int, int]:
        """
        Set a tenant's usage marks to what a full listing of the tenant finds (a LIST per 1000 objects), correcting
        drift: writes a worker admitted and died before marking, results deleted or purged, results past their
        retention. Writers do this themselves before a refusal and every `Quota.reconcile_seconds`; this is the
        operator's way to do it now.

        :param tenant: The tenant; a tenant or session store's own by default.
        :returns: The tenant's results and bytes as now marked.
        :raises ValueError: If no tenant is given or known, or the store has no quota kept by usage marks.
        """
        return await ScopeUsage(self).reconcile_usage_async(tenant)

    reconcile_usage = synced(reconcile_usage_async)

    async def marked_usage_async(self, tenant: str | None = None) -> MarkedUsage | None:
        """
        A tenant's usage as its newest usage mark says, in one LIST (max-keys 1) and one GET whatever the tenant
        holds: the summary `offload-haystack du` shows. Marks exist once a writer with a `Quota` (``tenant_usage=
        "marks"``, the default) has written in the tenant; a listing (`operations.scan`) gives exact figures.

        :param tenant: The tenant; a tenant or session store's own by default.
        :returns: The marked figures, or None if the tenant has no usage mark.
        :raises ValueError: If no tenant is given or known.
        :raises StorageError: If the backend fails.
        """
        return await ScopeUsage(self).marked_usage_async(tenant)

    marked_usage = synced(marked_usage_async)

    # ToolResultStore protocol, and its async twins

    async def write_async(self, *, key: str, content: str | bytes, tool_name: str | None = None) -> str:
        """
        Store one tool result and return its reference. One PUT on S3; an atomic rename on local disk.

        :param key: The writer's key for the result (Haystack's hook passes step, tool and call id plus an
            extension). It is made safe and bounded; a random nonce keeps every write distinct.
        :param content: The result: `str` comes back from `read` as `str`, bytes as `bytes`.
        :param tool_name: The tool that produced the result, recorded for `list`.
        :returns: The reference to pass to `read`, relative to this store's scope.
        :raises StorageError: If the backend fails (chained to the backend's exception); `StorageUnavailableError`
            once transient failures outlast the retry policy.
        :raises StoragePermissionError: If the backend refuses the write.
        :raises QuotaExceededError: If the write would pass the store's quota; nothing was sent.
        """
        path, reference, data = prepare_write(self, key, content, tool_name)
        reservation = await ScopeUsage(self).admit_async(size_of(data)) if self.quota is not None else None
        await self._put_async(path, data, reservation)
        return reference

    def write(self, *, key: str, content: str | bytes, tool_name: str | None = None) -> str:
        """The sync form of `write_async`, waiting for it (see there)."""
        # Written out, not `synced`: type checkers would give a derived `write` the narrower signature Haystack's
        # ToolResultStore declares (no `tool_name`).
        return self._run_sync(self.write_async, key=key, content=content, tool_name=tool_name)

    async def begin_write_async(self, *, key: str, content: str | bytes, tool_name: str | None = None) -> PendingWrite:
        """
        Start storing one tool result and return at once with its reference; the upload goes on in a task.

        For write-behind callers (`OffloadHook(write_behind=True)`) that hand the reference on while the bytes are
        still travelling. Everything that can be refused without I/O (a bad key or content, the quota) is refused here,
        before anything is sent. Until the write finishes, reading, describing, listing, deleting or purging the result
        through any store built from the same root, sync or async, from any thread or event loop, waits for it: an
        early reader never sees "not found", and nothing lands after a delete or purge. Keep this loop running until
        the write is done, and do not call a sync method on its thread meanwhile (that raises `RuntimeError`).

        :param key: The writer's key for the result.
        :param content: The result, as text or bytes.
        :param tool_name: The tool that produced the result, recorded for `list`.
        :returns: The write in flight: its ``reference``, and ``wait()`` for the outcome (the same errors as
            `write_async`).
        :raises QuotaExceededError: If the write would pass the store's quota; nothing was sent.
        :raises RuntimeError: If called outside a running event loop.
        """
        path, reference, data = prepare_write(self, key, content, tool_name)
        reservation = await ScopeUsage(self).admit_async(size_of(data)) if self.quota is not None else None
        task = asyncio.get_running_loop().create_task(self._put_async(path, data, reservation))
        self._handle.in_flight.track(path, task)
        return PendingWrite(reference, task)

    async def _put_async(self, path: str, data: bytes | ContentChunks, reservation: Reservation | None) -> None:
        try:
            with storage_errors("store the result", reference=None):
                if isinstance(data, ContentChunks):
                    await self._handle.request("put", path, lambda io: io.put_chunks_async(path, data))
                else:
                    await self._handle.request("put", path, lambda io: io.put_async(path, data))
        finally:
            if reservation is not None:
                reservation.settle()

    async def read_async(self, reference: str) -> str | bytes:
        """
        Return a stored result: `str` if it was written as text, `bytes` if written as bytes. One GET on S3.

        :param reference: A reference returned by `write` on this store (or, for a tenant or root store, one of the
            references `list` returns).
        :returns: The stored content.
        :raises InvalidReferenceError: If the reference is malformed or outside this store's scope. Nothing is read.
        :raises ResultNotFoundError: If no result exists under the reference.
        :raises ResultExpiredError: If the result outlived the store's retention (a `ResultNotFoundError`; a name that
            says so is checked against the storage's clock first, one HEAD). The same holds for every read method.
        :raises StorageError: If the backend fails.
        :raises RuntimeError: Sync form only: if a write-behind write of the result is still in flight on this
            thread's own event loop (waiting would block the loop it needs); await `read_async` there. The same holds
            for every sync method.
        """
        path, segments = await readable_path_async(self, reference)
        with storage_errors("read the result", reference=reference):
            data = await self._handle.request("get", path, lambda io: io.get_async(path))
        return decoded(segments, data)

    read = synced(read_async)

    async def read_range_async(self, reference: str, start: int, end: int) -> bytes:
        """
        Return bytes `start` (inclusive) to `end` (exclusive) of a stored result; one ranged GET on S3.

        The range is in bytes of the stored form (UTF-8 for text); it is cut short at the end of the result.

        :param reference: A reference returned by `write`.
        :param start: First byte, zero-based, not negative.
        :param end: One past the last byte; not below `start`.
        :returns: The bytes in the range.
        :raises ValueError: If the range is negative or reversed.
        :raises InvalidReferenceError: If the reference is malformed or outside this store's scope.
        :raises ResultNotFoundError: If no result exists under the reference.
        """
        check_range(start, end)
        path, _ = await readable_path_async(self, reference)
        with storage_errors("read the result", reference=reference):
            return await self._handle.request("get_range", path, lambda io: io.get_range_async(path, start, end))

    read_range = synced(read_range_async)

    async def read_range_and_size_async(self, reference: str, start: int, end: int) -> tuple[bytes, int]:
        """
        Return bytes `start` to `end` (exclusive) of a stored result and the result's total size in bytes.

        For readers that page through a result and say "bytes 0-9999 of 209715200": on S3 this is one ranged GET (the
        size comes from its Content-Range header), on local disk one open file. A range that starts at or past the
        end returns no bytes and the size (on S3, the refused range costs a HEAD).

        :param reference: A reference returned by `write`.
        :param start: First byte, zero-based, not negative.
        :param end: One past the last byte; not below `start`.
        :returns: The bytes in the range (cut short at the end of the result) and the result's size.
        :raises ValueError: If the range is negative or reversed.
        :raises InvalidReferenceError: If the reference is malformed or outside this store's scope.
        :raises ResultNotFoundError: If no result exists under the reference.
        """
        check_range(start, end)
        path, _ = await readable_path_async(self, reference)
        with storage_errors("read the result", reference=reference):
            return await self._handle.request(
                "get_range_and_size", path, lambda io: io.get_range_and_size_async(path, start, end)
            )

    read_range_and_size = synced(read_range_and_size_async)

    # Inventory: tools, CLI, retention

    async def info_async(self, reference: str) -> StoredResult:
        """
        Describe one stored result without reading it (one HEAD on S3).

        :param reference: A reference returned by `write` or `list`.
        :returns: The result's metadata.
        :raises InvalidReferenceError: If the reference is malformed or outside this store's scope.
        :raises ResultNotFoundError: If no result exists under the reference.
        """
        path, segments = await readable_path_async(self, reference)
        with storage_errors("describe the result", reference=reference):
            size = await self._handle.request("size", path, lambda io: io.size_async(path))
        return record_of(reference, segments, size)

    info = synced(info_async)

    async def list_async(self, *, limit: int | None = None) -> builtins.list[StoredResult]:
        """
        List the results in this store's scope, newest first.

        With a `limit`, a session store lists one page (`list_page_async`: one LIST on S3 up to 999 results, whatever
        the session holds); otherwise the whole scope is walked (a LIST per 1000 objects on S3).

        :param limit: Return at most this many (the newest).
        :returns: The results' metadata. Objects that are not results written by this library are left out, and so
            are results past the store's retention (they cannot be read).
        :raises StorageError: If the backend fails (e.g. the bucket does not exist).
        """
        if limit is not None and self.session is not None:
            return (await self.list_page_async(limit=limit)).results if limit > 0 else []
        scope = self._scope_path()
        await self._handle.in_flight.wait_under(scope + "/")
        with storage_errors("list results", reference=None):
            found = await self._handle.request("find", scope, lambda io: io.find_async(scope))
        return records_of(self, sizes_of(found))[:limit]

    list = synced(list_async)

    async def list_page_async(self, *, limit: int = 20, after: str | None = None) -> ResultsPage:
        """
        List one page of the results in this store's scope, newest first, and where the next page starts.

        On a session store a page is one LIST on S3 (up to 999 results), whatever the session holds: result names
        sort newest first (`stores.names`). Results written before that layout follow the newer ones, oldest of them
        last; reaching them lists them all. A tenant or root store walks its scope (a LIST per 1000 objects).

        :param limit: The most results in the page (at least 1).
        :param after: ``next_after`` of the previous page (the reference of its last result); None for the first.
        :returns: The page, with ``next_after`` None when no result follows it.
        :raises ValueError: If `limit` is below 1.
        :raises InvalidReferenceError: If `after` is not a reference this store could have returned.
        :raises StorageError: If the backend fails.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}.")
        if after is not None:
            parse_reference(after, scope_depth=len(self._scope))  # hostile input: a result's reference, or nothing
        scope = self._scope_path()
        await self._handle.in_flight.wait_under(scope + "/")
        if self.session is None:
            with storage_errors("list results", reference=None):
                found = await self._handle.request("find", scope, lambda io: io.find_async(scope))
            records = records_of(self, sizes_of(found))
            if after is not None:
                mark = listing_key(record_of(after, tuple(after.split("/")), 0))
                records = [record for record in records if listing_key(record) > mark]
            shown = records[:limit]
            return ResultsPage(results=shown, next_after=shown[-1].reference if len(records) > limit else None)

        async def lister(start: str | None, most: int | None) -> builtins.list[tuple[str, int]]:
            return await self._handle.request("list", scope, lambda io: list_after_async(io, scope, start, most))

        tenant = self.tenant
        now = datetime.now(UTC)

        def keep(name: str) -> bool:
            parsed = parse_object_name(name)
            return parsed is not None and not (
                self.retention is not None and self.retention.expired(parsed.created, tenant, now=now)
            )

        with storage_errors("list results", reference=None):
            page = await session_page_async(lister, scope, after=after, limit=limit, keep=keep)
        results = [record_of(name, (name,), size) for name, size in page.names]
        return ResultsPage(results=results, next_after=results[-1].reference if page.more and results else None)

    list_page = synced(list_page_async)

    async def settle_writes_async(self) -> None:
        """
        Wait until every write in flight in this store's scope (a write-behind upload of any store sharing its client)
        has landed or failed, without raising their errors: what a server calls before its process exits.
        """
        await self._handle.in_flight.wait_under(self._scope_path() + "/")  # shared with the tenants' handles

    settle_writes = synced(settle_writes_async)

    async def delete_async(self, reference: str) -> None:
        """
        Delete one stored result. Deleting a result that does not exist is not an error.

        :param reference: A reference returned by `write` or `list`.
        :raises InvalidReferenceError: If the reference is malformed or outside this store's scope.
        :raises StorageError: If the backend fails.
        """
        path, segments = self._path_of(reference)
        await self._handle.in_flight.wait_for(path)  # else the write could land after the delete
        try:
            with storage_errors("delete the result", reference=reference):
                await self._handle.request("delete", path, lambda io: io.delete_async([path]))
        finally:
            self._handle.invalidate((*self._scope, *segments[:-1]))

    delete = synced(delete_async)

    async def purge_async(self, *, older_than: timedelta | None = None, expired: bool = False) -> int:
        """
        Delete results in this store's scope (a session's, a tenant's, or, on the root store, everyone's), and the
        documents of sessions inactive for the given age.

        By default every result goes, and documents stay (`end_session` removes a session's). With `older_than`,
        results stored more than that long ago, and every document (history, approvals, audit) of each session whose
        newest activity is older than that; with `expired`, the same by each tenant's own time to live. A session's
        documents go whole or not at all: deleting a live conversation's old turns would corrupt it (see `retention`).
        One LIST (a page per 1000 objects on S3), a GET of the newest history turn of each session whose object names
        do not show it active, then batched deletes: no request per result. A result whose name says it goes is
        checked against the storage's clock (see `Retention`) as the listing gives it (S3's LastModified, a file's
        mtime; a filesystem whose listing has no time is asked, one request per such result). Objects this library
        did not write (an operator's README) are kept.

        ```python
        root.purge(expired=True)                          # retention, e.g. from a nightly job
        root.for_tenant("acme").purge(older_than=timedelta(days=90))
        ```

        Every purge also removes the temporary files of local writes whose writer died mid-write (older than
        `TEMPORARY_GRACE`), and on object stores the probe keys of a killed exclusive-create check (older than
        `PROBE_GRACE`); neither is counted in the returned number.

        :param older_than: Delete only results created before ``now - older_than``, and inactive sessions' documents.
        :param expired: Delete only results past their retention, and the documents of sessions inactive that long.
        :returns: How many objects (results and documents) were deleted.
        :raises ValueError: If both filters are given, `older_than` is not positive or longer than dates can hold
            (`MAX_AGE`), or `expired` is asked of a store without retention.
        :raises StorageError: If the backend fails; results not yet deleted stay (and stay readable, unless expired).
        """
        return await purge_scope_async(self, older_than, expired, temporary_grace=TEMPORARY_GRACE)

    purge = synced(purge_async)

    # Objects: the operator's view (every object below the scope, by path relative to it)

    async def find_objects_async(self) -> dict[str, int]:
        """
        Every object below this store's scope, by path relative to the scope, with its size in bytes.

        The operator's view, for inventories and purges: results, documents, temporary files of local writes and
        objects this library did not write alike (`operations.inventory.classify` tells them apart). One LIST walk on
        S3; waits for write-behind uploads below the scope.

        :returns: ``{"<tenant>/<session>/<name>": size, ...}`` for a root store (shorter paths for scoped stores).
        :raises StorageError: If the backend fails (e.g. the bucket does not exist).
        """
        return await objects_below_async(self)

    find_objects = synced(find_objects_async)

    async def find_children_async(self) -> ScopeChildren:
        """
        What lies directly below this store's scope: a root's tenants, a tenant's sessions, by name, and the scope's
        own objects. One LIST with a delimiter per 1000 of them on S3, however much lies deeper.

        :returns: The directories and objects, relative to the scope.
        :raises StorageError: If the backend fails (e.g. the bucket does not exist).
        """
        return await children_below_async(self)

    find_children = synced(find_children_async)

    async def delete_objects_async(self, paths: Iterable[str]) -> None:
        """
        Delete objects by their paths relative to this store's scope (as `find_objects` names them), in batches.

        :param paths: Relative paths; a missing object is not an error.
        :raises ValueError: If a path is absolute, empty, or has an empty, ``.`` or ``..`` segment: nothing is deleted.
        :raises StorageError: If the backend fails.
        """
        await delete_below_async(self, paths)

    delete_objects = synced(delete_objects_async)

    async def activity_times_async(self, paths: Iterable[str]) -> dict[str, datetime | None]:
        """
        Read activity documents (relative paths, as `find_objects` names them) and the time each says.

        For purges that keep a session's documents while its conversation is active (`retention.IdleSessions`).

        :param paths: The documents' relative paths.
        :returns: Each path's time; None for a document gone meanwhile or saying no time.
        :raises ValueError: If a path is not relative (see `delete_objects`).
        :raises StorageError: If the backend fails.
        """
        return await activity_times_below_async(self, paths)

    activity_times = synced(activity_times_async)

    # Lifecycle and serialization

    async def check_exclusive_creates_async(self, *, refresh: bool = False) -> ExclusiveCreateCheck:
        """
        Check that the backend refuses a second exclusive create of one key, as approvals, claims and turns need.

        The first coordinated create in a process runs this check (a few requests on a probe key inside this store's
        scope, deleted after); a definite verdict is kept per engine, endpoint and bucket, so later creates pay
        nothing. Call it at start-up to fail early (``offload-haystack serve`` does).

        :param refresh: Probe again even if this process already has a verdict.
        :returns: The verdict; `ExclusiveCreateCheck.require` raises unless it is ``"enforced"``.
        :raises StoragePermissionError: If the probe may not be written in this scope.
        """
        return await store_exclusive_creates_async(self, refresh=refresh)

    check_exclusive_creates = synced(check_exclusive_creates_async)

    async def _require_exclusive_creates_async(self) -> None:
        # Every coordinated create's first step: once a verdict is in, one dictionary look-up.
        (await self.check_exclusive_creates_async()).require()

    async def warm_up_async(self) -> None:
        """Create the filesystem client now (and, on S3, its session) instead of on the first request."""
        await (await self._handle.io_async()).warm_up_async()

    warm_up = synced(warm_up_async)

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize the store: URL, storage options (with `Secret`s as environment-variable references) and scope.

        :returns: A dictionary representation.
        :raises SerializationError: If the store was built on a filesystem object, or holds credentials in clear.
        """
        return store_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FsspecToolResultStore:
        """
        Deserialize a store produced by `to_dict`.

        :param data: The dictionary representation.
        :returns: The store.
        """
        return store_from_dict(cls, data)

    def __repr__(self) -> str:
        scope = f", scope={'/'.join(self._scope)!r}" if self._scope else ""
        return f"{type(self).__name__}({redacted_url(self.url)!r}{scope})"
