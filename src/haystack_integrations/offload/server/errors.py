"""
What the chat service refuses, as exceptions a web layer maps to HTTP statuses (and the demo counts as outcomes).

`ERROR_STATUSES` holds the table for the web layer; `error_status` answers it for any exception, storage failures
included.
"""

from typing import Any

from haystack_integrations.offload.errors import OffloadError, StorageError, StoragePermissionError
from haystack_integrations.offload.server.history import SessionBusyError, TurnAbandonedError

__all__ = [
    "ERROR_STATUSES",
    "AlreadyDecidedError",
    "ApprovalExpiredConflict",
    "ApprovalPendingConflict",
    "InvalidDecisionError",
    "InvalidMessageError",
    "NotFoundError",
    "NothingToResumeError",
    "RunFailedError",
    "SessionBusyError",
    "TurnAbandonedError",
    "error_status",
]


class NotFoundError(OffloadError, LookupError):
    """Nothing by that name in the caller's session; deliberately the same for "elsewhere" and "nowhere"."""


class ApprovalPendingConflict(OffloadError, RuntimeError):
    """The session's conversation waits for approval decisions; new messages wait until they are made."""

    def __init__(self, message: str, pending: list[Any]) -> None:
        """
        :param message: What happened.
        :param pending: The `ApprovalRequest`s still waiting (empty when they expired: resume the session).
        """
        super().__init__(message)
        self.pending = pending


class NothingToResumeError(OffloadError, RuntimeError):
    """The session has no held step waiting to be resumed (it was resumed already, or never held)."""


class RunFailedError(OffloadError, RuntimeError):
    """The Agent run failed; the turn was recorded as failed, with the user's message kept in its start record."""


class InvalidMessageError(OffloadError, ValueError):
    """The message is empty or too long."""


class InvalidDecisionError(OffloadError, ValueError):
    """The decision cannot be recorded: edited arguments fail the tool's schema, or it names another tool."""


class ApprovalExpiredConflict(OffloadError, ValueError):
    """The approval request expired before it was decided; resume the session to tell the model."""


class AlreadyDecidedError(OffloadError, FileExistsError):
    """The approval request already has a decision; decisions are made once."""


ERROR_STATUSES: dict[type[Exception], tuple[int, str]] = {
    SessionBusyError: (409, "session_busy"),
    TurnAbandonedError: (409, "session_busy"),
    NothingToResumeError: (409, "nothing_to_resume"),
    AlreadyDecidedError: (409, "already_decided"),
    ApprovalExpiredConflict: (409, "approval_expired"),
    InvalidDecisionError: (422, "invalid_decision"),
    InvalidMessageError: (422, "invalid_message"),
    RunFailedError: (502, "run_failed"),
}
"""The service's refusals with a plain ``{"error": code, "detail": str(error)}`` answer: status and code."""

NOT_FOUND_DETAIL = "Not found."
"""One body for every "not found": a missing result, another tenant's result and a bad path look the same."""
STORAGE_UNAVAILABLE = "The result store is unavailable."


def error_status(error: BaseException) -> tuple[int, str, str]:
    """
    How the HTTP API tells a failure: status, code and a sentence safe to show (never a backend's message).

    :param error: What a request raised.
    :returns: ``(status, code, detail)``; an unexpected error is a 500 ``internal_error`` that names nothing.
    """
    for error_type, (status, code) in ERROR_STATUSES.items():
        if isinstance(error, error_type):
            return status, code, str(error)
    if isinstance(error, StorageError | StoragePermissionError):
        return 503, "storage_unavailable", STORAGE_UNAVAILABLE
    if isinstance(error, NotFoundError):
        return 404, "not_found", NOT_FOUND_DETAIL
    return 500, "internal_error", "The server failed to answer."
