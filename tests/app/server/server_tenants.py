"""The two tenants of the server tests and their bearer tokens (importable by tests and fixtures alike)."""

ACME_TOKEN = "acme-token-0123456789abcdef"  # noqa: S105 - a test token for loopback test servers
GLOBEX_TOKEN = "globex-token-0123456789abcdef"  # noqa: S105 - as above
TOKENS = {ACME_TOKEN: "acme", GLOBEX_TOKEN: "globex"}


def bearer(token: str) -> dict[str, str]:
    """The Authorization header for `token`."""
    return {"Authorization": f"Bearer {token}"}
