"""Your own S3 bucket as the real-S3 lane's server (``OFFLOAD_TEST_REAL_S3=external``): every test below one prefix."""

import os
import uuid
from types import TracebackType
from typing import Any, Self

from haystack_integrations.offload.testing.endpoint import S3Endpoint

VARIABLES = ("OFFLOAD_TEST_S3_ENDPOINT", "OFFLOAD_TEST_S3_BUCKET", "OFFLOAD_TEST_S3_KEY", "OFFLOAD_TEST_S3_SECRET")


class ExternalS3(S3Endpoint):
    """
    An S3 endpoint and bucket the tests do not own: they write below ``offload-tests-<random>/``, removed at the end.

    :param endpoint_url: The S3 endpoint (``https://...``; ``http://`` for a local MinIO).
    :param bucket: An existing bucket the keys may write, list and delete in.
    :param key: The access key id.
    :param secret: The secret access key.
    :param region: The bucket's region.
    """

    def __init__(self, endpoint_url: str, bucket: str, key: str, secret: str, region: str = "us-east-1") -> None:
        self._endpoint_url = endpoint_url
        self.bucket = bucket
        self.region = region
        self.prefix = f"offload-tests-{uuid.uuid4().hex}"
        self._credentials = (key, secret)
        self._clients: dict[str, Any] = {}

    @property
    def endpoint_url(self) -> str:
        """The endpoint the tests talk to."""
        return self._endpoint_url

    @classmethod
    def from_environment(cls) -> "ExternalS3":
        """
        :returns: The endpoint the ``OFFLOAD_TEST_S3_*`` variables name.
        :raises RuntimeError: If one of them is missing.
        """
        missing = [name for name in VARIABLES if not os.environ.get(name)]
        if missing:
            raise RuntimeError(f"OFFLOAD_TEST_REAL_S3=external needs {', '.join(missing)} in the environment.")
        endpoint, bucket, key, secret = (os.environ[name] for name in VARIABLES)
        return cls(endpoint, bucket, key, secret, os.environ.get("OFFLOAD_TEST_S3_REGION") or "us-east-1")

    @property
    def bucket_url(self) -> str:
        """``s3://<bucket>/<prefix>``: tests add their own unique segment below it."""
        return f"s3://{self.bucket}/{self.prefix}"

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc_value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        client = self.client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=f"{self.prefix}/"):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
