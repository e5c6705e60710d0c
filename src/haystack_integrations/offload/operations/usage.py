"""
Usage per tenant and session, from one scan: how many results and documents, how many bytes, how old.

Temporary files of local writes count too: a writer killed mid-write leaves one (it can be hundreds of megabytes)
until a purge removes it, and the disk it takes is the tenant's.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from haystack_integrations.offload.operations.inventory import StoredObject


@dataclass
class Usage:
    """What one session, one tenant or the whole store holds."""

    results: int = 0
    result_bytes: int = 0
    documents: int = 0
    document_bytes: int = 0
    temporary_files: int = 0
    temporary_bytes: int = 0
    oldest: datetime | None = None
    newest: datetime | None = None

    @property
    def total_bytes(self) -> int:
        """Bytes of results, documents and temporary files together: what the scope takes on disk."""
        return self.result_bytes + self.document_bytes + self.temporary_bytes

    def add(self, item: StoredObject) -> None:
        """
        Count one object.

        :param item: A result, a document or a temporary file (others are not counted).
        """
        if item.kind == "result":
            self.results += 1
            self.result_bytes += item.size
            if item.created is not None:
                self.oldest = item.created if self.oldest is None else min(self.oldest, item.created)
                self.newest = item.created if self.newest is None else max(self.newest, item.created)
        elif item.kind == "document":
            self.documents += 1
            self.document_bytes += item.size
        elif item.kind == "temporary":
            self.temporary_files += 1
            self.temporary_bytes += item.size

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values."""
        return {
            "results": self.results,
            "result_bytes": self.result_bytes,
            "documents": self.documents,
            "document_bytes": self.document_bytes,
            "temporary_files": self.temporary_files,
            "temporary_bytes": self.temporary_bytes,
            "total_bytes": self.total_bytes,
            "oldest_result": self.oldest.isoformat() if self.oldest else None,
            "newest_result": self.newest.isoformat() if self.newest else None,
        }


@dataclass
class TenantUsage:
    """A tenant's usage, with each of its sessions'."""

    tenant: str
    total: Usage = field(default_factory=Usage)
    sessions: dict[str, Usage] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values."""
        return {
            "tenant": self.tenant,
            **self.total.to_dict(),
            "sessions": {name: usage.to_dict() for name, usage in sorted(self.sessions.items())},
        }


@dataclass
class StoreUsage:
    """Usage of every tenant found, plus what the store holds that this library did not write."""

    tenants: dict[str, TenantUsage] = field(default_factory=dict)
    total: Usage = field(default_factory=Usage)
    other_objects: int = 0
    other_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON-ready values."""
        return {
            **self.total.to_dict(),
            "other_objects": self.other_objects,
            "other_bytes": self.other_bytes,
            "tenants": [usage.to_dict() for _, usage in sorted(self.tenants.items())],
        }


def usage(objects: Iterable[StoredObject]) -> StoreUsage:
    """
    Add up a scan per tenant and session.

    :param objects: What `scan` found.
    :returns: The usage.
    """
    found = StoreUsage()
    for item in objects:
        if item.kind == "other" or item.tenant is None or item.session is None:
            found.other_objects += 1
            found.other_bytes += item.size
            continue
        tenant = found.tenants.setdefault(item.tenant, TenantUsage(tenant=item.tenant))
        tenant.sessions.setdefault(item.session, Usage()).add(item)
        tenant.total.add(item)
        found.total.add(item)
    return found
