"""Where offloaded results go: the fsspec store, its scopes, references and object names."""

import sys
from typing import TYPE_CHECKING

from lazy_imports import LazyImporter

_import_structure = {
    "credentials": ["AssumeRoleCredentials"],
    "documents": ["SessionDocuments"],
    "encryption": ["TenantKeys"],
    "filesystem_handle": ["DEFAULT_S3_MAX_POOL_CONNECTIONS"],
    "fsspec_store": ["FsspecToolResultStore"],
    "purging": ["end_session", "end_session_async"],
    "pending": ["PendingWrite"],
    "quotas": ["Quota"],
    "records": ["StoredResult"],
    "retention": ["Retention"],
    "retry": ["RetryPolicy", "RetryStats"],
    "usage_marks": ["MarkedUsage"],
}

if TYPE_CHECKING:
    from .credentials import AssumeRoleCredentials as AssumeRoleCredentials
    from .documents import SessionDocuments as SessionDocuments
    from .encryption import TenantKeys as TenantKeys
    from .filesystem_handle import DEFAULT_S3_MAX_POOL_CONNECTIONS as DEFAULT_S3_MAX_POOL_CONNECTIONS
    from .fsspec_store import FsspecToolResultStore as FsspecToolResultStore
    from .pending import PendingWrite as PendingWrite
    from .purging import end_session as end_session
    from .purging import end_session_async as end_session_async
    from .quotas import Quota as Quota
    from .records import StoredResult as StoredResult
    from .retention import Retention as Retention
    from .retry import RetryPolicy as RetryPolicy
    from .retry import RetryStats as RetryStats
    from .usage_marks import MarkedUsage as MarkedUsage
else:
    _module = LazyImporter(name=__name__, module_file=__file__, import_structure=_import_structure)
    # LazyImporter lists the submodules in __all__ too; the public surface is the names alone.
    _module.__all__ = sorted(name for names in _import_structure.values() for name in names)
    sys.modules[__name__] = _module
