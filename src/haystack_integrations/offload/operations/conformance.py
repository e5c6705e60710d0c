"""
Whether an object store keeps the promises this library relies on: the checks behind ``offload-haystack doctor``.

Every check works below one fresh prefix (``<url>/.doctor/<random>/``), removed at the end, with object read, write,
list and delete permissions only. Each gives ``pass``, ``fail``, ``warn``, ``skipped`` (no meaning on this store, and
why) or ``unknown`` (transient: run again). S3 is checked here, Azure and GCS in their own protocol
(`cloud_conformance`); `ConformanceReport.exit_status` maps the verdicts to the command's exit status.
"""

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from fsspec.core import split_protocol

from haystack_integrations.offload.errors import StorageError, StorageUnavailableError
from haystack_integrations.offload.operations.cloud_conformance import (
    Cloud,
    Verdict,
    azure_committed_blocks,
    azure_conditional_commit,
    cloud_of,
    cloud_of_url,
    cloud_pages,
    credentials_ignored,
    credentials_unusable,
    gcs_conditional_resumable,
    keys_ignored,
    large_write_threshold,
    not_applicable,
    pages_verdict,
)
from haystack_integrations.offload.stores import FsspecToolResultStore
from haystack_integrations.offload.stores.async_fsspec_io import cloud_location
from haystack_integrations.offload.stores.chunks import ContentChunks
from haystack_integrations.offload.stores.failures import StorageRequestError, no_answer_cause, transient_cause
from haystack_integrations.offload.stores.io import MULTIPART_PART_BYTES, MULTIPART_THRESHOLD, Engine, Requests
from haystack_integrations.offload.stores.options import redacted_url
from haystack_integrations.offload.stores.retention import storage_times_async
from haystack_integrations.offload.stores.s3fs_io import S3IO, s3_status
from haystack_integrations.offload.stores.sync_api import run_on_io_loop, run_on_own_loop

__all__ = [
    "EXIT_FAILED",
    "EXIT_PASSED",
    "EXIT_UNKNOWN",
    "CheckResult",
    "ConformanceReport",
    "run_conformance",
    "run_conformance_async",
]

# Verdict ("pass", "fail", "warn", "skipped", "unknown") is defined beside the Azure and GCS checks, which return it.

EXIT_PASSED = 0
"""Every check passed, warned or was skipped."""
EXIT_FAILED = 1
"""At least one check failed (a second exclusive create not refused among them)."""
EXIT_UNKNOWN = 3
"""No check failed, but at least one could not tell (a transient failure): run the doctor again."""
LISTED_OBJECTS = 5
"""Objects the listing check puts: three in sub-prefixes (common prefixes) and two beside them."""
LIST_PAGE = 2
"""Keys per page the listing check asks for, so five objects take several pages."""
_MAX_PAGES = 20
_RANGED = bytes(range(100))
_MULTIPART_BLOCK = 2**20


@dataclass(frozen=True, slots=True)
class CheckResult:
    """
    One check's outcome.

    :param name: The check (``exclusive-create``, ``ranged-read``, ...).
    :param verdict: ``pass``, ``fail``, ``warn``, ``skipped`` or ``unknown``.
    :param detail: What happened, in one line.
    :param finding: The raw answer where one exists (the exclusive create's ``enforced`` / ``ignored`` /
        ``unsupported`` / ``unknown``; the conditional completion's ``refused`` / ``ignored`` / ``unsupported``).
    """

    name: str
    verdict: Verdict
    detail: str
    finding: str | None = None


