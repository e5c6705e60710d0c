"""
Bearer tokens to tenants: the only place a request's tenant comes from.

Tokens are kept as SHA-256 digests, so the table in memory (and in a crash dump) holds no usable token, and a lookup
compares digests: how long it takes says nothing useful about a token an attacker is guessing.
"""

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

BEARER = "bearer"


@dataclass(frozen=True)
class Caller:
    """Who a request acts for: the tenant, and a label of the token used (for audit records, not a secret)."""

    tenant: str
    actor: str


class TokenTable:
    """
    Maps ``Authorization: Bearer <token>`` headers to callers.

    ```python
    table = TokenTable({"a-long-random-token-for-acme": "acme"})
    assert table.caller("Bearer a-long-random-token-for-acme").tenant == "acme"
    assert table.caller("Bearer wrong") is None
    ```

    Multi-user use: the table is the only source of a request's tenant; several tokens may name one tenant (a token
    per user or per client), and the caller's actor label (``<tenant>/token-<digest prefix>``) goes into the audit.
    """

    def __init__(self, tokens: Mapping[str, str]) -> None:
        """
        :param tokens: Token -> tenant id (already validated by `ServerSettings`).
        """
        self._callers: dict[str, Caller] = {}
        for token, tenant in tokens.items():
            digest = _digest(token)
            self._callers[digest] = Caller(tenant=tenant, actor=f"{tenant}/token-{digest[:8]}")

    def __len__(self) -> int:
        return len(self._callers)

    def tenants(self) -> set[str]:
        """The tenants that have at least one token."""
        return {caller.tenant for caller in self._callers.values()}

    def caller(self, authorization: str | None) -> Caller | None:
        """
        Find the caller of a request.

        :param authorization: The request's ``Authorization`` header, if any.
        :returns: The caller, or None when the header is missing, not a bearer token, or an unknown token.
        """
        if not authorization:
            return None
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != BEARER or not token:
            return None
        return self._callers.get(_digest(token))


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
