"""
offload-haystack: per-tenant, per-session tool-result offloading for Haystack Agents serving many users.

Names are imported lazily, like Haystack's own packages, so importing one part does not import every backend.
"""

import sys
from typing import TYPE_CHECKING

from lazy_imports import LazyImporter

_import_structure = {
    "approvals": [
        "APPROVAL_CHANNEL_KEY",
        "APPROVAL_REQUIRED",
        "ApprovalAlreadyDecidedError",
        "ApprovalClaimedError",
        "ApprovalExpiredError",
        "ApprovalNotFoundError",
        "ApprovalPendingError",
        "ApprovalRecordError",
        "ApprovalRequest",
        "AskOncePerSession",
        "AskWhen",
        "CallbackApprovals",
        "Decision",
        "DurableApprovals",
        "InvalidApprovalEditError",
        "ResumeConversationError",
        "ResumeInterruptedError",
        "decide",
        "decide_async",
        "pending_approvals",
        "pending_approvals_async",
        "read_audit",
        "read_audit_async",
        "resume",
        "resume_async",
    ],
    "context": ["offload_context"],
    "errors": [
        "CreateOutcomeUnknownError",
        "DocumentExistsError",
        "ExclusiveCreatesUnsupportedError",
        "InvalidReferenceError",
        "InvalidScopeIdError",
        "OffloadError",
        "QuotaExceededError",
        "ResultExpiredError",
        "ResultNotFoundError",
        "StorageError",
        "StoragePermissionError",
        "StorageUnavailableError",
    ],
    "approvals.hook": ["ApprovalHook"],
    "hooks": ["OffloadCompactionHook", "OffloadHook"],
    "stores": [
        "FsspecToolResultStore",
        "Quota",
        "Retention",
        "RetryPolicy",
        "end_session",
        "end_session_async",
    ],
    "tools": ["ListToolResults", "ReadBackToolError", "ReadToolResult", "list_tool_results", "read_tool_result"],
}

if TYPE_CHECKING:
    from .approvals import APPROVAL_CHANNEL_KEY as APPROVAL_CHANNEL_KEY
    from .approvals import APPROVAL_REQUIRED as APPROVAL_REQUIRED
    from .approvals import ApprovalAlreadyDecidedError as ApprovalAlreadyDecidedError
    from .approvals import ApprovalClaimedError as ApprovalClaimedError
    from .approvals import ApprovalExpiredError as ApprovalExpiredError
    from .approvals import ApprovalNotFoundError as ApprovalNotFoundError
    from .approvals import ApprovalPendingError as ApprovalPendingError
    from .approvals import ApprovalRecordError as ApprovalRecordError
    from .approvals import ApprovalRequest as ApprovalRequest
    from .approvals import AskOncePerSession as AskOncePerSession
    from .approvals import AskWhen as AskWhen
    from .approvals import CallbackApprovals as CallbackApprovals
    from .approvals import Decision as Decision
    from .approvals import DurableApprovals as DurableApprovals
    from .approvals import InvalidApprovalEditError as InvalidApprovalEditError
    from .approvals import ResumeConversationError as ResumeConversationError
    from .approvals import ResumeInterruptedError as ResumeInterruptedError
    from .approvals import decide as decide
    from .approvals import decide_async as decide_async
    from .approvals import pending_approvals as pending_approvals
    from .approvals import pending_approvals_async as pending_approvals_async
    from .approvals import read_audit as read_audit
    from .approvals import read_audit_async as read_audit_async
    from .approvals import resume as resume
    from .approvals import resume_async as resume_async
    from .approvals.hook import ApprovalHook as ApprovalHook
    from .context import offload_context as offload_context
    from .errors import CreateOutcomeUnknownError as CreateOutcomeUnknownError
    from .errors import DocumentExistsError as DocumentExistsError
    from .errors import ExclusiveCreatesUnsupportedError as ExclusiveCreatesUnsupportedError
    from .errors import InvalidReferenceError as InvalidReferenceError
    from .errors import InvalidScopeIdError as InvalidScopeIdError
    from .errors import OffloadError as OffloadError
    from .errors import QuotaExceededError as QuotaExceededError
    from .errors import ResultExpiredError as ResultExpiredError
    from .errors import ResultNotFoundError as ResultNotFoundError
    from .errors import StorageError as StorageError
    from .errors import StoragePermissionError as StoragePermissionError
    from .errors import StorageUnavailableError as StorageUnavailableError
    from .hooks import OffloadCompactionHook as OffloadCompactionHook
    from .hooks import OffloadHook as OffloadHook
    from .stores import FsspecToolResultStore as FsspecToolResultStore
    from .stores import Quota as Quota
    from .stores import Retention as Retention
    from .stores import RetryPolicy as RetryPolicy
    from .stores import end_session as end_session
    from .stores import end_session_async as end_session_async
    from .tools import ListToolResults as ListToolResults
    from .tools import ReadBackToolError as ReadBackToolError
    from .tools import ReadToolResult as ReadToolResult
    from .tools import list_tool_results as list_tool_results
    from .tools import read_tool_result as read_tool_result
else:
    _module = LazyImporter(name=__name__, module_file=__file__, import_structure=_import_structure)
    # LazyImporter lists the submodules in __all__ too; the public surface is the names alone.
    _module.__all__ = sorted(name for names in _import_structure.values() for name in names)
    sys.modules[__name__] = _module