@dataclass(frozen=True)
class ConformanceReport:
    """
    What the doctor found on one store.

    :param store: The store URL checked.
    :param engine: ``fsspec`` or ``obstore``.
    :param prefix: The unique prefix the checks worked under (removed after).
    :param checks: The outcomes, in the order run; the last is ``cleanup``.
    """

    store: str
    engine: str
    prefix: str
    checks: tuple[CheckResult, ...] = field(default=())

    @property
    def exit_status(self) -> int:
        """`EXIT_FAILED` if any check failed, else `EXIT_UNKNOWN` if any could not tell, else `EXIT_PASSED`."""
        verdicts = {check.verdict for check in self.checks}
        if "fail" in verdicts:
            return EXIT_FAILED
        return EXIT_UNKNOWN if "unknown" in verdicts else EXIT_PASSED

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``ok``: the exit status is `EXIT_PASSED`)."""
        return {
            "store": self.store,
            "engine": self.engine,
            "prefix": self.prefix,
            "ok": self.exit_status == EXIT_PASSED,
            "exit_status": self.exit_status,
            "checks": [asdict(check) for check in self.checks],
        }


@dataclass(frozen=True)
class _NoAnswer:
    """A check that ended without any answer from the store: its result, and why no answer came."""

    result: CheckResult
    cause: str


CHECK_NAMES = (
    "exclusive-create",
    "ranged-read",
    "list-delimiter",
    "batch-delete",
    "multipart-write",
    "conditional-multipart",
    "tenant-isolation",
    "cleanup",
    "leftovers",
)
"""The checks, in the order they run."""
DOCTOR_DIRECTORY = ".doctor"
"""Where each run works, below the root: ``<root>/.doctor/<random>/``."""
LEFTOVER_AGE = timedelta(minutes=15)
"""How old what another run wrote must be to count as a killed run's leftovers (a run ends in a few minutes at most)."""

OnCheck = Callable[[CheckResult], None]


def run_conformance(
    root: FsspecToolResultStore, *, on_check: OnCheck | None = None, leftover_age: timedelta = LEFTOVER_AGE
) -> ConformanceReport:
    """
    Run every check against the store `root` is rooted at, below a fresh prefix, and remove what they wrote.

    A check that gets no answer at all (`stores.failures.no_answer_cause`) ends the run: the checks after it are
    ``skipped``, as each would wait as long again.

    :param root: An unscoped store; its URL, storage options, engine and retry policy are used.
    :param on_check: Called with each check's result as soon as it is known (a command prints it as it runs).
    :param leftover_age: How old, by the storage's clock, what other runs wrote must be to be removed as a killed
        run's leftovers (the last check); a run still under way is younger.
    :returns: The report.
    """
    probe = _probe_store(root)
    io = probe._handle.io()
    if io.uses_worker_threads or not io.remote:
        return run_on_own_loop(_run_all, root, probe, on_check, leftover_age)
    return run_on_io_loop(_run_all, root, probe, on_check, leftover_age)


async def run_conformance_async(
    root: FsspecToolResultStore, *, on_check: OnCheck | None = None, leftover_age: timedelta = LEFTOVER_AGE
) -> ConformanceReport:
    """
    Async `run_conformance` (S3 through s3fs: call it on fsspec's I/O loop, or use `run_conformance`).

    :param root: An unscoped store.
    :param on_check: Called with each check's result as soon as it is known.
    :param leftover_age: As for `run_conformance`.
    :returns: The report.
    """
    return await _run_all(root, _probe_store(root), on_check, leftover_age)


def _probe_store(root: FsspecToolResultStore) -> FsspecToolResultStore:
    if root.scope:
        raise ValueError("The doctor checks a root store; pass the root URL, not a scoped store.")
    url = f"{root.url.rstrip('/')}/{DOCTOR_DIRECTORY}/{secrets.token_hex(6)}"
    return FsspecToolResultStore(url, storage_options=root.storage_options, engine=root.engine, retry=root.retry)


async def _run_all(
    root: FsspecToolResultStore, probe: FsspecToolResultStore, on_check: OnCheck | None, leftover_age: timedelta
) -> ConformanceReport:
    base = probe._handle.root_path()
    io = probe._handle.io()
    request = probe._handle.request
    client = _StoreClient.of(io, probe.resolved_engine, root.url)
    checks: dict[str, Callable[[], Awaitable[tuple[Verdict, str] | CheckResult | _NoAnswer]]] = {
        "exclusive-create": lambda: _exclusive_create(probe),
        "ranged-read": lambda: _ranged_read(request, f"{base}/ranged"),
        "list-delimiter": lambda: _listing(request, client, f"{base}/listing"),
        "batch-delete": lambda: _batch_delete(request, f"{base}/delete"),
        "multipart-write": lambda: _multipart_write(request, client, f"{base}/multipart"),
        "conditional-multipart": lambda: _conditional_multipart(request, client, base),
        "tenant-isolation": lambda: _tenant_isolation(root, probe, client),
        "cleanup": lambda: _cleanup(request, io.fs, client, base),
        "leftovers": lambda: _leftovers(request, io.fs, client, base, leftover_age),
    }
    results: list[CheckResult] = []
    unreachable: str | None = None

    async def run(name: str) -> None:
        nonlocal unreachable
        if unreachable is not None:
            result = CheckResult(name, "skipped", f"not run: {unreachable}")
        else:
            result, no_answer = await _guarded(name, checks[name])
            if no_answer is not None:
                unreachable = f"{name} could not reach the store ({no_answer})"
        results.append(result)
        if on_check is not None:
            on_check(result)

    try:
        for name in CHECK_NAMES[:-2]:
            await run(name)
    finally:
        await run("cleanup")  # also after an interruption: remove what the checks wrote
    await run("leftovers")
    return ConformanceReport(redacted_url(root.url), root.resolved_engine, redacted_url(probe.url), tuple(results))


