"""
The library's metrics, through OpenTelemetry's metrics API: no-ops until the application sets a MeterProvider.

Every instrument is defined here, once, with its unit and the bounded attributes it takes; the parts that count only
call the small functions below. The library never sets the global MeterProvider. Names and meanings are listed in
the docs (operations, "Metrics").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Literal

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

# What an application calls; the rest is called by the library's parts as they count.
__all__ = ["label_tenants"]

METER_NAME = "haystack_integrations.offload"

OffloadOutcome = Literal["stored", "under_threshold", "kept_inline", "refused_quota"]
RequestOutcome = Literal["ok", "retried", "gave_up", "refused"]
ReadKind = Literal["page", "search", "binary", "list"]
ApprovalEvent = Literal["requested", "decided", "expired", "executed", "may_have_run"]

# Seconds: from a local disk's fraction of a millisecond to a storage call that retried for half a minute.
_REQUEST_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Seconds: a turn of a scripted model to a long agent run.
_TURN_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

_meter = metrics.get_meter(METER_NAME)


class _Tally:
    """
    Counts kept in the process and reported when the metrics are collected (an observable counter).

    An SDK measurement costs several microseconds; adding to a dict under a lock costs a fraction of one, and the
    counts on the hot path (one per offloaded result, page or retry) need no timestamp of their own.
    """

    def __init__(self, name: str, unit: str, description: str) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[tuple[str, str], ...], float] = {}
        _meter.create_observable_counter(name, callbacks=[self._observe], unit=unit, description=description)

    def add(self, amount: float, attributes: dict[str, str]) -> None:
        self.add_keyed(amount, tuple(attributes.items()))  # each caller builds its attributes in one order

    def add_keyed(self, amount: float, key: tuple[tuple[str, str], ...]) -> None:
        """`add`, given its attributes as the key `add` makes of them (a caller that keeps it saves a tuple)."""
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + amount

    def _observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            counts = list(self._counts.items())
        return [Observation(total, dict(key)) for key, total in counts]


_results = _Tally("offload.results", "{result}", "Tool results the offload hooks handled, by outcome.")
_result_bytes = _Tally("offload.result.bytes", "By", "Bytes of the tool results the offload hooks handled, by outcome.")
_requests = _Tally(
    "offload.storage.requests",
    "{request}",
    "Storage calls a store sent, by operation and outcome (a call counts once, however many attempts it took).",
)
# Timed for remote engines only: a memory or local-disk call takes microseconds, as long as an SDK measurement.
_request_duration = _meter.create_histogram(
    "offload.storage.request.duration",
    unit="s",
    description="Duration of the storage calls a store sent to a remote engine, retries and backoff included.",
    explicit_bucket_boundaries_advisory=_REQUEST_SECONDS,
)
_retries = _Tally(
    "offload.storage.retries", "{attempt}", "Storage attempts repeated after a transient failure, by cause."
)
_reads = _Tally("offload.readback.calls", "{call}", "Read-back tool calls the model made, by kind.")
_read_bytes = _Tally("offload.readback.bytes", "By", "Bytes of stored results the read-back tools read, by kind.")
_approvals = _Tally("offload.approvals", "{event}", "Approval events, by event and (for decisions) verdict.")
_turn_duration = _meter.create_histogram(
    "offload.turn.duration",
    unit="s",
    description="Turns the server ran, by status, timed from the request to the reply.",
    explicit_bucket_boundaries_advisory=_TURN_SECONDS,
)

_tenants: frozenset[str] = frozenset()


def label_tenants(tenants: Iterable[str]) -> None:
    """
    Add the tenant id (``offload.tenant``) to the series of these tenants; every other tenant's series have none.

    Off by default: an attribute per tenant multiplies every series by the number of tenants, so turn it on only for a
    known, small set (the server's ``metrics_tenants`` setting).

    :param tenants: The tenant ids to label; an empty iterable turns labelling off.
    """
    global _tenants  # one process-wide setting, as the MeterProvider itself is
    _tenants = frozenset(tenants)


def _with_tenant(attributes: dict[str, str], tenant: str | None) -> dict[str, str]:
    if tenant is not None and tenant in _tenants:
        attributes["offload.tenant"] = tenant
    return attributes


def result_offloaded(outcome: OffloadOutcome, size: int, *, tenant: str | None = None) -> None:
    """Count one tool result an offload hook handled, and its size in bytes."""
    attributes = _with_tenant({"offload.outcome": outcome}, tenant)
    _results.add(1, attributes)
    _result_bytes.add(size, attributes)


class storage_request:
    """
    Count one storage call once, with the outcome the block leaves on the yielded record (``outcome``), and time it if
    `timed`.

    The outcome is ``ok`` unless the block says otherwise or raises: an exception left unmarked counts as ``refused``
    (the store answered no, or the failure was not transient).
    """

    # A class, not a generator, and its own record: it wraps every request, and each object or call costs.
    __slots__ = ("operation", "outcome", "started", "timed")

    def __init__(self, operation: str, *, timed: bool = True) -> None:
        self.operation = operation
        self.timed = timed
        self.outcome: RequestOutcome = "ok"
        self.started = 0.0

    def __enter__(self) -> RequestRecord:
        self.started = time.perf_counter()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: object
    ) -> Literal[False]:
        if error is not None and self.outcome in ("ok", "retried"):
            self.outcome = "refused"
        # Every request counts under one of a few (operation, outcome) pairs: their attributes are built once each.
        made = _REQUEST_ATTRIBUTES.get((self.operation, self.outcome)) or _request_attributes(
            self.operation, self.outcome
        )
        _requests.add_keyed(1, made[1])
        if self.timed:
            _request_duration.record(time.perf_counter() - self.started, made[0])
        return False


# What a storage call came to (``outcome``): set by the retry loop as attempts fail.
RequestRecord = storage_request

_REQUEST_ATTRIBUTES: dict[tuple[str, str], tuple[dict[str, str], tuple[tuple[str, str], ...]]] = {}


def _request_attributes(operation: str, outcome: str) -> tuple[dict[str, str], tuple[tuple[str, str], ...]]:
    attributes = {"offload.operation": operation, "offload.outcome": outcome}
    made = _REQUEST_ATTRIBUTES[operation, outcome] = (attributes, tuple(attributes.items()))
    return made


def storage_retry(operation: str, cause: str) -> None:
    """Count one attempt repeated after a transient failure (`cause` is one of the retry loop's few causes)."""
    _retries.add(1, {"offload.operation": operation, "offload.cause": cause})


def read_back(kind: ReadKind, size: int = 0, *, tenant: str | None = None) -> None:
    """Count one read-back call of the model, and the bytes of stored results it read."""
    attributes = _with_tenant({"offload.kind": kind}, tenant)
    _reads.add(1, attributes)
    _read_bytes.add(size, attributes)


def approval(event: ApprovalEvent, count: int = 1, *, verdict: str | None = None, tenant: str | None = None) -> None:
    """Count approval events; a decision also carries its verdict (``approved``, ``rejected``, ``edited``)."""
    attributes: dict[str, str] = {"offload.event": event}
    if verdict is not None:
        attributes["offload.verdict"] = verdict
    _approvals.add(count, _with_tenant(attributes, tenant))


def turn_ended(status: str, seconds: float, *, tenant: str | None = None) -> None:
    """Count one turn the server ran, with its status (``completed``, ``held``, ``failed``) and duration."""
    _turn_duration.record(seconds, _with_tenant({"offload.status": status}, tenant))


class PendingApprovals:
    """
    The approvals this worker holds or has seen pending, to report the age of the oldest (a per-worker view).

    A worker knows of an approval when it held the step or listed it pending, and forgets it when it sees the
    decision, the expiry or the resume. Approvals nobody in this worker touched are not in its figure.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: dict[str, float] = {}

    def pending(self, approval_id: str, since: float) -> None:
        """Note an approval pending since `since` (seconds since the epoch)."""
        with self._lock:
            self._since.setdefault(approval_id, since)

    def settled(self, approval_id: str) -> None:
        """Forget an approval that was decided, expired or resumed."""
        with self._lock:
            self._since.pop(approval_id, None)

    def oldest_age(self, now: float | None = None) -> float | None:
        """:returns: Seconds the oldest known pending approval has waited, or ``None`` when none is known."""
        with self._lock:
            if not self._since:
                return None
            return (time.time() if now is None else now) - min(self._since.values())

    def _observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        age = self.oldest_age()
        return [] if age is None else [Observation(age)]


pending_approvals = PendingApprovals()

_meter.create_observable_gauge(
    "offload.approvals.oldest_pending.age",
    callbacks=[pending_approvals._observe],
    unit="s",
    description="Age of the oldest pending approval this worker holds or has seen (per worker).",
)
