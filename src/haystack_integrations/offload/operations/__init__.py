"""
The logic behind the operator commands (``offload-haystack ls | cat | du | purge | audit | doctor``), apart from
argparse.

`inventory` walks a store's tree, `usage` sums it per tenant and session, `summaries` reads usage marks instead where
writers keep them, `purge` chooses what a purge deletes and `conformance` runs the checks of ``doctor``.
"""

from haystack_integrations.offload.operations.inventory import delete, read_inside_layout, read_object, scan
from haystack_integrations.offload.operations.purge import PurgePlan, parse_age, select_older_than, select_scope
from haystack_integrations.offload.operations.summaries import summarize_root, summarize_tenant
from haystack_integrations.offload.operations.usage import Usage, usage

# What the operator commands call; the records they return are named in their own modules.
__all__ = [
    "PurgePlan",
    "Usage",
    "delete",
    "parse_age",
    "read_inside_layout",
    "read_object",
    "scan",
    "select_older_than",
    "select_scope",
    "summarize_root",
    "summarize_tenant",
    "usage",
]
