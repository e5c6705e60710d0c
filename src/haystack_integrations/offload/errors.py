"""
Errors raised by offload-haystack.

Every error subclasses a built-in exception, so callers can catch what they already know::

    ValueError
    ├── InvalidScopeIdError        a tenant or session id that is not one safe path segment
    └── InvalidReferenceError      a reference that is malformed or points outside the store's scope
    OSError
    ├── StorageError               any other backend failure (network, throttling, bad endpoint, ...)
    ├── FileNotFoundError
    │   └── ResultNotFoundError    no result (or document) under this name in this store's scope
    ├── FileExistsError
    │   └── DocumentExistsError    a conditional create lost: the document was created by someone else first
    └── PermissionError
        └── StoragePermissionError the backend refused the request (credentials, IAM, ACLs)

Backend exceptions are chained (``raise ... from exc``): the message is safe to show to a model or an end user
(it never names the bucket or other tenants), the cause keeps the backend's full detail for logs.
"""


class InvalidScopeIdError(ValueError):
    """A tenant or session id is not a single, safe path segment."""


class InvalidReferenceError(ValueError):
    """A reference was refused: it is malformed or resolves outside the store's own scope. Nothing was read."""


class StorageError(OSError):
    """The storage backend failed for a reason other than a missing object or a refused permission."""


class DocumentExistsError(FileExistsError):
    """A conditional create found the document already there: another run or worker created it first."""


class ResultNotFoundError(FileNotFoundError):
    """No stored result exists under the reference within the store's scope."""


class StoragePermissionError(PermissionError):
    """The storage backend refused the request (missing or wrong credentials, an IAM policy, an ACL)."""
