"""
Parsing of references: the strings `write` returns and the model hands back to `read`.

A reference is hostile input, accepted only in exactly the shape this library produces for the store's scope, so
containment follows from its structure, not from normalising a path.
"""

from haystack_integrations.offload.errors import InvalidReferenceError, InvalidScopeIdError
from haystack_integrations.offload.stores.names import parse_object_name
from haystack_integrations.offload.stores.scope import validate_scope_id

MAX_REFERENCE_LENGTH = 1024
_SCOPE_FIELDS = ("tenant", "session")


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
    fields = _SCOPE_FIELDS[scope_depth:] if scope_ids else ()
    for field, value in zip(fields, scope_ids, strict=True):
        try:
            validate_scope_id(value, field=field)
        except InvalidScopeIdError as error:
            raise InvalidReferenceError(
                f"The reference {_shown(reference)} is outside this store's scope: {error}"
            ) from error
    if parse_object_name(name) is None:
        raise InvalidReferenceError(
            f"The reference {_shown(reference)} does not name a stored result (expected a name such as "
            "'20261129T213400123456Z-5f3a9c1e.t.tool.key.txt', exactly as returned when the result was stored)."
        )
    return segments
