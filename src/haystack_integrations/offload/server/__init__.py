"""
The reference multi-tenant server: one shared Agent, stateless workers, everything per session in the store.

The web parts (`create_app`) need the ``server`` extra: ``pip install "offload-haystack[server]"``. The service,
history and agent modules do not, so the demo runs on a plain install.
"""

import sys
from typing import TYPE_CHECKING

from lazy_imports import LazyImporter

_import_structure = {
    "agent": ["build_agent"],
    "app": ["create_app", "app_from_environment"],
    "auth": ["Caller", "TokenTable"],
    "history": ["SessionBusyError", "SessionHistory"],
    "progress": ["TurnProgress"],
    "service": ["ChatService"],
    "settings": ["ServerSettings"],
}

if TYPE_CHECKING:
    from .agent import build_agent as build_agent
    from .app import app_from_environment as app_from_environment
    from .app import create_app as create_app
    from .auth import Caller as Caller
    from .auth import TokenTable as TokenTable
    from .history import SessionBusyError as SessionBusyError
    from .history import SessionHistory as SessionHistory
    from .progress import TurnProgress as TurnProgress
    from .service import ChatService as ChatService
    from .settings import ServerSettings as ServerSettings
else:
    _module = LazyImporter(name=__name__, module_file=__file__, import_structure=_import_structure)
    # LazyImporter lists the submodules in __all__ too; the public surface is the names alone.
    _module.__all__ = sorted(name for names in _import_structure.values() for name in names)
    sys.modules[__name__] = _module
