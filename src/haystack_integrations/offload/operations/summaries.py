"""
Usage without a walk, where quota'd writers keep usage marks: a tenant's, or every tenant's of a root, from their marks
and a listing by delimiter of the names below (one LIST per 1000), whatever number of objects lies deeper.
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from haystack_integrations.offload.operations.inventory import require_root, scan
from haystack_integrations.offload.operations.usage import TenantUsage, usage
from haystack_integrations.offload.stores import FsspecToolResultStore, MarkedUsage, validate_scope_id

# Tenants asked for their marks first: a root none of whose first tenants keeps one is walked as before.
PROBED_TENANTS = 8
# Tenants read at once (each a LIST of one key and a GET, or a walk of a tenant without a mark).
CONCURRENT_TENANTS = 16


@dataclass(frozen=True)
class TenantSummary:
    """A tenant as its newest usage mark and a listing of its sessions' names say: no walk of its objects."""

    tenant: str
    sessions: list[str]
    """The sessions' ids, sorted (a delimiter listing: one LIST per 1000 sessions on S3)."""
    marked: MarkedUsage
    """The tenant's totals, as of its writers' last marks (see `MarkedUsage` for what they do not show yet)."""


def summarize_tenant(root: FsspecToolResultStore, tenant: str) -> TenantSummary | None:
    """
    A tenant's summary where quota'd writers keep usage marks: its totals from the newest mark (one LIST and one GET)
    and its sessions from a listing by delimiter, whatever number of objects it holds.

    :param root: An unscoped store.
    :param tenant: The tenant.
    :returns: The summary; None if the tenant has no usage mark (walk it with `scan` then).
    :raises ValueError: If `root` is scoped.
    :raises InvalidScopeIdError: If `tenant` is not a safe path segment.
    :raises StorageError: If the backend fails.
    """
    require_root(root)
    marked = root.marked_usage(validate_scope_id(tenant, field="tenant"))
    if marked is None:
        return None
    directories = root.for_tenant(tenant).find_children().directories
    return TenantSummary(tenant, [name for name in directories if _is_scope_id(name, "session")], marked)


def _is_scope_id(name: str, field: str) -> bool:
    # A tenant's own directories (its usage marks) start with a dot, which no id may.
    try:
        validate_scope_id(name, field=field)
    except ValueError:
        return False
    return True


@dataclass
class RootSummary:
    """Every tenant of a root: from its usage mark where it keeps one, walked where it does not."""

    marked: dict[str, MarkedUsage] = field(default_factory=dict)
    walked: dict[str, TenantUsage] = field(default_factory=dict)

    @property
    def tenants(self) -> list[str]:
        """Every tenant, sorted."""
        return sorted([*self.marked, *self.walked])

    @property
    def results(self) -> int:
        """Results of every tenant (a mark's as of its writers' last marks)."""
        return sum(mark.results for mark in self.marked.values()) + sum(
            tenant.total.results for tenant in self.walked.values()
        )

    @property
    def size(self) -> int:
        """Bytes of results and documents of every tenant."""
        return sum(mark.size for mark in self.marked.values()) + sum(
            tenant.total.result_bytes + tenant.total.document_bytes for tenant in self.walked.values()
        )


def summarize_root(root: FsspecToolResultStore) -> RootSummary | None:
    """
    Every tenant of a root without a walk of the root: its tenants from a listing by delimiter, each one's totals from
    its newest usage mark (one LIST and one GET), a tenant without a mark walked on its own.

    Only where it serves: None (walk the root with `scan`) when the root holds anything but tenants' directories
    (objects of its own, prefixes that are no tenant id: what a walk reports and explains), or none of its first
    `PROBED_TENANTS` tenants keeps a mark (a root without quotas, where the walk is what it costs).

    :param root: An unscoped store.
    :returns: The summary, or None.
    :raises ValueError: If `root` is scoped.
    :raises StorageError: If the backend fails.
    """
    require_root(root)
    children = root.find_children()
    tenants = children.directories
    if children.objects or not tenants or not all(_is_scope_id(name, "tenant") for name in tenants):
        return None
    with ThreadPoolExecutor(CONCURRENT_TENANTS) as pool:
        probed = dict(zip(tenants[:PROBED_TENANTS], pool.map(root.marked_usage, tenants[:PROBED_TENANTS]), strict=True))
        if all(mark is None for mark in probed.values()):
            return None
        rest = tenants[PROBED_TENANTS:]
        marks = {**probed, **dict(zip(rest, pool.map(root.marked_usage, rest), strict=True))}
        unmarked = [tenant for tenant, mark in marks.items() if mark is None]
        walks = pool.map(lambda tenant: usage(scan(root, tenant=tenant)).tenants.get(tenant), unmarked)
        walked = {tenant: found or TenantUsage(tenant) for tenant, found in zip(unmarked, walks, strict=True)}
    return RootSummary({tenant: mark for tenant, mark in marks.items() if mark is not None}, walked)
