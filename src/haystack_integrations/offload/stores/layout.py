"""
Where objects sit below a store's root, in one place: every reader of a listing asks `place`.

    <root>/<tenant>/<session>/<name>                  a result (or a temporary file of a local write)
    <root>/<tenant>/<session>/.<namespace>/<name>     a session document (or a temporary file of one)

Anything else (fewer or more levels, a tenant or session id that is not a safe segment, a namespace that is not a
dot-directory) is not the library's: listings skip it and operators' commands keep it.
"""

from typing import NamedTuple

from haystack_integrations.offload.stores.scope import validate_scope_id

# The fields of a scope, outermost first: a root store's scope is (), a tenant's (tenant,), a session's both.
SCOPE_FIELDS = ("tenant", "session")


class Placement(NamedTuple):
    """Where one object sits: its session, and its namespace if it is a document."""

    tenant: str
    session: str
    namespace: str | None  # None: directly in the session's directory (a result)
    name: str


def scope_path(root: str, scope: tuple[str, ...]) -> str:
    """
    :param root: The store's root path, as the filesystem spells it.
    :param scope: ``()``, ``(tenant,)`` or ``(tenant, session)``, already validated.
    :returns: The scope's directory.
    """
    return "/".join([root, *scope])


def below(found_path: str, directory: str) -> str | None:
    """
    A listed path relative to the listed directory, or None if it is not below it.

    Backends list by string prefix: the separator keeps a sibling prefix out (``t/ab`` when ``t/a`` was listed).

    :param found_path: A path from a listing.
    :param directory: The listed directory, without a trailing separator; ``""`` when the paths are relative already.
    :returns: The relative path, or None.
    """
    if not directory:
        return found_path
    prefix = directory.rstrip("/") + "/"
    return found_path[len(prefix) :] if found_path.startswith(prefix) else None


def place(relative: str, scope: tuple[str, ...] = ()) -> Placement | None:
    """
    Where an object sits, given its path relative to a scope's directory.

    :param relative: The path below the scope (``<tenant>/<session>/...`` below the root, ``...`` below a session).
    :param scope: The scope the path is relative to.
    :returns: Its placement, or None when the path is not a session's result or document slot.
    """
    parts = relative.split("/")
    ids = (*scope, *parts[: len(SCOPE_FIELDS) - len(scope)])
    inside = parts[len(SCOPE_FIELDS) - len(scope) :]
    if len(ids) != len(SCOPE_FIELDS) or not 1 <= len(inside) <= 2 or not _valid_ids(ids):
        return None
    if len(inside) == 1:
        return Placement(ids[0], ids[1], None, inside[0])
    directory, name = inside
    if not directory.startswith(".") or len(directory) < 2:
        return None
    return Placement(ids[0], ids[1], directory[1:], name)


def _valid_ids(ids: tuple[str, ...]) -> bool:
    try:
        for field, value in zip(SCOPE_FIELDS, ids, strict=True):
            validate_scope_id(value, field=field)
    except ValueError:
        return False
    return True
