"""
The doctor's checks as Azure Blob Storage (adlfs) and Google Cloud Storage (gcsfs) answer them: delimited and paged
listings, the large write each client makes (Azure's staged blocks, GCS's resumable upload) and its conditional form,
the tenant-isolation check's verdicts in each cloud's words, and, for every store, why a check that has no meaning
there was not run.

Each check speaks the store's own protocol through the client the store's engine holds, as the S3 checks in
`conformance` do, so what it finds is the store's answer and not a client's emulation of it.
"""

import base64
import contextlib
import importlib
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from fsspec.core import split_protocol

from haystack_integrations.offload.stores.async_fsspec_io import AZURE_PROTOCOLS, GCS_PROTOCOLS, AsyncFilesystemIO
from haystack_integrations.offload.stores.io import Engine, protocols_of

__all__ = [
    "AZURE_BLOCK_BYTES",
    "AZURE_SINGLE_PUT_BYTES",
    "GCS_CHUNK_BYTES",
    "Cloud",
    "Verdict",
    "azure_committed_blocks",
    "azure_conditional_commit",
    "cloud_of",
    "cloud_of_url",
    "cloud_pages",
    "credentials_ignored",
    "gcs_conditional_resumable",
    "keys_ignored",
    "large_write_threshold",
    "not_applicable",
    "pages_verdict",
]

Verdict = Literal["pass", "fail", "warn", "skipped", "unknown"]
Cloud = Literal["azure", "gcs"]
Page = tuple[list[str], list[str]]
"""One listing page: its common prefixes and its keys."""
T = TypeVar("T")

AZURE_SINGLE_PUT_BYTES = 64 * 2**20
"""The Azure SDK's ``max_single_put_size`` default: a blob larger than this is uploaded as staged blocks."""
AZURE_BLOCK_BYTES = 4 * 2**20
"""The Azure SDK's ``max_block_size`` default: the size of each staged block."""
GCS_CHUNK_BYTES = 50 * 2**20
"""gcsfs's ``_pipe_file`` chunk size default: content of this size or more goes as a resumable upload."""
_MAX_PAGES = 20
_NAMES = {"azure": "Azure Blob Storage", "gcs": "Google Cloud Storage"}


def cloud_of(io: Engine) -> Cloud | None:
    """
    Which cloud store an engine talks to.

    :param io: The store's engine.
    :returns: ``"azure"`` (adlfs), ``"gcs"`` (gcsfs), or None for any other.
    """
    if not isinstance(io, AsyncFilesystemIO):
        return None
    protocols = set(protocols_of(io.fs))
    if protocols & AZURE_PROTOCOLS:
        return "azure"
    return "gcs" if protocols & GCS_PROTOCOLS else None


