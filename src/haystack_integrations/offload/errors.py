"""
Errors raised by offload-haystack, and `OffloadError`, the root of every error the library raises.

Every error also subclasses a built-in exception, so callers can catch what they already know. Backend exceptions are
chained (``raise ... from exc``). The whole tree, approvals, tools and server included, is drawn in docs/design.md.
"""

import errno
from collections.abc import Sequence
from typing import Any


class OffloadError(Exception):
    """
    Base of every error offload-haystack raises: ``except OffloadError`` catches them all.

    Each error also keeps a built-in base (`OSError`, `ValueError`, `LookupError`, ...), so existing ``except``
    clauses keep working.
    """


class InvalidScopeIdError(OffloadError, ValueError):
    """A tenant or session id is not a single, safe path segment."""


class InvalidReferenceError(OffloadError, ValueError):
    """A reference was refused: it is malformed or resolves outside the store's own scope. Nothing was read."""


class StorageError(OffloadError, OSError):
    """
    The storage backend failed for a reason other than a missing object or a refused permission.

    The message is safe to show to a model (it names no bucket or endpoint); `location` names the store for operators:
    its bucket (or root) and endpoint, never credentials, or ``""`` where the failure came before any request.
    """

    location: str = ""


class StorageUnavailableError(StorageError):
    """
    The backend kept failing with transient errors (5xx, throttling, resets, timeouts) until the retry policy ran out.

    Chained to the last backend error; the cause of every attempt is in `causes` (and in the exception's notes).
    """

    def __init__(self, message: str, *, attempts: int = 0, causes: Sequence[str] = ()) -> None:
        """
        :param message: What was given up on, safe to show.
        :param attempts: How many attempts were made.
        :param causes: Each attempt's transient failure, in order.
        """
        super().__init__(message)
        self.attempts = attempts
        self.causes = tuple(causes)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only attributes travel in the state, so the error pickles (e.g. across worker processes).
        return (type(self), (str(self),), self.__dict__)


class ExclusiveCreatesUnsupportedError(StorageError):
    """
    The backend accepted a second exclusive create of one key (it ignores ``If-None-Match``) or refused conditional
    writes outright (501): claims, decisions and turns cannot be made exactly once on it, so none is attempted.

    Offloading results keeps working. `store` names the store that was checked, `reason` what it did.
    """

    def __init__(self, message: str, *, store: str = "", reason: str = "") -> None:
        """
        :param message: The explanation, naming the store and what it lacks.
        :param store: The checked store's root, engine and endpoint.
        :param reason: What the backend did ("accepted both creates", "answered 501 to If-None-Match").
        """
        super().__init__(message)
        self.store = store
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self),), self.__dict__)


class QuotaExceededError(OffloadError, OSError):
    """
    A write was refused before any byte was sent: it would take a session or tenant past a quota (``errno.EDQUOT``).

    `scope` names the limit hit (``"session"`` or ``"tenant"``) and `limit` what it counts (``"results"``,
    ``"bytes"``); `tenant` and `session` say whose write it was.
    """

    def __init__(
        self,
        message: str,
        *,
        tenant: str | None = None,
        session: str | None = None,
        scope: str = "",
        limit: str = "",
        allowed: int = 0,
    ) -> None:
        """
        :param message: The explanation, naming the tenant, the session and the limit.
        :param tenant: The writing store's tenant.
        :param session: The writing store's session.
        :param scope: ``"session"`` or ``"tenant"``: whose quota would be passed.
        :param limit: ``"results"`` or ``"bytes"``: what the quota counts.
        :param allowed: The quota's value.
        """
        super().__init__(errno.EDQUOT, message)
        self.tenant = tenant
        self.session = session
        self.scope = scope
        self.limit = limit
        self.allowed = allowed

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.strerror,), self.__dict__)


class CreateOutcomeUnknownError(StorageUnavailableError):
    """
    A conditional create may or may not have landed: the document exists but could not be read back to tell whose it
    is. Retryable: a retry with the same bytes is recognised as the same writer's.
    """


class DocumentExistsError(OffloadError, FileExistsError):
    """A conditional create found the document already there: another run or worker created it first."""


class ResultNotFoundError(OffloadError, FileNotFoundError):
    """No stored result exists under the reference within the store's scope."""


class ResultExpiredError(ResultNotFoundError):
    """The result is older than its retention allows: it is refused without being read, and `purge` removes it."""


class StoragePermissionError(OffloadError, PermissionError):
    """
    The storage backend refused the request (missing or wrong credentials, an IAM policy, an ACL).

    `location` names the store, as `StorageError.location` does.
    """

    location: str = ""
