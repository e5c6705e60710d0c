"""How the HTTP API answers what `ChatService` refuses (`ERROR_STATUSES`, `error_status`), storage failures included."""

from haystack_integrations.offload import QuotaExceededError, StorageError, StoragePermissionError
from haystack_integrations.offload.approvals import (
    ApprovalAlreadyDecidedError,
    ApprovalExpiredError,
    InvalidApprovalEditError,
)
from haystack_integrations.offload.sessions import (
    InvalidMessageError,
    NotFoundError,
    NothingToResumeError,
    RunFailedError,
    SessionBusyError,
    TurnAbandonedError,
)

ERROR_STATUSES: dict[type[Exception], tuple[int, str]] = {
    SessionBusyError: (409, "session_busy"),
    TurnAbandonedError: (409, "session_busy"),
    NothingToResumeError: (409, "nothing_to_resume"),
    ApprovalAlreadyDecidedError: (409, "already_decided"),
    ApprovalExpiredError: (409, "approval_expired"),
    InvalidApprovalEditError: (422, "invalid_decision"),
    InvalidMessageError: (422, "invalid_message"),
    # Nothing was stored or run; the detail names the tenant's or session's own limit, never another's.
    QuotaExceededError: (403, "quota_exceeded"),
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
