"""Whether a backend refuses a second exclusive create: probed once per process and backend, before coordinating."""

from __future__ import annotations

import contextlib
import secrets
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from haystack_integrations.offload.errors import ExclusiveCreatesUnsupportedError, StorageUnavailableError
from haystack_integrations.offload.stores.failures import no_answer_cause, status_of, transient_cause
from haystack_integrations.offload.stores.io import Requests
from haystack_integrations.offload.stores.names import new_temporary_name
from haystack_integrations.offload.stores.options import redacted_url
from haystack_integrations.offload.stores.translate import storage_errors

if TYPE_CHECKING:
    from haystack_integrations.offload.stores.fsspec_store import FsspecToolResultStore

Verdict = Literal["enforced", "ignored", "unsupported", "unknown"]


@dataclass(frozen=True, slots=True)
class ExclusiveCreateCheck:
    """
    What a backend did with two exclusive creates of one key.

    :param verdict: ``"enforced"`` (the second was refused: coordination is safe), ``"ignored"`` (both landed),
        ``"unsupported"`` (conditional writes refused, e.g. 501), or ``"unknown"`` (the probe failed transiently:
        check again).
    :param store: The checked store: root URL, engine and endpoint.
    :param detail: What happened, in a sentence.
    """

    verdict: Verdict
    store: str
    detail: str
    reached: bool = True
    """False when no answer came at all (`failures.no_answer_cause`): the store could not be reached."""

    @property
    def enforced(self) -> bool:
        """Whether claims, decisions and turns can be made exactly once on this backend."""
        return self.verdict == "enforced"

    def require(self) -> None:
        """
        Raise unless the backend enforces exclusive creates.

        :raises ExclusiveCreatesUnsupportedError: If it ignores or refuses them.
        :raises StorageUnavailableError: If the check could not tell (retryable).
        """
        if self.verdict == "unknown":
            raise StorageUnavailableError(
                f"Could not check that {self.store} refuses a second exclusive create ({self.detail}); retry."
            )
        if self.verdict != "enforced":
            raise ExclusiveCreatesUnsupportedError(
                f"{self.store} {self.detail}: approvals, claims and turns need an object store that refuses a second "
                "exclusive create (S3 If-None-Match: *), so none is coordinated on it. Offloading results still works.",
                store=self.store,
                reason=self.detail,
            )


_CHECKED: dict[tuple[str, ...], ExclusiveCreateCheck] = {}
_CHECKED_LOCK = threading.Lock()


def checked(backend: tuple[str, ...]) -> ExclusiveCreateCheck | None:
    """
    :param backend: What identifies a backend: engine, protocol, endpoint, bucket.
    :returns: The definite verdict this process already has for it, or None.
    """
    with _CHECKED_LOCK:
        return _CHECKED.get(backend)


def forget_checks() -> None:
    """Drop every verdict this process holds, so the next coordinated create probes again (e.g. between tests)."""
    with _CHECKED_LOCK:
        _CHECKED.clear()


async def check_exclusive_creates(
    request: Requests, directory: str, *, backend: tuple[str, ...], store: str
) -> ExclusiveCreateCheck:
    """
    Create one probe key twice, exclusively, and see whether the second is refused; cache a definite verdict.

    The probe is a temporary-file name inside `directory` (so a principal scoped to it may write it, and listings,
    usage and quotas skip it) and is deleted after.

    :param request: How the store sends an engine call (retried).
    :param directory: Where the probe goes: the checking store's scope.
    :param backend: The cache key (see `checked`).
    :param store: How messages name the store.
    :returns: The verdict.
    :raises StoragePermissionError: If the backend refused to let the probe be written.
    :raises StorageError: If it failed for a reason that is neither transient nor about conditional writes.
    """
    path = f"{directory}/{new_temporary_name()}"
    reached = True
    try:
        verdict, detail, reached = await _probe(request, path)
    finally:
        # Where nothing answered, a delete would only wait out another timeout (doctor took a minute on a silent
        # endpoint); a probe that did land is a temporary name, which purges clear once stale.
        if reached:
            with contextlib.suppress(Exception):
                await request("delete", path, lambda io: io.delete_async([path]))
    check = ExclusiveCreateCheck(verdict, store, detail, reached)
    if verdict != "unknown":
        with _CHECKED_LOCK:
            _CHECKED[backend] = check
    return check


async def _probe(request: Requests, path: str) -> tuple[Verdict, str, bool]:
    first, second = secrets.token_hex(16).encode(), secrets.token_hex(16).encode()
    with storage_errors("check exclusive creates", reference=None):
        try:
            await _create(request, path, first)
            try:
                await request("put_exclusive", path, lambda io: io.put_exclusive_async(path, second))
            except FileExistsError:
                # Refused; a retried first create of ours must not be mistaken for the second landing.
                if await request("get", path, lambda io: io.get_async(path)) == first:
                    return "enforced", "refuses a second exclusive create", True
                return "ignored", "replaced an exclusively created object, then refused", True
            return "ignored", "accepted a second exclusive create of the same key (it ignores If-None-Match)", True
        except Exception as error:
            if status_of(error) == 501 or isinstance(error, NotImplementedError):
                return "unsupported", "answered 501 Not Implemented to a conditional write (If-None-Match)", True
            if isinstance(error, StorageUnavailableError) or transient_cause(error) is not None:
                no_answer = no_answer_cause(error)
                cause = transient_cause(error) or no_answer or "storage unavailable"
                return "unknown", f"the probe failed: {cause}", no_answer is None
            raise


async def _create(request: Requests, path: str, data: bytes) -> None:
    try:
        await request("put_exclusive", path, lambda io: io.put_exclusive_async(path, data))
    except FileExistsError:
        # A fresh random name cannot exist unless this very create landed and its answer was lost.
        if await request("get", path, lambda io: io.get_async(path)) != data:
            raise StorageUnavailableError("The probe's fresh key was already taken by another writer.") from None


async def store_exclusive_creates_async(store: FsspecToolResultStore, *, refresh: bool) -> ExclusiveCreateCheck:
    """`FsspecToolResultStore.check_exclusive_creates_async` (see there)."""
    backend = store._handle.backend_key()
    known = None if refresh else checked(backend)
    if known is not None:
        return known
    endpoint = backend[2]
    described = (
        f"The object store {redacted_url(store.url)!r} (engine {store.resolved_engine!r}"
        f"{f', endpoint {endpoint}' if endpoint else ''})"
    )
    if not (await store._handle.io_async()).remote:
        # Memory and local disk: the exclusive create is this library's own (a lock, a hard link), nothing to ask.
        return ExclusiveCreateCheck("enforced", described, "makes exclusive creates in this process")
    return await check_exclusive_creates(store._handle.request, store._scope_path(), backend=backend, store=described)