async def _guarded(
    name: str, check: Callable[[], Awaitable[tuple[Verdict, str] | CheckResult | _NoAnswer]]
) -> tuple[CheckResult, str | None]:
    """
    Run one check; a transient failure is ``unknown``, any other error a ``fail`` naming it. Also returns the cause
    when no answer came at all (the store could not be reached), else None.
    """
    try:
        outcome = await check()
    except Exception as error:
        cause = transient_cause(error)
        if isinstance(error, StorageUnavailableError) or cause is not None:
            no_answer = no_answer_cause(error)
            return CheckResult(name, "unknown", f"transient failure, run again: {cause or error}"), no_answer
        return CheckResult(name, "fail", f"{type(error).__name__}: {_first_line(error)}"), None
    if isinstance(outcome, _NoAnswer):
        return outcome.result, outcome.cause
    if isinstance(outcome, CheckResult):
        return outcome, None
    return CheckResult(name, *outcome), None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__


@dataclass(frozen=True)
class _StoreClient:
    """
    The client behind a store's I/O, for the checks that speak the store's protocol directly: S3's (`kind`), Azure's
    or GCS's (`cloud`, through `io`), or neither (local disk, memory: both None).
    """

    kind: Literal["s3fs", "obstore"] | None
    url: str
    fs: Any = None
    obstore_settings: Any = None
    cloud: Cloud | None = None
    io: Engine | None = None
    # The obstore engine on Azure: the store writes through obstore (its own block sizes), the checks that speak
    # Azure's protocol go through adlfs (`io`).
    obstore_writes: bool = False

    @classmethod
    def of(cls, io: Engine, engine: str, url: str) -> "_StoreClient":
        if isinstance(io, S3IO):
            return cls("s3fs", url, fs=io.fs)
        if engine == "obstore" and getattr(io, "azure_settings", None) is not None:
            # obstore on Azure: the checks that speak Azure's protocol go through its adlfs fallback (None without
            # adlfs: those checks are then skipped as not applicable).
            made = getattr(io, "fallback", None)
            fallback = made() if callable(made) else None
            cloud = cloud_of(fallback) if fallback is not None else None
            return cls(None, url, fs=getattr(fallback, "fs", None), cloud=cloud, io=fallback, obstore_writes=True)
        if engine == "obstore":
            return cls("obstore", url, obstore_settings=getattr(io, "settings", None))
        return cls(None, url, fs=io.fs, cloud=cloud_of(io), io=io)

    @property
    def keeps_directories(self) -> bool:
        """Whether the store is a filesystem that keeps the directories its objects were in (local disk, memory)."""
        return self.kind is None and self.cloud is None

    def not_applicable(self, check: str) -> str:
        """Why `check` has no meaning on this store (not S3): which store lacks what."""
        return not_applicable(check, self.url, self.cloud)

    def s3_store(self, bucket: str) -> Any:
        from obstore.store import S3Store

        settings = self.obstore_settings
        return S3Store(
            bucket,
            config=settings.config,
            client_options=settings.client_options,
            retry_config=settings.retry_config,
            credential_provider=settings.credential_provider,
        )


# A store that ignores or refuses conditional creates fails: approvals, claims and turns are refused on it.
_EXCLUSIVE: dict[str, Verdict] = {"enforced": "pass", "ignored": "fail", "unsupported": "fail", "unknown": "unknown"}


