"""
What the obstore engine asks of AWS: the region a bucket lives in, and credentials from botocore's session.

The region is asked of S3 once when nothing configures it (what botocore's redirects learn); profiles are read as
s3fs reads them.
"""

from __future__ import annotations

import http.client
import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlsplit

__all__ = ["AWS_S3_ENDPOINT", "BotocoreCredentials", "botocore_available", "bucket_region"]

logger = logging.getLogger(__name__)

AWS_S3_ENDPOINT = "https://s3.amazonaws.com"


def bucket_region(bucket: str, *, endpoint: str = AWS_S3_ENDPOINT, timeout: float = 10.0) -> str | None:
    """
    Ask S3 which region holds `bucket`: one unsigned HEAD, whose answer (200, 301 or 403 alike) names it.

    :param bucket: The bucket's name.
    :param endpoint: Where to ask (AWS's global endpoint; a test server in tests).
    :param timeout: Seconds to wait for the answer.
    :returns: The region, or None if the answer does not say (the caller keeps its default).
    """
    parts = urlsplit(endpoint)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.netloc, timeout=timeout)
    try:
        connection.request("HEAD", f"{parts.path.rstrip('/')}/{quote(bucket)}")
        region = connection.getresponse().getheader("x-amz-bucket-region")
    except OSError as error:
        logger.warning("Could not ask S3 for the region of bucket %r (%s); using the default region.", bucket, error)
        return None
    finally:
        connection.close()
    return region or None


# How long obstore keeps one answer: botocore refreshes expiring credentials itself, so asking again is cheap.
CREDENTIALS_TTL = timedelta(minutes=5)


def botocore_available() -> bool:
    """Whether botocore (which s3fs brings) can be imported, so that profiles can be read."""
    try:
        import botocore.session  # noqa: F401
    except ImportError:
        return False
    return True


class BotocoreCredentials:
    """
    An obstore credential provider over ``botocore.session.Session(profile=...)``: the same chain as s3fs and the
    AWS CLI (environment, shared credentials and config files, SSO, assumed roles, containers, instance profiles).

    Building it reads the config files only; credentials are resolved on the first request.
    """

    def __init__(self, profile: str | None) -> None:
        """
        :param profile: The profile's name; None for botocore's default (``AWS_PROFILE``, else ``default``).
        :raises ValueError: If the profile does not exist in the shared config or credentials files.
        """
        import botocore.exceptions
        import botocore.session

        self.profile = profile
        self._session = botocore.session.Session(profile=profile)
        try:
            self.region: str | None = self._session.get_config_variable("region")
        except botocore.exceptions.ProfileNotFound as error:
            raise ValueError(f"No AWS profile {profile!r} in the shared config or credentials files.") from error
        self._credentials: Any = None
        self._lock = threading.Lock()

    def __call__(self) -> dict[str, Any]:
        """The current credentials, in obstore's form."""
        with self._lock:
            if self._credentials is None:
                self._credentials = self._session.get_credentials()
            credentials = self._credentials
        if credentials is None:
            raise PermissionError(f"No AWS credentials found for profile {self.profile or 'default'!r}.")
        frozen = credentials.get_frozen_credentials()
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.now(UTC) + CREDENTIALS_TTL,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(profile={self.profile!r})"
