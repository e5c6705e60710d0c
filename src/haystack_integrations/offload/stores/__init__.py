"""Where offloaded results go: the fsspec store, its scopes, references and object names."""

import sys
from typing import TYPE_CHECKING

from lazy_imports import LazyImporter

_import_structure = {
    "azure_sas": ["DirectorySasCredentials"],
    "credentials": ["AssumeRoleCredentials"],
    "documents": ["SessionDocuments"],
    "encryption": ["MIN_MASTER_SECRET_CHARACTERS", "TenantKeys"],
    # What a server checks in its settings at start-up, by the store's own rules (the reference app's settings).
    "exclusive_creates": ["ExclusiveCreateCheck"],
    "filesystem_handle": ["DEFAULT_S3_MAX_POOL_CONNECTIONS"],
    "gcs_credentials": ["DownscopedCredentials"],
    "fsspec_store": ["FsspecToolResultStore"],
    "operator_objects": ["ScopeChildren"],
    "options": ["check_region", "redacted_url", "with_s3_choices", "with_timeouts"],
    "purging": ["end_session", "end_session_async"],
    "pending": ["PendingWrite"],
    "quotas": ["Quota"],
    "records": ["StoredResult"],
    "retention": ["Retention"],
    "retry": ["RetryPolicy", "RetryStats"],
    "scope": ["validate_scope_id"],
    "usage_marks": ["MarkedUsage"],
}

if TYPE_CHECKING:
    from .azure_sas import DirectorySasCredentials as DirectorySasCredentials
    from .credentials import AssumeRoleCredentials as AssumeRoleCredentials
    from .documents import SessionDocuments as SessionDocuments
    from .encryption import MIN_MASTER_SECRET_CHARACTERS as MIN_MASTER_SECRET_CHARACTERS
    from .encryption import TenantKeys as TenantKeys
    from .exclusive_creates import ExclusiveCreateCheck as ExclusiveCreateCheck
    from .filesystem_handle import DEFAULT_S3_MAX_POOL_CONNECTIONS as DEFAULT_S3_MAX_POOL_CONNECTIONS
    from .fsspec_store import FsspecToolResultStore as FsspecToolResultStore
    from .gcs_credentials import DownscopedCredentials as DownscopedCredentials
    from .operator_objects import ScopeChildren as ScopeChildren
    from .options import check_region as check_region
    from .options import redacted_url as redacted_url
    from .options import with_s3_choices as with_s3_choices
    from .options import with_timeouts as with_timeouts
    from .pending import PendingWrite as PendingWrite
    from .purging import end_session as end_session
    from .purging import end_session_async as end_session_async
    from .quotas import Quota as Quota
    from .records import StoredResult as StoredResult
    from .retention import Retention as Retention
    from .retry import RetryPolicy as RetryPolicy
    from .retry import RetryStats as RetryStats
    from .scope import validate_scope_id as validate_scope_id
    from .usage_marks import MarkedUsage as MarkedUsage
else:
    _module = LazyImporter(name=__name__, module_file=__file__, import_structure=_import_structure)
    # LazyImporter lists the submodules in __all__ too; the public surface is the names alone.
    _module.__all__ = sorted(name for names in _import_structure.values() for name in names)
    sys.modules[__name__] = _module
