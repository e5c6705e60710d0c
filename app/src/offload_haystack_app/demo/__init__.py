"""
What stands in for a team's own parts, apart from the production server: the scripted model (`scripted_model`) and
demo tools (`tools`), the target pattern in one page (`example`), and the checked multi-tenant demo behind
``offload-haystack demo`` (`runner`): no cloud account, no API key.
"""

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