async def _exclusive_create(probe: FsspecToolResultStore) -> CheckResult | _NoAnswer:
    check = await probe.check_exclusive_creates_async(refresh=True)
    result = CheckResult("exclusive-create", _EXCLUSIVE[check.verdict], check.detail, finding=check.verdict)
    return result if check.reached else _NoAnswer(result, check.detail.removeprefix("the probe failed: "))


async def _ranged_read(request: Requests, path: str) -> tuple[Verdict, str]:
    await request("put", path, lambda io: io.put_async(path, _RANGED))
    data, size = await request("get_range_and_size", path, lambda io: io.get_range_and_size_async(path, 10, 20))
    if (data, size) != (_RANGED[10:20], len(_RANGED)):
        return "fail", f"bytes 10-19 of a 100-byte object came back as {len(data)} byte(s) of size {size}"
    past, size_past = await request("get_range_and_size", path, lambda io: io.get_range_and_size_async(path, 200, 210))
    if past or size_past != len(_RANGED):
        return "fail", f"a range past the end gave {len(past)} byte(s) and size {size_past} (want none, and 100)"
    return "pass", "a ranged read returns the bytes and the total size; past the end, the size and no bytes"


async def _listing(request: Requests, client: _StoreClient, base: str) -> tuple[Verdict, str]:
    if client.kind is None and client.cloud is None:
        return "skipped", client.not_applicable("list-delimiter")
    folders = [f"d{number}" for number in range(LISTED_OBJECTS - 2)]
    files = [f"f{number}" for number in range(2)]
    for name in [f"{folder}/object" for folder in folders] + files:
        await _put(request, f"{base}/{name}", b"x")
    if client.cloud is not None and client.io is not None:
        return await _cloud_listing(client.io, client.cloud, base, folders, files)
    bucket, _, key = base.partition("/")
    prefix = f"{key}/"
    if client.kind == "s3fs":
        prefixes, keys, pages, oversized = await _s3fs_pages(client.fs, bucket, prefix)
        how = f"in {pages} page(s) of at most {LIST_PAGE}"
    else:
        import obstore

        found = await obstore.list_with_delimiter_async(client.s3_store(bucket), key)
        prefixes = [f"{name.rstrip('/')}/" for name in found["common_prefixes"]]
        keys = [meta["path"] for meta in found["objects"]]
        oversized, how = False, "in the server's pages (obstore sets no max-keys: small pages are not exercised)"
    want_prefixes, want_keys = sorted(f"{prefix}{folder}/" for folder in folders), sorted(prefix + f for f in files)
    if sorted(prefixes) != want_prefixes or sorted(keys) != want_keys:
        return "fail", (
            f"a delimited listing {how} gave {len(prefixes)} common prefix(es) and {len(keys)} key(s) "
            f"(want {len(folders)} and {len(files)}, each once)"
        )
    if oversized:
        return "warn", f"complete, but a page held more than the {LIST_PAGE} keys asked for (MaxKeys ignored)"
    return "pass", f"{len(folders)} common prefixes and {len(files)} keys, complete and each once {how}"


async def _cloud_listing(
    io: Engine, cloud: Cloud, base: str, folders: list[str], files: list[str]
) -> tuple[Verdict, str]:
    # The delimited listing (common prefixes), then every key below without a delimiter: the listing the store's own
    # find sends on Azure and GCS (adlfs and gcsfs page it), each in pages of LIST_PAGE.
    prefix = f"{base.partition('/')[2]}/"
    want_prefixes = [f"{prefix}{folder}/" for folder in folders]
    delimited = await cloud_pages(io, cloud, base, delimiter=True, page_size=LIST_PAGE)
    first = pages_verdict(delimited, want_prefixes, [prefix + name for name in files], LIST_PAGE, "delimited")
    every_key = [f"{prefix}{folder}/object" for folder in folders] + [prefix + name for name in files]
    flat = await cloud_pages(io, cloud, base, delimiter=False, page_size=LIST_PAGE)
    second = pages_verdict(flat, [], every_key, LIST_PAGE, "without a delimiter")
    verdicts = {first[0], second[0]}
    verdict: Verdict = "fail" if "fail" in verdicts else "warn" if "warn" in verdicts else "pass"
    return verdict, f"{first[1]}; {second[1]}"


