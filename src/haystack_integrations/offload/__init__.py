"""
offload-haystack: per-tenant, per-session tool-result offloading for Haystack Agents serving many users.

Names are imported lazily, like Haystack's own packages, so importing one part does not import every backend.
"""

import sys
from typing import TYPE_CHECKING

from lazy_imports import LazyImporter

_import_structure = {
    "context": ["offload_context"],
    "errors": [
        "DocumentExistsError",
        "InvalidReferenceError",
        "InvalidScopeIdError",
        "ResultNotFoundError",
        "StorageError",
        "StoragePermissionError",
    ],
    "stores": ["FsspecToolResultStore", "SessionDocuments", "StoredResult"],
}

if TYPE_CHECKING:
    from .context import offload_context as offload_context
    from .errors import DocumentExistsError as DocumentExistsError
    from .errors import InvalidReferenceError as InvalidReferenceError
    from .errors import InvalidScopeIdError as InvalidScopeIdError
    from .errors import ResultNotFoundError as ResultNotFoundError
    from .errors import StorageError as StorageError
    from .errors import StoragePermissionError as StoragePermissionError
    from .stores import FsspecToolResultStore as FsspecToolResultStore
    from .stores import SessionDocuments as SessionDocuments
    from .stores import StoredResult as StoredResult
else:
    sys.modules[__name__] = LazyImporter(name=__name__, module_file=__file__, import_structure=_import_structure)
