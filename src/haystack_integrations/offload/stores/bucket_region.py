"""The AWS region a bucket lives in, asked of S3 once when nothing configures it (what botocore's redirects learn)."""

from __future__ import annotations

import http.client
import logging
from urllib.parse import quote, urlsplit

__all__ = ["AWS_S3_ENDPOINT", "bucket_region"]

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
