"""
What the tenant benchmarks (`scale_tenants.py`, `tenant_credentials.py`) share: the role a root store assumes per
tenant on moto, the SSE-C keys it derives per tenant, and the resident memory of the measuring process.

Imported by its siblings as ``import tenant_setup``: a script's own folder is first on ``sys.path``.
"""

from pathlib import Path

from haystack.utils import Secret

from haystack_integrations.offload.stores import TenantKeys

ROLE = "arn:aws:iam::123456789012:role/offload-tenants"
"""The role assumed per tenant on moto's STS (moto accepts any role of its default account)."""


def tenant_keys() -> TenantKeys:
    """
    :returns: SSE-C keys per tenant, derived from the benchmarks' master secret.
    """
    return TenantKeys(Secret.from_token("the benchmark's master secret, not a real one"))


def rss_mib() -> float:
    """
    :returns: This process's resident memory (``VmRSS``), in MiB.
    :raises RuntimeError: If ``/proc/self/status`` has no ``VmRSS`` line (not Linux).
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")
