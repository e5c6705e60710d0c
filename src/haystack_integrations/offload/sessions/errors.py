"""What `ChatService` refuses, as exceptions a web layer maps to its answers (the reference app: HTTP statuses)."""

from typing import Any

from haystack_integrations.offload.errors import OffloadError

__all__ = [
    "ApprovalPendingConflict",
    "HistoryRecordError",
    "InvalidMessageError",
    "NotFoundError",
    "NothingToResumeError",
    "RunFailedError",
    "SessionBusyError",
    "StaleHistoryError",
    "TurnAbandonedError",
]


class SessionBusyError(OffloadError, RuntimeError):
    """Another request holds (or just claimed) the session's next turn; nothing was run. The server answers 409."""


class StaleHistoryError(SessionBusyError):
    """
    The claim made on this worker's cached conversation found the next turn taken (another worker ran it, or runs it).

    Nothing was claimed or run: read the history again with a plain `SessionHistory.read` and claim again (what
    `ChatService` does). Unhandled, it is a `SessionBusyError`, which a client retries.
    """


class TurnAbandonedError(OffloadError, RuntimeError):
    """This turn's lease passed and another request ended it as abandoned; its result was not recorded."""


class HistoryRecordError(OffloadError, ValueError):
    """A history document in the store is not a valid record."""


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
