"""
The logic behind the operator commands (``offload-haystack ls | cat | du | purge | audit | doctor``), apart from
argparse.

- `inventory`: one walk of a store's tree, each object classified as a result, a document or something else;
- `usage`: results, documents and bytes per tenant and session;
- `purge`: choosing what a purge deletes (a session, a tenant, results older than an age);
- `conformance`: the checks of ``doctor`` (what an object store must do for this library);

so scripts and tests can use the same functions the command line prints.
"""

from haystack_integrations.offload.operations.inventory import (
    LayoutReading,
    StoredObject,
    classify,
    delete,
    read_inside_layout,
    read_object,
    scan,
)
from haystack_integrations.offload.operations.purge import PurgePlan, parse_age, select_older_than, select_scope
from haystack_integrations.offload.operations.usage import StoreUsage, TenantUsage, Usage, usage

__all__ = [
    "LayoutReading",
    "PurgePlan",
    "StoreUsage",
    "StoredObject",
    "TenantUsage",
    "Usage",
    "classify",
    "delete",
    "parse_age",
    "read_inside_layout",
    "read_object",
    "scan",
    "select_older_than",
    "select_scope",
    "usage",
]
