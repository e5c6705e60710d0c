"""Validation of what names a store's scope: its root URL, and the tenant and session ids (one path segment each)."""

import re

import fsspec

from haystack_integrations.offload.errors import InvalidScopeIdError

MAX_SCOPE_ID_LENGTH = 128

# Conservative on purpose: the same id must be a safe S3 key segment, a safe file name on every OS and safe inside a
# URL. Applications with richer ids (emails, display names) should map them to a slug or a UUID first.
_ALLOWED = re.compile(r"[A-Za-z0-9._@+=-]+")
# A scheme-like first segment followed by a colon or by two slashes: "s3:/bucket", "s3:bucket", "s3//bucket".
_URL_LIKE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+)(?P<separator>:[/\\]*|//+)(?P<rest>.*)", re.DOTALL)
# fsspec itself strips "file:" and "local:" from local paths, so "file:/tmp/results" already means what it says.
_LOCAL_SCHEMES = frozenset({"file", "local"})


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


def check_local_path(path: str) -> str:
    """
    Return `path` unless it is a local path that can only be a mistyped URL.

    fsspec takes anything without ``://`` for a local path, so ``s3:/bucket/prod`` (one slash), ``s3//bucket`` (no
    colon) or ``s3:bucket`` would quietly become a local directory named ``s3:`` (or ``s3``) in the working directory,
    and every tenant's results would land on the server's disk. Such a path is refused when its first segment is a
    protocol fsspec knows (``s3``, ``gs``, ``memory``, ...). A local directory that really has such a name can still
    be used, written as ``./s3:/...``, as an absolute path, or as ``file://...``.

    :param path: The store's URL, when it names no protocol (``://``).
    :returns: `path`, unchanged.
    :raises ValueError: If `path` looks like a URL with a typo; the message names what was probably meant.
    """
    match = _URL_LIKE.fullmatch(path)
    if match is None:
        return path
    scheme = match["scheme"].lower()
    if scheme not in _known_protocols() or (scheme in _LOCAL_SCHEMES and match["separator"].startswith(":")):
        return path
    meant = f"{scheme}://{match['rest'].lstrip('/')}"
    raise ValueError(
        f"The store URL {path!r} names no protocol (no '://'), so it would be a local directory named "
        f"{path.split('/', 1)[0]!r} in the working directory. Did you mean {meant!r}? For a local directory of that "
        f"name, write it as {'./' + path!r} or as an absolute path."
    )


def _known_protocols() -> set[str]:
    # Both the protocols fsspec ships implementations for and those registered by installed packages.
    return {protocol.lower() for protocol in (*fsspec.available_protocols(), *fsspec.registry)}


def check_object_store_path(url: str, path: str) -> None:
    """
    Refuse an object store URL with an empty segment in its path (``s3://bucket//prod``, ``s3://bucket/prod//acme``).

    On a local disk ``a//b`` is ``a/b``; in an object store it is another key, which the two engines and S3-compatible
    servers list and delete differently (the doctor's listing and batch-delete checks fail there), so it is never
    what was meant.

    :param url: The store's URL, for the message.
    :param path: Its path, without the protocol.
    :raises ValueError: If a segment between two slashes is empty.
    """
    inner = path.strip("/")
    if inner and "" in inner.split("/"):  # no path at all is another mistake, named where the path is required
        meant = "/".join(segment for segment in path.split("/") if segment)
        raise ValueError(f"The store URL {url!r} has an empty path segment ('//'); did you mean {meant!r}?")
