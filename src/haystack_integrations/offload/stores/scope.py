"""Validation of the tenant and session ids that name a store's scope (one path segment each)."""

import re

from haystack_integrations.offload.errors import InvalidScopeIdError

MAX_SCOPE_ID_LENGTH = 128

# Conservative on purpose: the same id must be a safe S3 key segment, a safe file name on every OS and safe inside a
# URL. Applications with richer ids (emails, display names) should map them to a slug or a UUID first.
_ALLOWED = re.compile(r"[A-Za-z0-9._@+=-]+")


def validate_scope_id(value: object, *, field: str) -> str:
    """
    Return `value` if it is usable as a single path segment of a store scope, or raise naming the field.

    Refused: non-strings, empty values, values over `MAX_SCOPE_ID_LENGTH` characters, separators (`/`, `\\`), NUL and
    other control characters, `.` and `..`, a leading `.` (hidden entries), and any character outside
    ``A-Z a-z 0-9 . _ @ + = -``.

    :param value: The id to check.
    :param field: What the id is ("tenant", "session"), used in the error message.
    :returns: The id, unchanged.
    :raises TypeError: If `value` is not a string.
    :raises InvalidScopeIdError: If `value` is not a safe single path segment.
    """
    if not isinstance(value, str):
        raise TypeError(f"The {field} id must be a string, got {type(value).__name__}.")
    shown = repr(value[:40] + ("..." if len(value) > 40 else ""))
    if not value:
        raise InvalidScopeIdError(f"The {field} id must not be empty.")
    if len(value) > MAX_SCOPE_ID_LENGTH:
        raise InvalidScopeIdError(
            f"The {field} id {shown} is {len(value)} characters long; at most {MAX_SCOPE_ID_LENGTH} are allowed."
        )
    if "/" in value or "\\" in value:
        raise InvalidScopeIdError(f"The {field} id {shown} must be a single path segment: it contains a separator.")
    if any(ord(char) < 32 or ord(char) == 127 for char in value):
        raise InvalidScopeIdError(f"The {field} id {shown} contains NUL or another control character.")
    if value in {".", ".."}:
        raise InvalidScopeIdError(f"The {field} id {shown} is a relative path component, not a name.")
    if value.startswith("."):
        raise InvalidScopeIdError(f"The {field} id {shown} must not start with '.'.")
    if not _ALLOWED.fullmatch(value):
        bad = sorted({char for char in value if not _ALLOWED.fullmatch(char)})
        raise InvalidScopeIdError(
            f"The {field} id {shown} contains characters that are not allowed: {''.join(bad)!r}. "
            "Use letters, digits and . _ @ + = - (map other ids to a slug or a UUID)."
        )
    return value
