"""
Bounded, observable retries of storage calls, done in one layer: this one.

Who retries what. Three layers below a store could each retry, and stacked they multiply: botocore (legacy mode: 5
attempts), s3fs (``_error_wrapper``: 5 attempts, on top of botocore's, so one request can become 25), and aiohttp
(which resends an idempotent request once when its connection drops). A store with a `RetryPolicy` (the default)
therefore turns botocore's and s3fs's retries off for the S3 client it creates, and retries here instead:

- **What**: every storage call of a store on a network backend, its documents and the operator commands (they share
  the store's I/O), when the failure is transient (`transient_cause`): HTTP 500, 502, 503 (SlowDown), 504, 429, 409
  (a conflicting write in flight, such as AWS's ConditionalRequestConflict) and S3's throttling codes, connection
  failures and resets, read timeouts, answers cut short. The status decides; S3's error code refines it. Never a
  missing object, a refused permission, a lost conditional create (412) or a bad request. Never memory or local disk
  either (`retries_can_help`): nothing there fails transiently, so a retry would only repeat a real failure, later.
- **Bounded**: at most `RetryPolicy.attempts` attempts, each cut off after `RetryPolicy.attempt_timeout` seconds, and no
  new attempt after `RetryPolicy.deadline` seconds, with exponential backoff and full jitter (many clients failing
  together do not retry together). The attempt timeout is there because the client's own read timeout is not enough:
  with aiobotocore on aiohttp 3.14, a request whose answer never came was seen, now and then, waiting past botocore's
  ``read_timeout`` until the server closed the connection. aiohttp's one resend on a dropped connection stays (it
  cannot be switched off) and is bounded too: at most two requests per attempt.
- **Observable**: each retry is logged (INFO) and each give-up (WARNING) with the operation, path and cause, and
  counted in `RetryStats` (``store.retry_stats``); giving up raises `StorageUnavailableError`, chained to the last
  backend error, with every attempt's cause in its notes.

Writes are safe to retry: a result's object name (with its random nonce) is chosen once, before the first attempt, and
every attempt PUTs the same bytes to the same name. A write whose first attempt reached S3 but whose answer was lost (a
read timeout, a reset) is simply written again: one object, one reference, `list` shows it once. If every attempt
fails, the write raises and the hook keeps the result in the conversation; an attempt that did land may then leave one
complete, unreferenced object behind (`list` shows it; retention and purges remove it).

Conditional creates (documents, approval claims) are retried like writes, with the same bytes each time. Telling
whether "already exists" was our own earlier transmission (an attempt here, or aiohttp's resend below this layer) is
not done here but by the caller, which reads the document back and compares (`SessionDocuments.create`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from haystack_integrations.offload.errors import StorageUnavailableError
from haystack_integrations.offload.stores.io import AsyncFilesystemIO, Chunk, StorageIO

logger = logging.getLogger(__name__)

T = TypeVar("T")

_TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "OperationAborted",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestTimeout",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequestsException",
        # AWS answers a conditional PUT with 409 while a competing write to the key is in flight, and says to retry.
        "ConditionalRequestConflict",
    }
)
# 409 is transient (a conflicting operation in flight) except for these codes, whose conflict stays until changed.
_LASTING_CONFLICTS = frozenset(
    {"BucketAlreadyExists", "BucketAlreadyOwnedByYou", "BucketNotEmpty", "InvalidBucketState"}
)
# Failures that retrying cannot fix, whatever caused them further down the chain.
_PERMANENT = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError, ValueError)
# fsspec protocols served in this process: no network between the store and its bytes, so no transient failures.
_IN_PROCESS_PROTOCOLS = frozenset({"memory", "file", "local"})


def retries_can_help(io: StorageIO) -> bool:
    """
    Whether retrying `io`'s calls can get past a failure: only when its backend is reached over a network.

    Memory and local disk do not fail transiently; their failures (a full disk, a refused permission) are answers that
    a retry would only repeat, later.

    :param io: The I/O strategy a store would wrap in a `RetryingIO`.
    :returns: ``False`` for an in-process backend (fsspec's ``memory``, ``file`` or ``local`` protocol), else ``True``.
    """
    protocol = io.fs.protocol
    protocols = {protocol} if isinstance(protocol, str) else set(protocol)
    return not protocols <= _IN_PROCESS_PROTOCOLS


class RetryPolicy(BaseModel):
    """
    How a store retries transient storage failures: how often, how long, how far apart.

    ```python
    from haystack_integrations.offload import FsspecToolResultStore, RetryPolicy

    results = FsspecToolResultStore("s3://acme-agent-results/prod", retry=RetryPolicy(attempts=6, deadline=20))
    ```

    Multi-user use: the policy is per root store and its stats are shared by every session store derived from it, so
    ``results.retry_stats`` shows how the whole worker's storage traffic fares. `retry=None` on the store leaves
    retrying to the backend's own defaults (for S3, botocore's and s3fs's stacked retries).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempts: int = Field(default=4, ge=1, le=20, description="Attempts in all, the first included (1: no retry).")
    base_delay: float = Field(default=0.05, ge=0, description="Backoff before the first retry, at most, in seconds.")
    max_delay: float = Field(default=2.0, ge=0, description="Longest backoff between two attempts, in seconds.")
    deadline: float | None = Field(
        default=30.0, gt=0, description="No new attempt starts this many seconds after the first one began."
    )
    attempt_timeout: float | None = Field(
        default=60.0,
        gt=0,
        description="An attempt on a network backend still unanswered after this many seconds is cancelled and counts "
        "as a transient failure. Leave room for your largest transfers.",
    )

    @model_validator(mode="after")
    def _delays_in_order(self) -> RetryPolicy:
        if self.max_delay < self.base_delay:
            raise ValueError("max_delay must not be below base_delay.")
        return self

    def backoff(self, retry: int) -> float:
        """
        Seconds to wait before retry number `retry` (1 for the first): exponential, capped, with full jitter.

        :param retry: Which retry this is, from 1.
        :returns: A random delay between 0 and ``min(max_delay, base_delay * 2 ** (retry - 1))``.
        """
        ceiling = min(self.max_delay, self.base_delay * 2 ** (retry - 1))
        return random.uniform(0, ceiling)  # noqa: S311 - jitter, not cryptography


class RetryStats:
    """
    Counters of one store's retries, shared by every store derived from it; safe to read from any thread.

    ``retries``: attempts repeated after a transient failure; ``recovered``: calls that succeeded after at least one
    retry; ``gave_up``: calls that ran out of attempts or time; ``causes``: transient failures seen, by cause.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.retries = 0
        self.recovered = 0
        self.gave_up = 0
        self.causes: Counter[str] = Counter()

    def _failed(self, cause: str, *, retrying: bool) -> None:
        with self._lock:
            self.causes[cause] += 1
            if retrying:
                self.retries += 1
            else:
                self.gave_up += 1

    def _recovered(self) -> None:
        with self._lock:
            self.recovered += 1

    def as_dict(self) -> dict[str, Any]:
        """
        :returns: The counters as plain values, e.g. for a metrics endpoint.
        """
        with self._lock:
            return {
                "retries": self.retries,
                "recovered": self.recovered,
                "gave_up": self.gave_up,
                "causes": dict(self.causes),
            }


def transient_cause(error: BaseException) -> str | None:
    """
    Tell whether retrying may help, and why: walks the exception and its causes for a known transient failure.

    :param error: The exception a storage call raised.
    :returns: A short description safe to log or show ("HTTP 503 SlowDown", "read timeout", "connection failed"), or
        `None` when the failure is not transient (a missing object, a refused permission, a bad request, ...).
    """
    for link in _chain(error):
        verdict = _classify(link)
        if verdict is not None:
            return verdict or None
    return None


def http_status(error: BaseException) -> int | None:
    """
    The HTTP status of the S3 answer behind an error, from either engine, walking the chain of causes.

    :param error: The exception a storage call raised.
    :returns: The status, or None when no link of the chain carries an answer (a network failure, a local error).
    """
    return next((status for link in _chain(error) if (status := _answer_status(link)) is not None), None)


def _chain(error: BaseException) -> Iterator[BaseException]:
    """`error`, then what caused it, link by link (each once: a chain can loop)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _answer_status(error: BaseException) -> int | None:
    botocore_errors = sys.modules.get("botocore.exceptions")
    if botocore_errors is not None and isinstance(error, botocore_errors.ClientError):
        status = (getattr(error, "response", None) or {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
        return status if isinstance(status, int) else None
    obstore_errors = sys.modules.get("obstore.exceptions")
    if obstore_errors is not None and isinstance(error, obstore_errors.BaseError):
        from haystack_integrations.offload.stores.obstore_io import describe_failure

        return (describe_failure(error) or (None,))[0]
    return None


def _classify(error: BaseException) -> str | None:
    """A cause for a transient error, ``""`` for a permanent one, `None` when this link of the chain does not tell."""
    botocore_errors = sys.modules.get("botocore.exceptions")
    if botocore_errors is not None:
        if isinstance(error, botocore_errors.ClientError):
            response = getattr(error, "response", None) or {}
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = str(response.get("Error", {}).get("Code") or "")
            return _http_cause(status, code) if _transient_answer(status, code) else ""
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
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None:
        if isinstance(error, aiohttp.ClientPayloadError):
            return "answer cut short"
        if isinstance(error, aiohttp.ClientConnectionError):
            return "connection failed"
    obstore_errors = sys.modules.get("obstore.exceptions")
    if obstore_errors is not None and isinstance(error, obstore_errors.BaseError):
        # obstore's exceptions carry no fields: its engine reads status, S3 code and wire failure from the text.
        from haystack_integrations.offload.stores.obstore_io import describe_failure

        status, code, network = describe_failure(error) or (None, "", None)
        if _transient_answer(status, code):
            return _http_cause(status, code)
        return network or ""
    if isinstance(error, ConnectionError):
        return "connection reset" if isinstance(error, ConnectionResetError) else "connection failed"
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, _PERMANENT):
        return ""
    return None


def _transient_answer(status: object, code: str) -> bool:
    """Whether an HTTP answer is worth retrying: its status decides, S3's error code refines."""
    if status == 409:
        return code not in _LASTING_CONFLICTS
    return status in _TRANSIENT_STATUS or code in _TRANSIENT_CODES


def _http_cause(status: object, code: str) -> str:
    """``"HTTP 503 SlowDown"``, ``"HTTP 500"``: the status and S3's error code, each when known."""
    named = [str(status)] if status is not None else []
    if code and code != str(status):
        named.append(code)
    return " ".join(["HTTP", *named])


_VERBS = {
    "put": "a write",
    "put_exclusive": "a conditional create",
    "get": "a read",
    "get_range": "a ranged read",
    "get_range_and_size": "a ranged read",
    "size": "a size lookup",
    "find": "a listing",
    "delete": "a delete",
}


class _Attempts:
    """The bookkeeping of one call's attempts: what failed, whether to go on, and how long to wait."""

    def __init__(self, retrying: RetryingIO, operation: str, path: str) -> None:
        self._retrying = retrying
        self.operation = operation
        self.path = path
        self.started = time.monotonic()
        self.causes: list[str] = []

    def failed(self, error: Exception) -> float:
        """
        Record a failed attempt and return the delay before the next one.

        :raises Exception: `error` itself if it is not transient, or `StorageUnavailableError` chained to it if the
            policy allows no further attempt.
        """
        cause = transient_cause(error)
        if cause is None:
            raise error
        policy, stats = self._retrying.policy, self._retrying.stats
        self.causes.append(cause)
        attempt = len(self.causes)
        delay = policy.backoff(attempt)
        elapsed = time.monotonic() - self.started
        out_of_time = policy.deadline is not None and elapsed + delay >= policy.deadline
        verb = _VERBS.get(self.operation, self.operation)
        if attempt >= policy.attempts or out_of_time:
            stats._failed(cause, retrying=False)
            logger.warning(
                "Storage gave up on %s of %s after %d attempt(s) over %.2f s; last failure: %s.",
                verb,
                self.path,
                attempt,
                elapsed,
                cause,
            )
            unavailable = StorageUnavailableError(
                f"The storage backend kept failing: gave up on {verb} after {attempt} attempt(s) over {elapsed:.1f} s "
                f"(last failure: {cause}).",
                attempts=attempt,
                causes=self.causes,
            )
            for number, earlier in enumerate(self.causes, start=1):
                unavailable.add_note(f"attempt {number}: {earlier}")
            raise unavailable from error
        stats._failed(cause, retrying=True)
        logger.info(
            "Retrying %s of %s in %.2f s (attempt %d of %d failed: %s).",
            verb,
            self.path,
            delay,
            attempt,
            policy.attempts,
            cause,
        )
        return delay

    def succeeded(self) -> None:
        if self.causes:
            self._retrying.stats._recovered()


class RetryingIO(StorageIO):
    """
    A `StorageIO` that retries another one's calls under a `RetryPolicy`.

    A store wraps the I/O `storage_io_for` picked when it reaches a network (`retries_can_help`), so every user of that
    store's I/O (results, documents, operator commands) retries the same way. There is one retry loop, async.
    """

    def __init__(self, inner: StorageIO, policy: RetryPolicy, stats: RetryStats) -> None:
        """
        :param inner: The I/O strategy whose calls are retried.
        :param policy: How often and how long to retry.
        :param stats: Where retries are counted.
        """
        super().__init__(inner.fs)
        self.inner = inner
        self.policy = policy
        self.stats = stats
        self.blocking = inner.blocking
        # Network calls get a time limit per attempt; a disk call cannot be cancelled, so it gets none.
        self._limited = isinstance(inner, AsyncFilesystemIO)

    async def _run_async(self, operation: str, path: str, call: Callable[[_Attempts], Awaitable[T]]) -> T:
        attempts = _Attempts(self, operation, path)
        limit = self.policy.attempt_timeout if self._limited else None
        await self.inner.ready_async()  # a first call from a new loop makes its client here, outside the time limit
        while True:
            try:
                # Cancelling the wait cancels the request on the filesystem's loop too (asyncio.wrap_future).
                result = await asyncio.wait_for(call(attempts), limit)
            except Exception as error:
                await asyncio.sleep(attempts.failed(error))
            else:
                attempts.succeeded()
                return result

    # Lifecycle: nothing to retry (creating a client sends no request).

    async def warm_up_async(self) -> None:
        """Open the wrapped backend's client."""
        await self.inner.warm_up_async()

    # Conditional create: "already exists" is permanent here; SessionDocuments.create tells whether it was our own.

    async def put_exclusive_async(self, path: str, data: bytes) -> None:
        """Async `put_exclusive`."""
        await self._run_async("put_exclusive", path, lambda _: self.inner.put_exclusive_async(path, data))

    # Idempotent calls: repeated as they are.

    async def put_chunks_async(self, path: str, chunks: Iterable[Chunk]) -> None:
        """Async `put_chunks`."""
        await self._run_async("put", path, lambda _: self.inner.put_chunks_async(path, chunks))

    async def put_async(self, path: str, data: bytes) -> None:
        """Async `put`."""
        await self._run_async("put", path, lambda _: self.inner.put_async(path, data))

    async def get_async(self, path: str) -> bytes:
        """Async `get`."""
        return await self._run_async("get", path, lambda _: self.inner.get_async(path))

    async def get_range_async(self, path: str, start: int, end: int) -> bytes:
        """Async `get_range`."""
        return await self._run_async("get_range", path, lambda _: self.inner.get_range_async(path, start, end))

    async def get_range_and_size_async(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        """Async `get_range_and_size`."""
        return await self._run_async(
            "get_range_and_size", path, lambda _: self.inner.get_range_and_size_async(path, start, end)
        )

    async def size_async(self, path: str) -> int:
        """Async `size`."""
        return await self._run_async("size", path, lambda _: self.inner.size_async(path))

    async def find_async(self, path: str) -> dict[str, int]:
        """Async `find`."""
        return await self._run_async("find", path, lambda _: self.inner.find_async(path))

    async def delete_async(self, paths: Iterable[str]) -> None:
        """Async `delete`."""
        batch = list(paths)
        await self._run_async("delete", batch[0] if batch else "", lambda _: self.inner.delete_async(batch))


def s3_client_options(options: dict[str, Any]) -> dict[str, Any]:
    """
    Turn botocore's own retries off in s3fs options (unless the caller set them), so only `RetryingIO` retries.

    :param options: s3fs options (``config_kwargs`` may be missing).
    :returns: The options, with ``config_kwargs["retries"]`` set to a single attempt when it was not given.
    """
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", {"mode": "standard", "total_max_attempts": 1})
    return {**options, "config_kwargs": config}
