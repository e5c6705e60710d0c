"""What `ChatService` refuses, as exceptions a web layer maps to its answers (the reference app: HTTP statuses)."""

from typing import Any

from haystack_integrations.offload.errors import OffloadError
from haystack_integrations.offload.sessions.history import SessionBusyError, TurnAbandonedError

__all__ = [
    "ApprovalPendingConflict",
    "InvalidMessageError",
    "NotFoundError",
    "NothingToResumeError",
    "RunFailedError",
    "SessionBusyError",
    "TurnAbandonedError",
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
