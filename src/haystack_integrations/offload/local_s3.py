"""
Moved to :mod:`haystack_integrations.offload.testing.local_s3`; this module re-exports it for existing imports.

It is test infrastructure (moto's S3 server on loopback), so it lives beside the other local stand-ins in
``testing/``. ``python -m haystack_integrations.offload.local_s3`` still starts a server.
"""

from haystack_integrations.offload.testing.local_s3 import (
    ADMIN_USER,
    DEFAULT_BUCKET,
    LocalS3Process,
    LocalS3Server,
    RecordedRequest,
    RequestLog,
    local_s3_process,
    main,
)

__all__ = [
    "ADMIN_USER",
    "DEFAULT_BUCKET",
    "LocalS3Process",
    "LocalS3Server",
    "RecordedRequest",
    "RequestLog",
    "local_s3_process",
    "main",
]

if __name__ == "__main__":
    raise SystemExit(main())
