"""
Where objects sit below a store's root, in one place: every reader of a listing asks `place`; and the references
that name them, parsed as hostile input (`parse_reference`).

    <root>/<tenant>/<session>/<name>                  a result (or a temporary file of a local write)
    <root>/<tenant>/<session>/.<namespace>/<name>     a session document (or a temporary file of one)

Anything else (fewer or more levels, a tenant or session id that is not a safe segment, a namespace that is not a
dot-directory) is not the library's: listings skip it and operators' commands keep it.
"""

from typing import NamedTuple

from haystack_integrations.offload.errors import InvalidReferenceError, InvalidScopeIdError
from haystack_integrations.offload.stores.names import is_object_name
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


# A reference is accepted only in exactly the shape this library produces for the store's scope, so containment
# follows from its structure, not from normalising a path.
MAX_REFERENCE_LENGTH = 1024


def _shown(reference: str) -> str:
    """Return a short, printable form of a (possibly huge or binary-looking) reference for error messages."""
    return repr(reference[:80] + ("..." if len(reference) > 80 else ""))


def parse_reference(reference: object, *, scope_depth: int) -> tuple[str, ...]:
    """
    Split a reference into validated path segments relative to a store's scope.

    :param reference: The reference, as given by the caller (or the model).
    :param scope_depth: How many scope segments the store already has: 0 (root), 1 (tenant) or 2 (session).
    :returns: The segments to append to the store's scope path; the last one is an object name.
    :raises InvalidReferenceError: If the reference is not one this store could have produced.
    """
    if not isinstance(reference, str):
        raise InvalidReferenceError(f"A reference must be a string, got {type(reference).__name__}.")
    if not reference:
        raise InvalidReferenceError("The reference is empty.")
    if len(reference) > MAX_REFERENCE_LENGTH:
        raise InvalidReferenceError(f"The reference {_shown(reference)} is too long to be one of this store's.")
    if "://" in reference or reference.startswith(("/", "\\")) or (len(reference) > 1 and reference[1] == ":"):
        raise InvalidReferenceError(
            f"The reference {_shown(reference)} is an absolute path or URL; references are relative to this "
            "session's results, exactly as returned when the result was stored."
        )

    segments = tuple(reference.split("/"))
    allowed_lengths = {1, 3} if scope_depth == 0 else {3 - scope_depth}
    if len(segments) not in allowed_lengths:
        raise InvalidReferenceError(f"The reference {_shown(reference)} is outside this store's scope.")

    *scope_ids, name = segments
    fields = SCOPE_FIELDS[scope_depth:] if scope_ids else ()
    for field, value in zip(fields, scope_ids, strict=True):
        try:
            validate_scope_id(value, field=field)
        except InvalidScopeIdError as error:
            raise InvalidReferenceError(
                f"The reference {_shown(reference)} is outside this store's scope: {error}"
            ) from error
    if not is_object_name(name):
        raise InvalidReferenceError(
            f"The reference {_shown(reference)} does not name a stored result (expected a name such as "
            "'20261129T213400123456Z-5f3a9c1e.t.tool.key.txt', exactly as returned when the result was stored)."
        )
    return segments
