"""What tests need of any S3 server (moto's, Ceph RGW, a bucket of your own): store options, environment, a client."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

# The bucket the local servers create at start unless told another.
DEFAULT_BUCKET = "offload-results"
# What `S3Endpoint.environment` sets, in the order of its values: endpoint, access key, secret, region.
_ENVIRONMENT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")


class S3Endpoint:
    """
    An S3 endpoint with its keys and region, as the store, the AWS SDKs and boto3 take them.

    Subclasses set `region` and `_credentials` (access key, secret) and define `endpoint_url`.
    """

    region: str
    _credentials: tuple[str, str]
    _clients: dict[str, Any]
    # Whether a request signed with the wrong secret is refused (moto accepts any signature).
    checks_signatures = True

    @property
    def endpoint_url(self) -> str:
        """
        :returns: The URL to give S3 clients as their endpoint.
        """
        raise NotImplementedError

    def storage_options(self) -> dict[str, Any]:
        """
        Options for ``s3fs.S3FileSystem(**options)`` or ``FsspecToolResultStore(url, storage_options=options)``.

        :returns: A new dict on every call, so callers may add to it (e.g. ``config_kwargs``).
        :raises RuntimeError: If the server is not running.
        """
        key, secret = self._credentials
        return {
            "endpoint_url": self.endpoint_url,
            "key": key,
            "secret": secret,
            "client_kwargs": {"region_name": self.region},
        }

    def environment(self) -> dict[str, str]:
        """
        Environment variables that point AWS SDKs (botocore >= 1.31, hence s3fs and boto3) at this endpoint.

        :returns: ``AWS_ENDPOINT_URL``, credentials and region.
        :raises RuntimeError: If the server is not running.
        """
        values = (self.endpoint_url, *self._credentials, self.region)
        return dict(zip(_ENVIRONMENT_VARIABLES, values, strict=True))

    def client(self, service: str = "s3") -> Any:
        """
        A boto3 client for this endpoint, made once per service and shared (boto3 clients are thread-safe).

        :param service: The AWS service, ``"s3"`` by default.
        :returns: A ``botocore`` client with the endpoint's keys.
        :raises RuntimeError: If the server is not running.
        """
        if service not in self._clients:
            import boto3  # the local-s3 extra's; imported here so that the stores never need it

            key, secret = self._credentials
            # A private Session: boto3's module-level default session is shared, and not thread-safe to create.
            session = boto3.session.Session(
                aws_access_key_id=key, aws_secret_access_key=secret, region_name=self.region
            )
            self._clients[service] = session.client(service, endpoint_url=self.endpoint_url)
        return self._clients[service]


class _S3Server(S3Endpoint):
    """
    An `S3Endpoint` that runs the server itself, with a default `bucket`: started and stopped, or used in a `with`.

    Subclasses define `start` (returning the server) and `stop`.
    """

    bucket: str

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc_value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def bucket_url(self) -> str:
        """
        The default bucket as an fsspec URL.

        :returns: ``s3://<bucket>``.
        """
        return f"s3://{self.bucket}"