async def _s3fs_pages(fs: Any, bucket: str, prefix: str) -> tuple[list[str], list[str], int, bool]:
    prefixes: list[str] = []
    keys: list[str] = []
    token: str | None = None
    oversized = False
    for page in range(1, _MAX_PAGES + 1):
        extra = {"ContinuationToken": token} if token else {}
        answer = await fs._call_s3(
            "list_objects_v2", Bucket=bucket, Prefix=prefix, Delimiter="/", MaxKeys=LIST_PAGE, **extra
        )
        page_prefixes = [entry["Prefix"] for entry in answer.get("CommonPrefixes") or []]
        page_keys = [entry["Key"] for entry in answer.get("Contents") or []]
        oversized = oversized or len(page_prefixes) + len(page_keys) > LIST_PAGE
        prefixes += page_prefixes
        keys += page_keys
        token = answer.get("NextContinuationToken")
        if not answer.get("IsTruncated"):
            return prefixes, keys, page, oversized
        if not token:
            raise OSError("a truncated listing page carried no continuation token")
    raise OSError(f"the listing did not end within {_MAX_PAGES} pages of {LIST_PAGE} for {LISTED_OBJECTS} objects")


async def _batch_delete(request: Requests, base: str) -> tuple[Verdict, str]:
    present, missing = f"{base}/present", f"{base}/missing"
    await request("put", present, lambda io: io.put_async(present, b"x"))
    await request("delete", present, lambda io: io.delete_async([present, missing]))
    if await request("find", base, lambda io: io.find_async(base)):
        return "fail", "a batch delete of one existing and one missing key left the existing one in place"
    return "pass", "a batch delete of one existing and one missing key: no error, and the existing one is gone"


