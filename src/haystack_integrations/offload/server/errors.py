"""
What the chat service refuses, as exceptions a web layer maps to HTTP statuses (and the demo counts as outcomes)::

    LookupError
    └── NotFoundError                404  no such result, approval or session *in the caller's scope*: another
                                           tenant's or session's looks exactly the same as one that never existed
    RuntimeError
    ├── SessionBusyError             409  another request holds the session's next turn (from `history`)
    ├── TurnAbandonedError           409  this turn outlived its lease and was ended by another request
    ├── ApprovalPendingConflict      409  the conversation waits for approvals: decide them first
    ├── NothingToResumeError         409  resume was asked, but no held step waits in this session
    └── RunFailedError               502  the Agent (model or tool) failed; the turn is recorded as failed
    ValueError
    ├── InvalidMessageError          422  an empty or over-long message
    ├── InvalidDecisionError         422  edited arguments that fail the tool's schema, or another tool
    └── ApprovalExpiredConflict      409  the request expired before it was decided
    FileExistsError
    └── AlreadyDecidedError          409  the request already has a decision
"""

from typing import Any

from haystack_integrations.offload.server.history import SessionBusyError, TurnAbandonedError

__all__ = [
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
]


class NotFoundError(LookupError):
    """Nothing by that name in the caller's session; deliberately the same for "elsewhere" and "nowhere"."""


class ApprovalPendingConflict(RuntimeError):
    """The session's conversation waits for approval decisions; new messages wait until they are made."""

    def __init__(self, message: str, pending: list[Any]) -> None:
        """
        :param message: What happened.
        :param pending: The `ApprovalRequest`s still waiting (empty when they expired: resume the session).
        """
        super().__init__(message)
        self.pending = pending


class NothingToResumeError(RuntimeError):
    """The session has no held step waiting to be resumed (it was resumed already, or never held)."""


class RunFailedError(RuntimeError):
    """The Agent run failed; the turn was recorded as failed, with the user's message kept in its start record."""


class InvalidMessageError(ValueError):
    """The message is empty or too long."""


class InvalidDecisionError(ValueError):
    """The decision cannot be recorded: edited arguments fail the tool's schema, or it names another tool."""


class ApprovalExpiredConflict(ValueError):
    """The approval request expired before it was decided; resume the session to tell the model."""


class AlreadyDecidedError(FileExistsError):
    """The approval request already has a decision; decisions are made once."""
