"""
Durable conversations for a server with many workers: per-session history with turn claims, and the turn runner.

`ChatService` is what a web handler calls per request (a message, a decision, a resume, a page of a result), with the
session's store; `SessionHistory` is the history it keeps. Any worker serves any turn: all state is in the store.
Every error the service raises is importable from here, the approval errors `ChatService.decide` passes on included, so
an app built on this package alone can map each to its HTTP status.
"""

import sys
from typing import TYPE_CHECKING

from lazy_imports import LazyImporter

_import_structure = {
    # The approval errors `ChatService.decide` raises, as approvals defines them (the same classes, not subclasses).
    # LazyImporter imports "." + key relative to this package, so ".approvals.errors" is
    # haystack_integrations.offload.approvals.errors, imported when one of them is first used.
    ".approvals.errors": ["ApprovalAlreadyDecidedError", "ApprovalExpiredError", "InvalidApprovalEditError"],
    "errors": [
        "ApprovalPendingConflict",
        "InvalidMessageError",
        "NotFoundError",
        "NothingToResumeError",
        "RunFailedError",
        "SessionBusyError",
        "TurnAbandonedError",
    ],
    "conversation_cache": ["ConversationCache"],
    "history": ["SessionHistory"],
    "progress": ["OffloadProgressHook", "ToolCallProgressHook", "ToolResultProgressHook", "TurnProgress"],
    "outcomes": [
        "DecisionOutcome",
        "ResultPage",
        "SessionSummary",
        "Transcript",
        "TurnOutcome",
        "media_type_of",
        "record_named",
    ],
    "service": ["DEFAULT_PAGE_BYTES", "MAX_PAGE_BYTES", "ChatService"],
}

if TYPE_CHECKING:
    from haystack_integrations.offload.approvals.errors import (
        ApprovalAlreadyDecidedError as ApprovalAlreadyDecidedError,
    )
    from haystack_integrations.offload.approvals.errors import ApprovalExpiredError as ApprovalExpiredError
    from haystack_integrations.offload.approvals.errors import InvalidApprovalEditError as InvalidApprovalEditError

    from .conversation_cache import ConversationCache as ConversationCache
    from .errors import ApprovalPendingConflict as ApprovalPendingConflict
    from .errors import InvalidMessageError as InvalidMessageError
    from .errors import NotFoundError as NotFoundError
    from .errors import NothingToResumeError as NothingToResumeError
    from .errors import RunFailedError as RunFailedError
    from .errors import SessionBusyError as SessionBusyError
    from .errors import TurnAbandonedError as TurnAbandonedError
    from .history import SessionHistory as SessionHistory
    from .outcomes import DecisionOutcome as DecisionOutcome
    from .outcomes import ResultPage as ResultPage
    from .outcomes import SessionSummary as SessionSummary
    from .outcomes import Transcript as Transcript
    from .outcomes import TurnOutcome as TurnOutcome
    from .outcomes import media_type_of as media_type_of
    from .outcomes import record_named as record_named
    from .progress import OffloadProgressHook as OffloadProgressHook
    from .progress import ToolCallProgressHook as ToolCallProgressHook
    from .progress import ToolResultProgressHook as ToolResultProgressHook
    from .progress import TurnProgress as TurnProgress
    from .service import DEFAULT_PAGE_BYTES as DEFAULT_PAGE_BYTES
    from .service import MAX_PAGE_BYTES as MAX_PAGE_BYTES
    from .service import ChatService as ChatService
else:
    _module = LazyImporter(name=__name__, module_file=__file__, import_structure=_import_structure)
    # LazyImporter lists the submodules in __all__ too; the public surface is the names alone.
    _module.__all__ = sorted(name for names in _import_structure.values() for name in names)
    sys.modules[__name__] = _module