async def _on_engine(io: Engine, operation: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
    # On the loop the engine's client belongs to, with the engine's classification of failures (a refused
    # connection or a 503 is a transient StorageRequestError, which the doctor reports as "unknown").
    if not isinstance(io, AsyncFilesystemIO):
        raise TypeError(f"{type(io).__name__} is not an async filesystem engine")
    return await io._run_async(operation, *args)


def large_write_threshold(io: Engine, cloud: Cloud) -> tuple[int, int]:
    """
    Where the client changes how it writes, as the store's own write (one ``_pipe_file``) would meet it.

    :param io: The store's engine.
    :param cloud: Its cloud.
    :returns: A size such that content larger than it is sent in pieces (Azure: staged blocks; GCS: a resumable
        upload of more than one chunk), and the size of each piece.
    """
    if cloud == "azure":
        config = getattr(getattr(io.fs, "service_client", None), "_config", None)
        single = getattr(config, "max_single_put_size", AZURE_SINGLE_PUT_BYTES)
        block = getattr(config, "max_block_size", AZURE_BLOCK_BYTES)
        return int(single), int(block)
    chunk = _gcs_chunk(io.fs)
    # gcsfs: a simple upload below the chunk size, resumable from it; above it, more than one chunk.
    return chunk, chunk


def _gcs_chunk(fs: Any) -> int:
    # The store calls `_pipe_file` without a chunk size, so gcsfs's default decides (50 MiB in 2026.10).
    parameter = inspect.signature(type(fs)._pipe_file).parameters.get("chunksize")
    return parameter.default if parameter is not None and isinstance(parameter.default, int) else GCS_CHUNK_BYTES


async def cloud_pages(io: Engine, cloud: Cloud, path: str, *, delimiter: bool, page_size: int) -> list[Page]:
    """
    List below `path` page by page as the store pages, asking for `page_size` entries a page.

    :param io: The store's engine.
    :param cloud: Its cloud.
    :param path: ``container/prefix`` or ``bucket/prefix``, without a trailing ``/``.
    :param delimiter: Whether to list with the ``/`` delimiter (common prefixes) or every key below.
    :param page_size: Entries to ask for per page (``maxresults``, ``maxResults``).
    :returns: The pages, in order.
    :raises OSError: If the listing does not end within 20 pages.
    """
    where, _, key = path.partition("/")
    lister = _azure_pages if cloud == "azure" else _gcs_pages
    return await _on_engine(io, lister, where, f"{key}/", delimiter, page_size)


async def _azure_pages(fs: Any, container: str, prefix: str, delimiter: bool, page_size: int) -> list[Page]:
    blob_prefix = importlib.import_module("azure.storage.blob.aio").BlobPrefix
    pages: list[Page] = []
    async with fs.service_client.get_container_client(container) as client:
        if delimiter:
            items = client.walk_blobs(name_starts_with=prefix, delimiter="/", results_per_page=page_size)
        else:
            items = client.list_blobs(name_starts_with=prefix, results_per_page=page_size)
        async for page in items.by_page():
            entries = [entry async for entry in page]
            pages.append(
                (
                    [entry.name for entry in entries if isinstance(entry, blob_prefix)],
                    [entry.name for entry in entries if not isinstance(entry, blob_prefix)],
                )
            )
            if len(pages) >= _MAX_PAGES:
                raise OSError(f"the listing did not end within {_MAX_PAGES} pages")
    return pages


async def _gcs_pages(fs: Any, bucket: str, prefix: str, delimiter: bool, page_size: int) -> list[Page]:
    pages: list[Page] = []
    token: str | None = None
    while len(pages) < _MAX_PAGES:
        query: dict[str, Any] = {"prefix": prefix, "maxResults": page_size}
        if delimiter:
            query["delimiter"] = "/"
        if token:
            query["pageToken"] = token
        answer = await fs._call("GET", "b/{}/o", bucket, json_out=True, **query)
        pages.append((list(answer.get("prefixes") or []), [item["name"] for item in answer.get("items") or []]))
        token = answer.get("nextPageToken")
        if not token:
            return pages
    raise OSError(f"the listing did not end within {_MAX_PAGES} pages")


def pages_verdict(
    pages: list[Page], want_prefixes: list[str], want_keys: list[str], page_size: int, what: str
) -> tuple[Verdict, str]:
    """
    Judge one paged listing: complete and each entry once (else ``fail``), pages no larger than asked (else
    ``warn``).

    :param pages: What the store returned.
    :param want_prefixes: The common prefixes it should hold.
    :param want_keys: The keys it should hold.
    :param page_size: The entries asked for per page.
    :param what: The listing, for the detail (``"a delimited listing"``).
    :returns: The verdict and one phrase.
    """
    prefixes = [name for page in pages for name in page[0]]
    keys = [name for page in pages for name in page[1]]
    largest = max((len(page[0]) + len(page[1]) for page in pages), default=0)
    if sorted(prefixes) != sorted(want_prefixes) or sorted(keys) != sorted(want_keys):
        return "fail", (
            f"{what} in {len(pages)} page(s) gave {len(prefixes)} common prefix(es) and {len(keys)} key(s) "
            f"(want {len(want_prefixes)} and {len(want_keys)}, each once)"
        )
    held = f"{len(want_prefixes)} common prefixes and " if want_prefixes else ""
    if largest > page_size:
        return "warn", (
            f"{what}: {held}{len(want_keys)} keys, complete, but in {len(pages)} page(s) of up to {largest} entries "
            f"where {page_size} were asked for (the page size is ignored)"
        )
    return "pass", f"{what}: {held}{len(want_keys)} keys, complete and each once in {len(pages)} pages of {page_size}"


async def azure_committed_blocks(io: Engine, path: str) -> int:
    """
    :param io: The store's engine (Azure).
    :param path: ``container/blob``.
    :returns: How many committed blocks the blob is made of (0 for a blob written in one Put Blob).
    """
    return await _on_engine(io, _committed_blocks, *path.split("/", 1))


async def _committed_blocks(fs: Any, container: str, blob: str) -> int:
    async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
        committed, _ = await client.get_block_list("committed")
        return len(committed)


async def azure_conditional_commit(io: Engine, path: str) -> tuple[Verdict, str, str]:
    """
    On an existing blob, stage a block and commit it with ``If-None-Match: *``: what the Azure SDK sends last for an
    exclusive create above its single-put size (``upload_blob(overwrite=False)``, the store's ``put_exclusive``).

    :param io: The store's engine (Azure).
    :param path: ``container/blob`` of an existing blob holding ``b"original"``.
    :returns: The verdict, the detail and the finding (``refused`` or ``ignored``).
    """
    return await _on_engine(io, _conditional_commit, *path.split("/", 1))


async def _conditional_commit(fs: Any, container: str, blob: str) -> tuple[Verdict, str, str]:
    exceptions = importlib.import_module("azure.core.exceptions")
    missing = importlib.import_module("azure.core").MatchConditions.IfMissing
    block = base64.b64encode(b"doctor-0").decode()
    async with fs.service_client.get_blob_client(container=container, blob=blob) as client:
        await client.stage_block(block, b"new")
        try:
            await client.commit_block_list([block], match_condition=missing)  # If-None-Match: *
        except (exceptions.ResourceExistsError, exceptions.ResourceModifiedError) as error:
            status = getattr(error, "status_code", None)
            return (
                "pass",
                f"Put Block List with If-None-Match: * on an existing blob: refused ({status}), so an exclusive "
                "create sent as staged blocks is enforced too",
                "refused",
            )
        now = await (await client.download_blob()).readall()
    what = "overwrote the existing blob" if now == b"new" else "was accepted"
    single = AZURE_SINGLE_PUT_BYTES
    with contextlib.suppress(AttributeError):
        single = int(fs.service_client._config.max_single_put_size)
    return (
        "warn",
        f"Put Block List with If-None-Match: * {what}: an exclusive create above {single // 2**20} MiB (staged "
        "blocks) would not be refused here; coordination documents are far smaller, single Put Blob requests, "
        "refused as they must be (the exclusive-create check)",
        "ignored",
    )


async def gcs_conditional_resumable(io: Engine, path: str) -> tuple[Verdict, str, str]:
    """
    On an existing object, a resumable upload started with ``ifGenerationMatch=0``: what gcsfs sends for an exclusive
    create of its chunk size or more (``_pipe_file(mode="create")``, the store's ``put_exclusive``).

    :param io: The store's engine (GCS).
    :param path: ``bucket/key`` of an existing object holding ``b"original"``.
    :returns: The verdict, the detail and the finding (``refused`` or ``ignored``).
    """
    return await _on_engine(io, _conditional_resumable, *path.split("/", 1))


async def _conditional_resumable(fs: Any, bucket: str, key: str) -> tuple[Verdict, str, str]:
    gcsfs_core = importlib.import_module("gcsfs.core")
    content_type = "application/octet-stream"
    try:
        location = await gcsfs_core.initiate_upload(fs, bucket, key, content_type, None, mode="create")
    except FileExistsError:
        return (
            "pass",
            "a resumable upload with ifGenerationMatch=0 on an existing object: refused at its start",
            "refused",
        )
    try:
        await gcsfs_core.upload_chunk(fs, location, b"new", 0, 3, content_type)
    except FileExistsError:
        return "pass", "a resumable upload with ifGenerationMatch=0 on an existing object: refused (412)", "refused"
    except BaseException:
        with contextlib.suppress(Exception):  # as gcsfs does: cancel the upload it started
            await fs._call("DELETE", location.replace("&ifGenerationMatch=0", ""))
        raise
    finally:
        fs.invalidate_cache(f"{bucket}/{key}")
    now = await fs._cat_file(f"{bucket}/{key}")
    what = "overwrote the existing object" if now == b"new" else "was accepted"
    chunk = _gcs_chunk(fs)
    return (
        "warn",
        f"a resumable upload with ifGenerationMatch=0 {what}: an exclusive create of {chunk // 2**20} MiB or more "
        "(gcsfs sends it so) would not be refused here; coordination documents are far smaller, simple uploads, "
        "refused as they must be (the exclusive-create check)",
        "ignored",
    )


def cloud_of_url(url: str) -> Cloud | None:
    """
    Which cloud store a URL names, whichever engine serves it.

    :param url: The store's URL.
    :returns: ``"azure"`` (``az://``, ``abfs://``, ``abfss://``), ``"gcs"`` (``gs://``, ``gcs://``), or None.
    """
    protocol = (split_protocol(url)[0] or "").lower()
    if protocol in AZURE_PROTOCOLS:
        return "azure"
    return "gcs" if protocol in GCS_PROTOCOLS else None


_KEY_NAMES = {"azure": "customer-provided key", "gcs": "customer-supplied key"}
_AZURITE_ACCOUNT = "devstoreaccount1"
"""The development account Azurite (and the Azure Storage Emulator before it) serves, named in its endpoint."""


def keys_ignored(cloud: Cloud, location: str, returned: list[str]) -> str:
    """
    The sentence for a store that returned a blob or object written with a tenant's key to a read without that key.

    :param cloud: The store's cloud.
    :param location: The store as `stores.async_fsspec_io.cloud_location` names it (container or bucket and endpoint).
    :param returned: How it was read and still returned (``"without a key"``, ``"with another tenant's key"``).
    :returns: One sentence naming who ignores the keys: Azurite when its development account is the endpoint's, else
        the account or endpoint.
    """
    what = "a blob" if cloud == "azure" else "an object"
    who = "this endpoint"
    if cloud == "azure":
        who = "Azurite" if _AZURITE_ACCOUNT in location else "this account"
    key = _KEY_NAMES[cloud]
    return (
        f"{what} written with a tenant's {key} was returned {' and '.join(returned)} ({location}): {who} ignores {key}s"
    )


def credentials_ignored(cloud: Cloud | None, location: str, allowed: list[str]) -> str:
    """
    The sentence for a store that let one tenant's credentials reach another tenant's objects.

    :param cloud: The store's cloud, or None for S3.
    :param location: Where the store is (a cloud store's `cloud_location`; the store URL on S3).
    :param allowed: The attempts the store allowed (``read``, ``overwrite``, ``list``, ``delete``).
    :returns: One sentence.
    """
    reached = ", ".join(allowed)
    if cloud == "gcs":
        return (
            f"a tenant's downscoped token reached another tenant's objects ({reached}) at {location}: this endpoint "
            "does not enforce Credential Access Boundaries"
        )
    if cloud == "azure":  # the only credentials per tenant an Azure store takes: `DirectorySasCredentials`
        return (
            f"a tenant's directory SAS reached another tenant's blobs ({reached}) at {location}: this account does not "
            "confine a directory SAS (sr=d) to its directory"
        )
    return (
        f"a tenant's credentials reached another tenant's objects ({reached}): the role's session policy is not "
        "enforced"
    )


def credentials_unusable(cloud: Cloud | None, location: str, error: BaseException) -> str:
    """
    The sentence for credentials per tenant that failed on the tenant's own object, before another tenant's was tried:
    an Azure account without a hierarchical namespace (its directory SAS refused before any is made), the worker's
    credentials refused a user delegation key or a token exchange, a tenant's own write refused.

    :param cloud: The store's cloud, or None for S3.
    :param location: Where the store is (a cloud store's `cloud_location`; the store URL on S3).
    :param error: What the tenant's own write raised.
    :returns: One sentence, the error's message whole.
    """
    what = {"azure": "a tenant's directory SAS", "gcs": "a tenant's downscoped token"}.get(
        cloud or "", "a tenant's credentials"
    )
    whose = "blob" if cloud == "azure" else "object"
    reason = " ".join(str(error).split()) or "no message"
    return (
        f"{what} could not write the tenant's own {whose} at {location}, so another tenant's was not tried: "
        f"{type(error).__name__}: {reason}"
    )


def not_applicable(check: str, url: str, cloud: Cloud | None) -> str:
    """
    Why a check has no meaning on a store, or (``tenant-isolation`` on Azure and GCS) was not configured, worded for
    the store.

    :param check: ``list-delimiter``, ``multipart-write``, ``conditional-multipart`` or ``tenant-isolation``.
    :param url: The store's URL.
    :param cloud: Its cloud, if Azure or GCS.
    :returns: One sentence naming the store, what it lacks and why the check cannot apply.
    """
    if cloud == "gcs" and check == "tenant-isolation":
        return (
            f"{_NAMES[cloud]}: no keys or credentials per tenant configured (customer-supplied keys: encryption="
            "TenantKeys, doctor's --sse-c-master-key-env; downscoped credentials per tenant prefix: credentials="
            "DownscopedCredentials, doctor's --downscoped-credentials): this run cannot tell whether the store itself "
            "keeps tenants apart; without them, tenants are kept apart by prefixes and reference checks alone"
        )
    if cloud is not None and check == "tenant-isolation":
        return (
            f"{_NAMES[cloud]}: no keys or credentials per tenant configured (customer-provided keys: encryption="
            "TenantKeys, doctor's --sse-c-master-key-env; a directory SAS per tenant: credentials="
            "DirectorySasCredentials, doctor's --directory-sas, on an account with a hierarchical namespace): this run "
            "cannot tell whether the store itself keeps tenants apart; without them, tenants are kept apart by "
            "prefixes and reference checks alone"
        )
    protocol = split_protocol(url)[0] or "file"
    store = "memory://" if protocol == "memory" else "local disk" if protocol in {"file", "local"} else f"{protocol}://"
    reasons = {
        "list-delimiter": "lists a directory whole: it has no listing pages and no common prefixes to check",
        "multipart-write": "has no multipart or block upload: a large write is written whole "
        "(on local disk, streamed to a temporary file renamed into place)",
        "conditional-multipart": "has no multipart or block upload whose completion could ignore a condition: "
        "its exclusive creates are single writes (the exclusive-create check)",
        "tenant-isolation": "has no credentials or keys per tenant: tenants are kept apart by prefixes and "
        "reference checks alone",
    }
    return f"{store} {reasons[check]}"
