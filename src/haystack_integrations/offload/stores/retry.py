"""Bounded, observable retries of a store's storage calls: `retried`, the one loop every engine call goes through."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from haystack_integrations.offload import metrics
from haystack_integrations.offload.errors import StorageUnavailableError
from haystack_integrations.offload.stores.failures import transient_cause
from haystack_integrations.offload.stores.io import Engine

logger = logging.getLogger(__name__)

T = TypeVar("T")


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


_VERBS = {
    "put": "a write",
    "put_exclusive": "a conditional create",
    "get": "a read",
    "get_range": "a ranged read",
    "get_range_and_size": "a ranged read",
    "size": "a size lookup",
    "modified": "a modification-time lookup",
    "find": "a listing",
    "delete": "a delete",
}


class _Attempts:
    """The bookkeeping of one call's attempts: what failed, whether to go on, and how long to wait."""

    def __init__(
        self,
        policy: RetryPolicy,
        stats: RetryStats,
        operation: str,
        path: str,
        record: metrics.RequestRecord,
        location: str,
        started: float,
    ) -> None:
        self.policy = policy
        self.location = location
        self.stats = stats
        self.operation = operation
        self.path = path
        self.record = record
        self.started = started
        self.causes: list[str] = []

    def failed(self, error: Exception) -> float:
        """
        Record a failed attempt and return the delay before the next one.

        :raises Exception: `error` itself if it is not transient, or `StorageUnavailableError` chained to it if the
            policy allows no further attempt.
        """
        # The engine classified its failure (`StorageRequestError`); a timeout here is this loop's own attempt limit.
        cause = "timeout" if isinstance(error, TimeoutError) else transient_cause(error)
        if cause is None:
            raise error
        policy, stats = self.policy, self.stats
        self.causes.append(cause)
        attempt = len(self.causes)
        delay = policy.backoff(attempt)
        elapsed = time.perf_counter() - self.started  # the request's own clock (`metrics.storage_request`)
        out_of_time = policy.deadline is not None and elapsed + delay >= policy.deadline
        verb = _VERBS.get(self.operation, self.operation)
        if attempt >= policy.attempts or out_of_time:
            stats._failed(cause, retrying=False)
            self.record.outcome = "gave_up"
            logger.warning(
                "Storage gave up on %s of %s (%s) after %d attempt(s) over %.2f s; last failure: %s.",
                verb,
                self.path,
                self.location,
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
            unavailable.location = self.location
            for number, earlier in enumerate(self.causes, start=1):
                unavailable.add_note(f"attempt {number}: {earlier}")
            raise unavailable from error
        stats._failed(cause, retrying=True)
        self.record.outcome = "retried"
        metrics.storage_retry(self.operation, cause)
        logger.info(
            "Retrying %s of %s (%s) in %.2f s (attempt %d of %d failed: %s).",
            verb,
            self.path,
            self.location,
            delay,
            attempt,
            policy.attempts,
            cause,
        )
        return delay

    def succeeded(self) -> None:
        if self.causes:
            self.stats._recovered()


async def retried(
    io: Engine,
    policy: RetryPolicy,
    stats: RetryStats,
    operation: str,
    path: str,
    call: Callable[[Engine], Awaitable[T]],
    *,
    location: str = "",
) -> T:
    """
    Run one engine call, repeating it on a transient failure, under `policy`.

    Every attempt sends the same request (a write's object name is chosen before the first), so a write whose answer was
    lost is written again, to the same name. Each retry is logged (INFO) and counted in `stats`; giving up is logged
    (WARNING) and raises `StorageUnavailableError` chained to the last failure, with every attempt's cause in its notes.

    :param io: The engine.
    :param policy: How often and how long to retry.
    :param stats: Where retries are counted.
    :param operation: What the call does, for logs (``"put"``, ``"get"``, ...).
    :param path: The path it concerns, for logs.
    :param call: The engine call.
    :param location: The store's bucket and endpoint, for logs and `StorageUnavailableError.location`.
    :returns: What the call returned.
    :raises StorageUnavailableError: If the policy ran out; any other failure is raised at once, as the engine
        raised it.
    """
    limit = policy.attempt_timeout if io.needs_attempt_limit else None
    if limit is not None:
        await io.ready_async()  # a first call from a new loop makes its client here, outside the time limit
    with metrics.storage_request(operation) as record:
        attempts: _Attempts | None = None  # bookkeeping made at the first failure: most calls never fail
        while True:
            try:
                # Cancelling the wait cancels the request on the filesystem's loop too (asyncio.wrap_future).
                result = await (call(io) if limit is None else asyncio.wait_for(call(io), limit))
            except Exception as error:
                if attempts is None:
                    attempts = _Attempts(policy, stats, operation, path, record, location, record.started)
                await asyncio.sleep(attempts.failed(error))
            else:
                if attempts is not None:
                    attempts.succeeded()
                return result


def s3_client_options(options: dict[str, Any]) -> dict[str, Any]:
    """
    Turn botocore's own retries off in s3fs options (unless the caller set them), so only `retried` retries.

    :param options: s3fs options (``config_kwargs`` may be missing).
    :returns: The options, with ``config_kwargs["retries"]`` set to a single attempt when it was not given.
    """
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", {"mode": "standard", "total_max_attempts": 1})
    return {**options, "config_kwargs": config}