def _multipart_content(threshold: int) -> Iterator[bytes]:
    # Block n is filled with n (mod 256), so a part stored out of order or twice shows up in the bytes read back.
    for block in range(threshold // _MULTIPART_BLOCK + 1):
        yield bytes([block % 256]) * _MULTIPART_BLOCK


async def _multipart_write(request: Requests, client: _StoreClient, path: str) -> tuple[Verdict, str]:
    """
    Write content just above the size where the store's write stops being one request, through the store's own
    write, and read it back: S3 multipart (our threshold), Azure staged blocks (the SDK's single-put limit), GCS
    resumable upload (gcsfs's chunk size).
    """
    if client.kind is None and client.cloud is None:
        return "skipped", client.not_applicable("multipart-write")
    threshold, piece = MULTIPART_THRESHOLD, MULTIPART_PART_BYTES
    if client.cloud is not None and client.io is not None and not client.obstore_writes:
        threshold, piece = large_write_threshold(client.io, client.cloud)
    content = ContentChunks(b"".join(_multipart_content(threshold)), chunk_chars=_MULTIPART_BLOCK)
    total = content.nbytes
    await _put_chunks(request, path, content)
    del content
    size = await request("size", path, lambda io: io.size_async(path))
    what = {None: "a multipart write", "azure": "a staged-block write", "gcs": "a resumable upload"}[client.cloud]
    if size != total:
        return "fail", f"{what} of {total:,} bytes reads back as {size:,}"
    blocks = total // _MULTIPART_BLOCK
    for block in (0, blocks // 2, blocks - 1):
        data = await _read(request, path, block * _MULTIPART_BLOCK, block * _MULTIPART_BLOCK + 4)
        if data != bytes([block % 256]) * 4:
            return "fail", f"{what} of {total:,} bytes reads back wrong at MiB {block}"
    pieces = -(-total // piece)
    if client.cloud == "azure" and client.io is not None:
        committed = await azure_committed_blocks(client.io, path)
        if committed <= 1:
            return "warn", (
                f"a write of {total // 2**20} MiB reads back, but as {committed} committed block(s): the Azure "
                f"client did not stage blocks above its {threshold // 2**20} MiB single-put size"
            )
        limit = "the obstore engine's" if client.obstore_writes else "the Azure SDK's"
        return "pass", (
            f"{what} of {total // 2**20} MiB (above {limit} {threshold // 2**20} MiB single-put size) "
            f"reads back, committed as {committed} blocks of up to {piece // 2**20} MiB"
        )
    if client.cloud == "gcs":
        return "pass", (
            f"{what} of {total // 2**20} MiB (above gcsfs's {threshold // 2**20} MiB chunk size: {pieces} chunks) "
            "reads back"
        )
    return "pass", f"{what} of {total // 2**20} MiB (above {threshold // 2**20} MiB) reads back"


async def _put(request: Requests, path: str, data: bytes) -> None:
    await request("put", path, lambda io: io.put_async(path, data))


async def _put_chunks(request: Requests, path: str, content: ContentChunks) -> None:
    await request("put", path, lambda io: io.put_chunks_async(path, content))


async def _read(request: Requests, path: str, start: int, end: int) -> bytes:
    return (await request("get_range_and_size", path, lambda io: io.get_range_and_size_async(path, start, end)))[0]


async def _conditional_multipart(request: Requests, client: _StoreClient, base: str) -> CheckResult:
    name = "conditional-multipart"
    if client.cloud is not None and client.io is not None:
        path = f"{base}/conditional"
        await request("put", path, lambda io: io.put_async(path, b"original"))
        conditional = azure_conditional_commit if client.cloud == "azure" else gcs_conditional_resumable
        return CheckResult(name, *await conditional(client.io, path))
    if client.kind is None:
        return CheckResult(name, "skipped", client.not_applicable(name))
    if client.kind == "obstore":
        return CheckResult(
            name,
            "skipped",
            "obstore cannot send a conditional CompleteMultipartUpload (and its exclusive creates are single PUTs); "
            "run with --engine fsspec to check the server",
        )
    path = f"{base}/conditional"
    await request("put", path, lambda io: io.put_async(path, b"original"))
    fs = client.fs
    bucket, _, key = path.partition("/")
    upload = (await fs._call_s3("create_multipart_upload", Bucket=bucket, Key=key))["UploadId"]
    completed = False
    try:
        part = await fs._call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"new")
        parts = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
        try:
            await fs._call_s3(
                "complete_multipart_upload",
                Bucket=bucket,
                Key=key,
                UploadId=upload,
                MultipartUpload=parts,
                IfNoneMatch="*",
            )
        except Exception as error:
            return _refused_completion(name, error)
        completed = True
    finally:
        if not completed:
            with contextlib.suppress(Exception):
                await fs._call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload)
        fs.invalidate_cache(path)
    now = await request("get", path, lambda io: io.get_async(path))
    what = "overwrote the existing object" if now == b"new" else "was accepted"
    return CheckResult(
        name,
        "warn",
        f"CompleteMultipartUpload with If-None-Match: * {what} (as Ceph RGW does); this library writes coordination "
        "documents as single PUTs only, so coordination is unaffected",
        finding="ignored",
    )


def _refused_completion(name: str, error: Exception) -> CheckResult:
    status = s3_status(error)
    if status == 412 or isinstance(error, FileExistsError):
        return CheckResult(
            name, "pass", "CompleteMultipartUpload with If-None-Match: * on an existing key: refused (412)", "refused"
        )
    if status == 501 or isinstance(error, NotImplementedError):
        return CheckResult(
            name,
            "warn",
            "CompleteMultipartUpload with If-None-Match: * answered 501 (not supported); coordination is unaffected",
            finding="unsupported",
        )
    raise error


ISOLATION_TENANTS = ("doctor-tenant-a", "doctor-tenant-b")
"""The two tenants the isolation check writes as, below the run's prefix."""


async def _tenant_isolation(
    root: FsspecToolResultStore, probe: FsspecToolResultStore, client: _StoreClient
) -> tuple[Verdict, str]:
    if client.kind is None and cloud_of_url(root.url) is None:  # local disk, memory: no keys or credentials to give
        return "skipped", client.not_applicable("tenant-isolation")
    return await tenant_isolation(root, probe)


async def tenant_isolation(root: FsspecToolResultStore, probe: FsspecToolResultStore) -> tuple[Verdict, str]:
    """
    With credentials per tenant (S3's `AssumeRoleCredentials`, GCS's `DownscopedCredentials`, Azure's
    `DirectorySasCredentials`): one tenant's client is refused another tenant's objects (read, overwrite, list, delete)
    by the store itself, the scope check bypassed; credentials that fail on the tenant's own object (an Azure account
    without a hierarchical namespace) fail the check, saying why.
    With keys per tenant (`TenantKeys`: S3's SSE-C, GCS's customer-supplied, Azure's customer-provided keys): an object
    written with a tenant's key is refused to a read without a key and to one with another tenant's key. Each is
    checked on its own, so one cannot pass for the other. Skipped without either, saying how to configure them.

    :param root: The root store, with its `credentials` and `encryption`.
    :param probe: The doctor's store below the run's prefix, where the check writes.
    :returns: The verdict and one sentence.
    """
    cloud = cloud_of_url(root.url)
    if root.credentials is None and root.encryption is None:
        if cloud is not None:
            return "skipped", not_applicable("tenant-isolation", root.url, cloud)
        return "skipped", (
            "no credentials or keys per tenant configured (credentials=, encryption=; doctor's --tenant-role-arn, "
            "--sse-c-master-key-env): this run cannot tell whether the store itself keeps tenants apart"
        )
    found = []
    for isolation in ({"credentials": root.credentials}, {"encryption": root.encryption}):
        if next(iter(isolation.values())) is None:
            continue
        store = FsspecToolResultStore(
            f"{probe.url}/isolation",
            storage_options=root.storage_options,
            engine=root.engine,
            retry=None,  # a refusal is the answer looked for: nothing to retry
            **isolation,
        )
        check = _credentials_isolate if "credentials" in isolation else _keys_isolate
        verdict, detail = await check(store, cloud)
        if verdict != "pass":
            return verdict, detail
        found.append(detail)
    return "pass", "; ".join(found)


def _location(store: FsspecToolResultStore, cloud: Cloud | None) -> str:
    """Where a cloud store is, as an operator names it (container or bucket, and endpoint); the URL elsewhere."""
    if cloud is None:
        return redacted_url(store.url)
    protocol = split_protocol(store.url)[0] or ""
    return cloud_location(protocol, store._handle.root_path(), store.storage_options)


async def _credentials_isolate(store: FsspecToolResultStore, cloud: Cloud | None) -> tuple[Verdict, str]:
    base = store._handle.root_path()
    mine, theirs = (store._handle.for_tenant(tenant) for tenant in ISOLATION_TENANTS)
    other = f"{base}/{ISOLATION_TENANTS[1]}/session/object"
    try:
        try:
            await theirs.request("put", other, lambda io: io.put_async(other, b"theirs"))
        except (StorageError, PermissionError, ValueError) as error:
            # The tenant's credentials fail on its own object (an Azure account without a hierarchical namespace, the
            # worker's credentials refused a delegation key or token): a failure of the check, said whole.
            if isinstance(error, StorageUnavailableError) or transient_cause(error) is not None:
                raise
            return "fail", credentials_unusable(cloud, _location(store, cloud), error)
        attempts: dict[str, Callable[[Engine], Awaitable[object]]] = {
            "read": lambda io: io.get_async(other),
            "overwrite": lambda io: io.put_async(other, b"planted"),
            "list": lambda io: io.find_async(other.rpartition("/")[0]),
            "delete": lambda io: io.delete_async([other]),
        }
        allowed = [name for name, call in attempts.items() if not await _refused(mine.request(name, other, call))]
    finally:
        await _remove(store, [other])
    if allowed:
        return "fail", credentials_ignored(cloud, _location(store, cloud), allowed)
    if cloud == "azure":
        return "pass", (
            "a tenant's directory SAS (sr=d) is refused another tenant's blobs (read, overwrite, list, delete)"
        )
    whose = "downscoped token is" if cloud == "gcs" else "credentials are"
    return "pass", f"a tenant's {whose} refused another tenant's objects (read, overwrite, list, delete)"


async def _keys_isolate(store: FsspecToolResultStore, cloud: Cloud | None) -> tuple[Verdict, str]:
    base = store._handle.root_path()
    own = f"{base}/{ISOLATION_TENANTS[0]}/session/object"
    plain = FsspecToolResultStore(store.url, storage_options=store.storage_options, engine=store.engine, retry=None)
    other_key = store._handle.for_tenant(ISOLATION_TENANTS[1])
    # S3 and Ceph RGW answer a read without an SSE-C object's key, or with another, a bare 400; GCS and Azure name the
    # refusal (400 with a CSEK reason, 409 with a CPK error code), which their engines raise as permission errors, so
    # another 400 there is not counted as one.
    bare_400 = cloud is None
    try:
        await store._handle.for_tenant(ISOLATION_TENANTS[0]).request("put", own, lambda io: io.put_async(own, b"m"))
        reads = {"without a key": plain._handle.request, "with another tenant's key": other_key.request}
        returned = [
            how
            for how, request in reads.items()
            if not await _refused(request("get", own, lambda io: io.get_async(own)), bare_400=bare_400)
        ]
    finally:
        await _remove(store, [own])
    if returned and cloud is not None:
        return "fail", keys_ignored(cloud, _location(store, cloud), returned)
    if returned:
        return "fail", (
            f"an object written with a tenant's SSE-C key was returned {' and '.join(returned)}: SSE-C is ignored"
        )
    return "pass", "an object written with a tenant's key is refused without it, and with another tenant's key"


async def _remove(store: FsspecToolResultStore, paths: list[str]) -> None:
    with contextlib.suppress(Exception):  # the cleanup check removes whatever is left
        await store._handle.request("delete", store._handle.root_path(), lambda io: io.delete_async(paths))


async def _refused(attempt: Awaitable[object], *, bare_400: bool = False) -> bool:
    """
    Whether the store refused: a permission error (403, Azure's ``AuthorizationFailure`` and
    ``AuthorizationPermissionMismatch`` among them; a key refused, which the engines raise for GCS's 400 with a CSEK
    reason and Azure's 409 with a CPK error code), or a bare 400 where `bare_400` (S3's answer to a read of an
    SSE-C object without its key). Any other failure is raised; False if the store answered.
    """
    try:
        await attempt
    except PermissionError:
        return True
    except StorageRequestError as error:
        if bare_400 and error.status == 400:
            return True
        raise
    return False


async def _cleanup(request: Requests, fs: Any, client: _StoreClient, base: str) -> tuple[Verdict, str]:
    found = await request("find", base, lambda io: io.find_async(base))
    if found:
        await request("delete", base, lambda io: io.delete_async(list(found)))
    if client.keeps_directories:
        # Local disk and memory keep the directories the objects were in.
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(fs.rm, base, recursive=True)
    left = await request("find", base, lambda io: io.find_async(base))
    if left:
        return "fail", f"{len(left)} object(s) left under {base}/: delete them by hand"
    return "pass", f"removed the {len(found)} object(s) the checks wrote, and their prefix"


async def _leftovers(
    request: Requests, fs: Any, client: _StoreClient, base: str, age: timedelta
) -> tuple[Verdict, str]:
    """Remove what earlier doctor runs that were killed left under the root's doctor directory (older than a run)."""
    runs = base.rpartition("/")[0]
    found = await request("find", runs, lambda io: io.find_async(runs))
    written = await storage_times_async(request, [path for path in found if not path.startswith(base + "/")])
    cutoff = datetime.now(UTC) - age
    # An object the storage cannot date may be a run's under way: kept, as a younger one is.
    stale = [path for path, moment in written.items() if moment is not None and moment < cutoff]
    if stale:
        await request("delete", runs, lambda io: io.delete_async(stale))
    if client.keeps_directories:  # remove the killed runs' directories and, if empty, the parent
        kept = {_run_of(path, runs) for path in written if path not in stale}
        for directory in {_run_of(path, runs) for path in stale} - kept:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(fs.rm, directory, recursive=True)
        with contextlib.suppress(OSError):
            await asyncio.to_thread(fs.rmdir, runs)
    if len(written) > len(stale):
        running = len(written) - len(stale)
        return "pass", f"removed {len(stale)} object(s) left by killed runs; kept {running} object(s) of runs under way"
    return "pass", f"removed {len(stale)} object(s) left by killed runs"


def _run_of(path: str, runs: str) -> str:
    """The run directory an object below `runs` belongs to."""
    return f"{runs}/{path[len(runs) + 1 :].split('/', 1)[0]}"
