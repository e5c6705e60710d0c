"""Translation of backend exceptions into this library's errors, in one place for every store operation."""

from typing import Literal

from haystack_integrations.offload.errors import (
    DocumentExistsError,
    InvalidReferenceError,
    InvalidScopeIdError,
    OffloadError,
    ResultNotFoundError,
    StorageError,
    StoragePermissionError,
)
from haystack_integrations.offload.stores.failures import (
    EncryptionKeyMissingError,
    EncryptionKeyRefusedError,
    MissingCredentialsError,
    StorageRequestError,
    location_of,
)

_OURS = (
    DocumentExistsError,
    InvalidReferenceError,
    InvalidScopeIdError,
    ResultNotFoundError,
    StorageError,
    StoragePermissionError,
)


NO_CREDENTIALS = (
    "no credentials found (none in the storage options, the AWS_* environment variables or a profile, and no "
    "instance or container role answered)."
)


class storage_errors:
    """
    Translate backend exceptions raised inside the block into this library's built-in-derived errors.

    The new error's message is safe to show to a model (no bucket, prefix or other tenant in it); the backend's
    exception stays attached as ``__cause__`` for logs, and the store it was sent to is the error's ``location``.

    :param action: What was being done, for the message ("read the result").
    :param reference: The reference involved, if any: a missing object then means "no such result".
    """

    # A class, not a generator: it wraps every store call, and a generator's context manager costs microseconds more.
    __slots__ = ("action", "reference")

    def __init__(self, action: str, *, reference: str | None) -> None:
        self.action = action
        self.reference = reference

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: object
    ) -> Literal[False]:
        # TypeError is a caller's mistake (e.g. a sync call on an asynchronous=True filesystem), not a storage fault.
        if not isinstance(error, Exception) or isinstance(error, (*_OURS, TypeError)):
            return False
        translated = _translated(error, self.action, self.reference)
        if isinstance(translated, StorageError | StoragePermissionError):
            translated.location = location_of(error)
        raise translated from error


def _translated(error: Exception, action: str, reference: str | None) -> OffloadError:
    if isinstance(error, FileExistsError):
        # Only conditional creates raise this (each engine maps a 412 to it): somebody else created the object first.
        return DocumentExistsError(f"Could not {action}: it already exists.")
    if isinstance(error, FileNotFoundError):
        if reference is not None:
            return ResultNotFoundError(f"No stored result {reference!r} in this scope.")
        return StorageError(f"Could not {action}: the bucket or directory does not exist.")
    if isinstance(error, MissingCredentialsError):
        # Each engine tells it apart from a refusal (obstore's metadata lookup, botocore's NoCredentialsError).
        return StoragePermissionError(f"Could not {action}: {NO_CREDENTIALS}")
    if isinstance(error, EncryptionKeyMissingError):
        return StoragePermissionError(
            f"Storage refused to {action} without an encryption key (SSE-C): the object was written with a tenant's "
            "key; give the store the keys it was written with (encryption=TenantKeys(...))."
        )
    if isinstance(error, EncryptionKeyRefusedError):
        return StoragePermissionError(
            f"Storage refused to {action} with this tenant's encryption key (SSE-C): the object was written with "
            "another key or none, or the endpoint takes SSE-C over HTTPS only."
        )
    if isinstance(error, PermissionError):
        return StoragePermissionError(f"Storage refused to {action}: permission denied.")
    if isinstance(error, StorageRequestError):
        # The engine's description of the failure ("HTTP 503 SlowDown") names no bucket or path.
        return StorageError(f"Could not {action}: {error.cause} from the storage backend.")
    # The backend's message may name the bucket and other tenants' paths; it stays on the chained cause.
    return StorageError(f"Could not {action}: {type(error).__name__} from the storage backend.")
