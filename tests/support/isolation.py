"""Isolation per tenant for tests on RGW: STS credentials from the lane's role and an SSE-C key per tenant."""

import os
from typing import Any

# Isolation needs RGW's STS: an external bucket of the real-S3 lane has no role to assume here.
RGW_LANE = os.environ.get("OFFLOAD_TEST_REAL_S3", "").strip().lower() == "rgw"
TEST_MASTER_SECRET = "offload-haystack tests' SSE-C master secret, not a real one"  # noqa: S105


def isolation_kwargs(role_arn: str, *, sts_endpoint_url: str | None = None) -> dict[str, Any]:
    """A store's ``credentials`` and ``encryption`` arguments: every tenant signs as itself and has its own key."""
    from haystack.utils import Secret

    from haystack_integrations.offload.stores import AssumeRoleCredentials, TenantKeys

    return {
        "credentials": AssumeRoleCredentials(role_arn, sts_endpoint_url=sts_endpoint_url),
        "encryption": TenantKeys(Secret.from_token(TEST_MASTER_SECRET)),
    }
