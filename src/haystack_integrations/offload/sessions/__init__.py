"""
Durable conversations for a server with many workers: per-session history with turn claims, and the turn runner.

`ChatService` is what a web handler calls per request (a message, a decision, a resume, a page of a result), with the
session's store; `SessionHistory` is the history it keeps. Any worker serves any turn: all state is in the store.
"""

import sys
from typing import TYPE_CHECKING

from lazy_imports import LazyImporter

_import_structure = {
    "errors": [
        "ApprovalPendingConflict",
        "InvalidMessageError",
        "NotFoundError",
        "NothingToResumeError",
        "RunFailedError",
    ],
    "history": ["SessionBusyError", "SessionHistory", "TurnAbandonedError"],
    "progress": ["TurnProgress"],
    "service": ["ChatService", "DecisionOutcome", "ResultPage", "SessionSummary", "Transcript", "TurnOutcome"],
}

if TYPE_CHECKING:
    from .errors import ApprovalPendingConflict as ApprovalPendingConflict
    from .errors import InvalidMessageError as InvalidMessageError
    from .errors import NotFoundError as NotFoundError
    from .errors import NothingToResumeError as NothingToResumeError
    from .errors import RunFailedError as RunFailedError
    from .history import SessionBusyError as SessionBusyError
    from .history import SessionHistory as SessionHistory
    from .history import TurnAbandonedError as TurnAbandonedError
    from .progress import TurnProgress as TurnProgress
    from .service import ChatService as ChatService
    from .service import DecisionOutcome as DecisionOutcome
    from .service import ResultPage as ResultPage
    from .service import SessionSummary as SessionSummary
    from .service import Transcript as Transcript
    from .service import TurnOutcome as TurnOutcome
else:
    _module = LazyImporter(name=__name__, module_file=__file__, import_structure=_import_structure)
    # LazyImporter lists the submodules in __all__ too; the public surface is the names alone.
    _module.__all__ = sorted(name for names in _import_structure.values() for name in names)
    sys.modules[__name__] = _module
