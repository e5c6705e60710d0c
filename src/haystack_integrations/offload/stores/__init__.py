"""Where offloaded results go: the fsspec store, its scopes, references and object names."""

from haystack_integrations.offload.stores.documents import SessionDocuments
from haystack_integrations.offload.stores.fsspec_store import (
    DEFAULT_S3_MAX_POOL_CONNECTIONS,
    FsspecToolResultStore,
    end_session,
    end_session_async,
)
from haystack_integrations.offload.stores.pending import PendingWrite
from haystack_integrations.offload.stores.quotas import Quota
from haystack_integrations.offload.stores.records import StoredResult
from haystack_integrations.offload.stores.retention import Retention
from haystack_integrations.offload.stores.retry import RetryPolicy, RetryStats

__all__ = [
    "DEFAULT_S3_MAX_POOL_CONNECTIONS",
    "FsspecToolResultStore",
    "PendingWrite",
    "Quota",
    "Retention",
    "RetryPolicy",
    "RetryStats",
    "SessionDocuments",
    "StoredResult",
    "end_session",
    "end_session_async",
]
