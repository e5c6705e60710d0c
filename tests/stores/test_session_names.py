"""
STS session names (`role_session_name`) are injective over every tenant id the scope rules accept, and within STS's
alphabet and 64 characters: a deterministic corpus of ids, grown with adversarial ids built from other ids' names and
hashes (hypothesis is not installed here, so the corpus is generated from a fixed seed).
"""

import hashlib
import random
import re

import pytest

from haystack_integrations.offload.errors import InvalidScopeIdError
from haystack_integrations.offload.stores.credentials import role_session_name
from haystack_integrations.offload.stores.scope import MAX_SCOPE_ID_LENGTH, validate_scope_id

_STS_NAME = re.compile(r"[A-Za-z0-9_=,.@-]{2,64}")
_ALPHABET = "abcXYZ019._@+=-"
_LENGTHS = [1, 2, 3, 8, 28, 29, 30, 46, 47, 54, 55, 56, 57, 63, 64, 100, 127, MAX_SCOPE_ID_LENGTH]


def _accepted(candidate: str) -> bool:
    try:
        validate_scope_id(candidate, field="tenant")
    except InvalidScopeIdError:
        return False
    return True


def _seed_ids(count: int) -> list[str]:
    rng = random.Random(44)  # noqa: S311 - a reproducible corpus, not a secret
    ids = ["a+b", "a-b", "a,b", "acme", "x" * 55, "x" * 56, "+" * 55, "-" * 55, "+" * 56]
    for _ in range(count):
        length = rng.choice(_LENGTHS)
        ids.append("".join(rng.choice(_ALPHABET) for _ in range(length)))
    return ids


def _adversaries(tenant: str) -> list[str]:
    """Ids built to meet `tenant`'s name: from its name, its hashes (today's and the old 8-hex one) and spellings."""
    name = role_session_name(tenant)
    body = name.removeprefix("offload-")
    old_hash = hashlib.sha256(tenant.encode()).hexdigest()[:8]
    dashed = tenant.replace("+", "-")
    return [
        body,  # the name's own characters as an id
        body.replace(",", "+"),  # the spelling undone
        body.replace(",", "-"),
        f"{dashed[:46]}-{old_hash}",  # the old hashed form: "a+b" -> "a-b-300273da"
        f"{dashed}-{old_hash}",
        dashed,
        tenant.replace("-", "+"),
        body[:55],
        body[:56],
        tenant + "x",  # same head, different tail
        tenant[:-1] + ("+" if not tenant.endswith("+") else "-"),
        (tenant * 3)[:MAX_SCOPE_ID_LENGTH],
        f"{tenant[:29]}-{body[-26:]}",  # a hashed name's head and digest, as an id
    ]


def test_the_issues_pair_gets_two_session_names() -> None:
    assert role_session_name("a+b") != role_session_name("a-b-300273da")


@pytest.mark.parametrize(
    ("tenant", "expected"),
    [("acme", "offload-acme"), ("a+b", "offload-a,b"), ("a-b-300273da", "offload-a-b-300273da"), ("y" * 55, None)],
)
def test_a_short_id_reads_as_itself_in_the_session_name(tenant: str, expected: str | None) -> None:
    assert role_session_name(tenant) == (expected if expected is not None else f"offload-{tenant}")


def test_no_two_accepted_tenant_ids_share_a_session_name() -> None:
    corpus = {tenant for tenant in _seed_ids(600) if _accepted(tenant)}
    # Two rounds of adversaries: ids built from the names of ids that were themselves built from names.
    for _ in range(2):
        corpus |= {candidate for tenant in list(corpus) for candidate in _adversaries(tenant) if _accepted(candidate)}
    assert len(corpus) > 20_000
    owners: dict[str, str] = {}
    for tenant in sorted(corpus):
        name = role_session_name(tenant)
        assert _STS_NAME.fullmatch(name), (tenant, name)
        assert "+" not in name  # Ceph RGW refuses it
        other = owners.setdefault(name, tenant)
        assert other == tenant, f"{other!r} and {tenant!r} share the session name {name!r}"
