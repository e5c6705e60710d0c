"""
When things happen: the offload and compaction hooks, both writing into the store each run brings.

`ApprovalHook` lives with the rest of approvals (`haystack_integrations.offload.approvals.hook`).
"""

import sys
from typing import TYPE_CHECKING

from lazy_imports import LazyImporter

_import_structure = {
    "compaction": ["OffloadCompactionHook"],
    "compaction_rounds": ["COMPACTION_META_KEY"],
    "offload": ["OffloadHook"],
    "pointers": ["OFFLOADED_META_KEY"],
}

if TYPE_CHECKING:
    from .compaction import OffloadCompactionHook as OffloadCompactionHook
    from .compaction_rounds import COMPACTION_META_KEY as COMPACTION_META_KEY
    from .offload import OffloadHook as OffloadHook
    from .pointers import OFFLOADED_META_KEY as OFFLOADED_META_KEY
else:
    _module = LazyImporter(name=__name__, module_file=__file__, import_structure=_import_structure)
    # LazyImporter lists the submodules in __all__ too; the public surface is the names alone.
    _module.__all__ = sorted(name for names in _import_structure.values() for name in names)
    sys.modules[__name__] = _module
