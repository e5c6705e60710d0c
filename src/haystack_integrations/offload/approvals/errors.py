"""
Errors raised by the approval API: each is an `OffloadError` and a subclass of a built-in (or the library's own)
exception.
"""

from typing import Any

from haystack_integrations.offload.errors import DocumentExistsError, OffloadError


class ApprovalNotFoundError(OffloadError, LookupError):
    """No approval request (or held step) with this id exists in the session's scope."""


class InvalidApprovalEditError(OffloadError, ValueError):
    """Edited arguments are not valid for the tool, or the decision names another tool. Nothing was recorded."""


class ApprovalExpiredError(OffloadError, ValueError):
    """The approval request expired before it was decided. Nothing was recorded."""


class ApprovalRecordError(OffloadError, ValueError):
    """A stored approval document could not be read as the record it should be."""


class ResumeConversationError(OffloadError, ValueError):
    """The conversation passed to resume already contains the held step's tool calls; resuming would duplicate them."""


class ApprovalPendingError(OffloadError, RuntimeError):
    """Some requests of the held step have no decision yet and have not expired, so the step cannot resume."""

    def __init__(self, message: str, request_ids: list[str]) -> None:
        """
        :param message: What happened.
        :param request_ids: The requests still waiting for a decision.
        """
        super().__init__(message)
        self.request_ids = request_ids


class ResumeInterruptedError(OffloadError, RuntimeError):
    """
    The held step's calls ran (exactly once), then the Agent failed to continue (e.g. the model call failed).

    The step cannot be resumed again, so the conversation with the calls' results travels on this error: persist
    `messages` and continue it with `agent.run(messages)`, which loses nothing and runs nothing twice.
    """

    def __init__(self, message: str, messages: list[Any], outcomes: list[Any]) -> None:
        """
        :param message: What happened.
        :param messages: The conversation including the held step and its results (`ChatMessage`s).
        :param outcomes: One `CallOutcome` per call of the step.
        """
        super().__init__(message)
        self.messages = messages
        self.outcomes = outcomes


class ApprovalAlreadyDecidedError(DocumentExistsError):
    """
    The request already has a decision; a decision is created once and never replaced.

    `recorded` is the decision that stands (when `decide` could read it), and `repeated` says whether the refused one
    was the same: same verdict and, for an approval, the same final arguments. A repeat may continue a held step whose
    resume failed; anything else is a conflict.
    """

    def __init__(self, message: str, *, recorded: Any = None, repeated: bool = False) -> None:
        """
        :param message: The explanation.
        :param recorded: The `ApprovalDecision` that stands, if known.
        :param repeated: Whether the refused decision was the same as `recorded`.
        """
        super().__init__(message)
        self.recorded = recorded
        self.repeated = repeated

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self),), self.__dict__)


class ApprovalClaimedError(DocumentExistsError):
    """Another worker already resumed this held step (or ran this call); this worker ran nothing."""
