"""Where offloaded results go: the fsspec store, its scopes, references and object names."""

from haystack_integrations.offload.stores.documents import SessionDocuments
from haystack_integrations.offload.stores.fsspec_store import DEFAULT_S3_MAX_POOL_CONNECTIONS, FsspecToolResultStore
from haystack_integrations.offload.stores.records import StoredResult

__all__ = ["DEFAULT_S3_MAX_POOL_CONNECTIONS", "FsspecToolResultStore", "SessionDocuments", "StoredResult"]
