"""The scripted multi-tenant demo behind ``offload-haystack demo``: no cloud account, no API key."""

import sys
from typing import TYPE_CHECKING

from lazy_imports import LazyImporter

_import_structure = {
    "runner": ["DemoReport", "SessionOutcome", "run_demo", "run_demo_async", "session_marker"],
}

if TYPE_CHECKING:
    from .runner import DemoReport as DemoReport
    from .runner import SessionOutcome as SessionOutcome
    from .runner import run_demo as run_demo
    from .runner import run_demo_async as run_demo_async
    from .runner import session_marker as session_marker
else:
    _module = LazyImporter(name=__name__, module_file=__file__, import_structure=_import_structure)
    # LazyImporter lists the submodules in __all__ too; the public surface is the names alone.
    _module.__all__ = sorted(name for names in _import_structure.values() for name in names)
    sys.modules[__name__] = _module
