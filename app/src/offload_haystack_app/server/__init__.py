"""
The reference multi-tenant server: a FastAPI app over the library's `sessions.ChatService`, with a web page.

One shared Agent, stateless workers, everything per session in the store; `app_from_environment` is the factory
``uvicorn --factory`` and ``offload-haystack serve`` start.
"""

import sys
from typing import TYPE_CHECKING

from lazy_imports import LazyImporter

_import_structure = {
    "agent": ["build_agent"],
    "app": ["create_app", "app_from_environment"],
    "auth": ["Caller", "TokenTable"],
    "settings": ["ServerSettings"],
}

if TYPE_CHECKING:
    from .agent import build_agent as build_agent
    from .app import app_from_environment as app_from_environment
    from .app import create_app as create_app
    from .auth import Caller as Caller
    from .auth import TokenTable as TokenTable
    from .settings import ServerSettings as ServerSettings
else:
    _module = LazyImporter(name=__name__, module_file=__file__, import_structure=_import_structure)
    # LazyImporter lists the submodules in __all__ too; the public surface is the names alone.
    _module.__all__ = sorted(name for names in _import_structure.values() for name in names)
    sys.modules[__name__] = _module
