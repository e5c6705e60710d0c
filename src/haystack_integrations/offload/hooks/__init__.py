"""
When things happen: the offload and compaction hooks, both writing into the store each run brings.

`ApprovalHook` lives with the rest of approvals (`haystack_integrations.offload.approvals.hook`).
"""

import sys
from typing import TYPE_CHECKING

from lazy_imports import LazyImporter

_import_structure = {
    "compaction": ["OffloadCompactionHook"],
    "offload": ["OffloadHook"],
}

if TYPE_CHECKING:
    from .compaction import OffloadCompactionHook as OffloadCompactionHook
    from .offload import OffloadHook as OffloadHook
else:
    _module = LazyImporter(name=__name__, module_file=__file__, import_structure=_import_structure)
    # LazyImporter lists the submodules in __all__ too; the public surface is the names alone.
    _module.__all__ = sorted(name for names in _import_structure.values() for name in names)
    sys.modules[__name__] = _module
