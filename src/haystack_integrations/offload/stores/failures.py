"""How an engine reports a failed request: the few kinds the store, its retries and the doctor tell apart."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from haystack_integrations.offload.errors import OffloadError, StorageError, StoragePermissionError

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
# What an engine leaves as it is: "missing", "exists" and "refused", and a caller's mistakes.
LASTING = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError, ValueError)
# 409 is transient (a conflicting operation in flight) except for these codes, whose conflict stays until changed.
_LASTING_CONFLICTS = frozenset(
    {"BucketAlreadyExists", "BucketAlreadyOwnedByYou", "BucketNotEmpty", "InvalidBucketState"}
)


class StorageRequestError(OffloadError, OSError):
    """
    A request that failed for a reason other than "exists", "not found" or "refused".

    Engines raise those three as `FileExistsError`, `FileNotFoundError` and `PermissionError`, and this for a failure
    they recognise (an HTTP answer, a dropped connection, a timeout), chained to their client's own exception. The
    store translates it before a caller sees it; it is an `OffloadError` for whoever calls an engine directly.
    """

    def __init__(self, cause: str, *, transient: bool, status: int | None = None) -> None:
        """
        :param cause: What happened, safe to log or show ("HTTP 503 SlowDown", "connection reset").
        :param transient: Whether a retry may get past it.
        :param status: The HTTP status of the answer, if one came.
        """
        super().__init__(cause)
        self.cause = cause
        self.transient = transient
        self.status = status


class EncryptionKeyRefusedError(OffloadError, PermissionError):
    """
    The object store refused a request that sent a tenant's SSE-C key: the object was written with another key or
    none, or the endpoint takes SSE-C over HTTPS only. A `PermissionError`, as a refusal is, but told apart from one.
    """


class EncryptionKeyMissingError(EncryptionKeyRefusedError):
    """
    The object store refused to read an object without an SSE-C key: a store without keys read an object written with
    a tenant's key (S3 and Ceph RGW answer a bare 400, as they do a wrong key).
    """


class MissingCredentialsError(OffloadError, PermissionError):
    """
    No credentials could be found for the storage backend: none given, none in the environment or a profile, and no
    instance or container role answered. A `PermissionError`, as a refusal is, but told apart from one.
    """


def answer_failure(status: int | None, code: str) -> StorageRequestError:
    """
    Classify an S3 answer that is an error: its status decides whether to retry, S3's error code refines it.

    :param status: The HTTP status, if known.
    :param code: S3's error code (``"SlowDown"``), or ``""``.
    :returns: The failure to raise.
    """
    transient = (
        code not in _LASTING_CONFLICTS if status == 409 else status in _TRANSIENT_STATUS or code in _TRANSIENT_CODES
    )
    named = [str(status)] if status is not None else []
    if code and code != str(status):
        named.append(code)
    return StorageRequestError(" ".join(["HTTP", *named]), transient=transient, status=status)


# Azure's codes for a conditional create that found the object (or container) there already.
_EXISTS_CODES = frozenset({"BlobAlreadyExists", "ContainerAlreadyExists", "ConditionNotMet"})


def status_failure(status: int | None, code: str) -> OSError:
    """
    Classify an error answer from a store other than S3 (Azure Blob, GCS) by its HTTP status, its error code refining.

    What S3's engines learn from their client's own exceptions (refused, missing, exists), these SDKs leave in a
    status: 401 and 403 are a refusal (wrong or missing credentials), 404 a missing object or container, 412 (and
    Azure's 409 ``BlobAlreadyExists``) a conditional create that lost; the rest is `answer_failure`'s.

    :param status: The HTTP status, if known.
    :param code: The service's error code (``"AuthenticationFailed"``), or ``""``.
    :returns: A `PermissionError`, `FileNotFoundError` or `FileExistsError`, else a `StorageRequestError`.
    """
    named = " ".join(["HTTP", *([str(status)] if status is not None else []), *([code] if code else [])])
    if status in (401, 403):
        return PermissionError(errno.EACCES, named)
    if status == 404:
        return FileNotFoundError(errno.ENOENT, named)
    if status == 412 or (status == 409 and code in _EXISTS_CODES):
        return FileExistsError(errno.EEXIST, named)
    return answer_failure(status, code)


def network_failure(error: BaseException) -> StorageRequestError | None:
    """
    Classify Python's own network failures (a reset, a refused connection, a timeout), which any engine may raise.

    :param error: The exception.
    :returns: A transient failure, or None if `error` is none of those.
    """
    if isinstance(error, ConnectionResetError):
        return StorageRequestError("connection reset", transient=True)
    if isinstance(error, ConnectionError):
        return StorageRequestError("connection failed", transient=True)
    if isinstance(error, TimeoutError):
        return StorageRequestError("timeout", transient=True)
    return None


def causes_of(error: BaseException) -> Iterator[BaseException]:
    """`error`, then what caused it, link by link (each once: a chain can loop)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def transient_cause(error: BaseException) -> str | None:
    """
    Tell whether retrying may help, and why.

    :param error: What a storage call raised.
    :returns: The cause of the first transient `StorageRequestError` in the chain ("HTTP 503 SlowDown", "connection
        reset"), or None when the failure is not transient (a missing object, a refused permission, a bad request).
    """
    for link in causes_of(error):
        if isinstance(link, StorageRequestError):
            return link.cause if link.transient else None
    return None


def no_answer_cause(error: BaseException) -> str | None:
    """
    Tell whether a failure got no answer at all from the store (nothing listening, or silent), unlike a reset or a 503.

    A dropped connection is not enough: the engines report a reset after the request reached the store as a failed
    connection too (aiohttp's ``ServerDisconnectedError`` is a ``ClientConnectionError``).

    :param error: What a storage call raised (a give-up of the retry policy included).
    :returns: ``"connection refused"``, or ``"timeout"`` (an engine's, or an attempt cancelled by the retry policy's
        ``attempt_timeout``), or None when an answer came or the failure does not say that none did.
    """
    links = list(causes_of(error))
    if any(isinstance(link, ConnectionRefusedError) for link in links):
        return "connection refused"
    for link in links:
        if isinstance(link, TimeoutError) or (isinstance(link, StorageRequestError) and link.cause == "timeout"):
            return "timeout"
    return None


def status_of(error: BaseException) -> int | None:
    """
    The HTTP status of the answer behind an engine's error, walking the chain of causes.

    :param error: What a storage call raised.
    :returns: The status, or None when no answer came (a network failure) or the engine did not classify it.
    """
    return next((link.status for link in causes_of(error) if isinstance(link, StorageRequestError)), None)


# Where a backend's own exception carries the store it came from, for the translation to pass on (`location_of`).
_LOCATION_ATTRIBUTE = "offload_storage_location"


def mark_location(error: BaseException, location: str) -> None:
    """
    Note on a failed request's exception which store it was sent to (kept where one is noted already).

    :param error: Our storage error (its `location` is set) or a backend's exception (an attribute is added where the
        exception takes one).
    :param location: The store's bucket or root and endpoint (`FsspecToolResultStore` builds it, without credentials).
    """
    if isinstance(error, StorageError | StoragePermissionError):
        error.location = error.location or location
        return
    if not getattr(error, _LOCATION_ATTRIBUTE, ""):
        # An exception type without a __dict__ stays unnamed.
        with contextlib.suppress(AttributeError, TypeError):
            setattr(error, _LOCATION_ATTRIBUTE, location)


def location_of(error: BaseException) -> str:
    """The store `mark_location` noted on `error`, or ``""``."""
    if isinstance(error, StorageError | StoragePermissionError):
        return error.location
    return str(getattr(error, _LOCATION_ATTRIBUTE, ""))
