"""
A local S3 endpoint for tests, benchmarks and the demo: moto's S3 server over real HTTP on loopback.

Every request the server answers is recorded in :attr:`LocalS3Server.requests`, so a test can assert on the traffic
itself. From a shell, ``python -m haystack_integrations.offload.testing.local_s3 --port 5000`` serves one.
"""

# Postponed annotations: signatures name werkzeug types, which are unbound when the extra is not installed.
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Self
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from haystack.lazy_imports import LazyImport

from haystack_integrations.offload.testing.endpoint import DEFAULT_BUCKET, _S3Server

with LazyImport(message="Run 'pip install \"offload-haystack[local-s3]\"'") as _local_s3_import:
    import boto3  # noqa: F401 - client() needs it; checked at construction, so the error names the extra
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

__all__ = ["LocalS3Process", "LocalS3Server", "RecordedRequest", "RequestLog", "local_s3_process", "main"]

# The IAM user that owns the bucket and creates other principals when IAM enforcement is on.
ADMIN_USER = "offload-local-admin"
# moto accepts any credentials unless IAM enforcement is switched on; these (access key, secret) are the conventional
# fakes, for a local, loopback-only server.
_FAKE_CREDENTIALS = ("testing", "testing")


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """
    One HTTP request the local S3 server answered.

    :param method: HTTP method, e.g. ``"GET"``.
    :param path: Decoded URL path; with path-style addressing ``/<bucket>/<key>``.
    :param query: Raw query string without ``?`` (``"list-type=2&prefix=..."`` for a ListObjectsV2).
    :param range: The ``Range`` request header, or ``None`` when the request had none.
    :param status: HTTP status answered, or ``None`` if the application failed before answering.
    :param bytes_sent: Response body bytes handed to the server for sending (headers not counted).
    :param headers: All request headers as ``(name, value)`` pairs, names in lower case.
    """

    method: str
    path: str
    query: str
    range: str | None
    status: int | None
    bytes_sent: int
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str | None:
        """
        Look up a request header.

        :param name: Header name, in any case.
        :returns: The header's value, or ``None`` when the request had no such header.
        """
        wanted = name.lower()
        return next((value for key, value in self.headers if key == wanted), None)

    @property
    def bucket(self) -> str | None:
        """
        The bucket addressed (path-style), or ``None`` for requests to the service root or moto's own API.

        :returns: The first path segment.
        """
        if self.path.startswith("/moto-api"):
            return None
        return self.path.lstrip("/").split("/", 1)[0] or None

    @property
    def key(self) -> str | None:
        """
        The object key addressed (path-style), or ``None`` for bucket-level requests such as listings.

        :returns: The path after the bucket segment.
        """
        if self.bucket is None:
            return None
        _, _, key = self.path.lstrip("/").partition("/")
        return key or None

    def __str__(self) -> str:
        query = f"?{self.query}" if self.query else ""
        extra = f" Range={self.range}" if self.range else ""
        return f"{self.method} {self.path}{query}{extra} -> {self.status} ({self.bytes_sent} B)"


class _Entry:
    """The mutable record of a request still being answered; frozen into a RecordedRequest on read."""

    __slots__ = ("bytes_sent", "headers", "method", "path", "query", "range", "status")

    def __init__(self, environ: WSGIEnvironment) -> None:
        self.method: str = environ.get("REQUEST_METHOD", "")
        # WSGI hands PATH_INFO over as UTF-8 bytes decoded as latin-1; undo that to get the real key.
        self.path: str = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
        self.query: str = environ.get("QUERY_STRING", "")
        self.range: str | None = environ.get("HTTP_RANGE")
        self.headers = _request_headers(environ)
        self.status: int | None = None
        self.bytes_sent = 0

    def freeze(self) -> RecordedRequest:
        # The slots are the record's fields, one for one.
        return RecordedRequest(**{name: getattr(self, name) for name in self.__slots__})


def _request_headers(environ: WSGIEnvironment) -> tuple[tuple[str, str], ...]:
    headers = [
        (key[5:].replace("_", "-").lower(), str(value)) for key, value in environ.items() if key.startswith("HTTP_")
    ]
    # CGI keeps these two out of the HTTP_ namespace.
    headers.extend(
        (name, str(environ[key]))
        for key, name in (("CONTENT_TYPE", "content-type"), ("CONTENT_LENGTH", "content-length"))
        if environ.get(key)
    )
    return tuple(sorted(headers))


class RequestLog:
    """
    A thread-safe log of the requests a :class:`LocalS3Server` answered, oldest first.

    A request is logged as soon as it arrives and its status and byte count are updated *before* the bytes go
    out, so once a client call has returned, its requests are complete in the log: no sleeping or polling.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[_Entry] = []

    def clear(self) -> None:
        """Forget every request logged so far."""
        with self._lock:
            self._entries = []

    def snapshot(self) -> list[RecordedRequest]:
        """
        Copy the log.

        :returns: The requests logged so far, oldest first, as immutable records.
        """
        with self._lock:
            return [entry.freeze() for entry in self._entries]

    def filter(
        self, method: str | None = None, path_contains: str | None = None, query_contains: str | None = None
    ) -> list[RecordedRequest]:
        """
        Select logged requests; every criterion given must match.

        :param method: HTTP method, in any case.
        :param path_contains: A substring of the decoded path, e.g. a test's unique prefix.
        :param query_contains: A substring of the raw query string, e.g. ``"list-type=2"`` for ListObjectsV2.
        :returns: The matching requests, oldest first.
        """
        wanted = method.upper() if method is not None else None
        return [
            request
            for request in self.snapshot()
            if (wanted is None or request.method == wanted)
            and (path_contains is None or path_contains in request.path)
            and (query_contains is None or query_contains in request.query)
        ]

    def count(
        self, method: str | None = None, path_contains: str | None = None, query_contains: str | None = None
    ) -> int:
        """
        Count logged requests; takes the same criteria as :meth:`filter`.

        :param method: HTTP method, in any case.
        :param path_contains: A substring of the decoded path.
        :param query_contains: A substring of the raw query string.
        :returns: How many requests match.
        """
        return len(self.filter(method=method, path_contains=path_contains, query_contains=query_contains))

    def methods(self, path_contains: str | None = None) -> Counter[str]:
        """
        Tally requests by HTTP method, for one-line assertions such as ``log.methods() == {"PUT": 1}``.

        :param path_contains: Only count requests whose decoded path contains this substring.
        :returns: A counter from method to number of requests.
        """
        return Counter(request.method for request in self.filter(path_contains=path_contains))

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __iter__(self) -> Iterator[RecordedRequest]:
        return iter(self.snapshot())

    def _begin(self, environ: WSGIEnvironment) -> _Entry:
        entry = _Entry(environ)
        with self._lock:
            self._entries.append(entry)
        return entry

    def _set_status(self, entry: _Entry, status: int) -> None:
        with self._lock:
            entry.status = status

    def _add_bytes(self, entry: _Entry, count: int) -> None:
        with self._lock:
            entry.bytes_sent += count


class _RecordingMiddleware:
    """WSGI middleware that logs each request into a :class:`RequestLog` while passing it through unchanged."""

    def __init__(self, app: WSGIApplication, log: RequestLog) -> None:
        self._app = app
        self._log = log

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        entry = self._log._begin(environ)

        def recording_start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            self._log._set_status(entry, int(status.split(None, 1)[0]))
            # moto adds `server: amazon.com` and werkzeug always sends its own Server header; aiohttp >= 3.13.4
            # (hence aiobotocore and s3fs) rejects a response with two ("Duplicate 'Server' header found",
            # moto issue #9930), which breaks every listing and error response. Keep werkzeug's.
            headers = [(name, value) for name, value in headers if name.lower() != "server"]
            write = start_response(status, headers, exc_info)

            # PEP 3333's legacy write() callable bypasses the returned iterable; count it too.
            def recording_write(data: bytes) -> object:
                self._log._add_bytes(entry, len(data))
                return write(data)

            return recording_write

        try:
            body = self._app(environ, recording_start_response)
        except BaseException:
            # werkzeug answers 500 itself through its own start_response, which we never see.
            self._log._set_status(entry, 500)
            raise
        return self._counted(body, entry)

    def _counted(self, body: Iterable[bytes], entry: _Entry) -> Iterator[bytes]:
        try:
            for chunk in body:
                # Count before yielding: the client can only see the bytes after this, so a test that
                # reads the log right after its call returns never sees a short count.
                self._log._add_bytes(entry, len(chunk))
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()


class _S3FirstDispatcher:
    """
    moto's dispatcher, with a direct route for requests SigV4-signed for S3.

    moto's `DomainDispatcherApplication` finds each request's service by matching the Host header against every
    backend's URL patterns, then parsing the Authorization header and matching again, all under one lock: about 1.4 ms
    of a busy server's CPU per request, most of what moto spends on a small PUT. A request signed for ``s3`` (and not
    for S3 Control) always lands in the S3 backend, so it goes straight to that app; anything else (IAM, STS, moto's
    own API, unsigned requests) takes moto's route. Both routes share moto's process-global backends and app cache.

    Conditional writes (``If-None-Match``, ``If-Match``) run one at a time: moto checks the condition, then writes,
    so two racing creates of one key could both succeed on a threaded server, where S3 lets exactly one through.
    """

    def __init__(self) -> None:
        self._dispatcher = DomainDispatcherApplication(create_backend_app)
        self._conditional_writes = threading.Lock()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") == "PUT" and ("HTTP_IF_NONE_MATCH" in environ or "HTTP_IF_MATCH" in environ):
            with self._conditional_writes:  # moto answers within the call: the condition and the write are one step
                return self._dispatch(environ, start_response)
        return self._dispatch(environ, start_response)

    def _dispatch(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        app = self._s3_app(environ) if _signed_for_s3(environ) else None
        if app is None:
            return self._dispatcher(environ, start_response)  # type: ignore[no-any-return]
        return app(environ, start_response)  # type: ignore[no-any-return]

    def _s3_app(self, environ: WSGIEnvironment) -> Any:
        cached = self._dispatcher.app_instances.get("s3")
        if cached is not None:
            return cached
        # The first S3 request creates the app through moto's own route, so both routes share one instance.
        return self._dispatcher.get_application(environ)


def _signed_for_s3(environ: WSGIEnvironment) -> bool:
    # `AWS4-HMAC-SHA256 Credential=<key>/<date>/<region>/s3/aws4_request, SignedHeaders=..., Signature=...`
    authorization = environ.get("HTTP_AUTHORIZATION", "")
    if not authorization.startswith("AWS4-HMAC-SHA256 Credential="):
        return False
    scope = authorization.split(",", 1)[0].split("=", 1)[1].split("/")
    if len(scope) != 5 or scope[3] != "s3":
        return False
    path = environ.get("PATH_INFO", "")
    # moto sends these to other backends (S3 Control, its own API, instance metadata) even when signed for s3.
    return not (
        path.startswith(("/v20180820/", "/moto-api", "/latest/")) or "s3-control" in environ.get("HTTP_HOST", "")
    )


def _request_handler(verbose: bool) -> type[WSGIRequestHandler]:
    if verbose:
        return MotoRequestHandler

    class _QuietMotoRequestHandler(MotoRequestHandler):
        # werkzeug prints one line per request to stderr when logging is unconfigured; the RequestLog
        # already has them, and test output should not.
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            return None

    return _QuietMotoRequestHandler


class LocalS3Server(_S3Server):
    """
    moto's S3 server on a loopback port, in a background thread, with every request recorded.

    Built like moto's ``ThreadedMotoServer``, with three differences: the socket is bound in :meth:`start`
    (so a busy port fails there and ``port=0`` is resolved before it returns), the WSGI app is wrapped to
    record requests in :attr:`requests`, and the default bucket exists once :meth:`start` returns.

    Usage example::

        with LocalS3Server() as server:
            store = FsspecToolResultStore(f"{server.bucket_url}/prod", storage_options=server.storage_options())
            ...
            assert server.requests.methods() == {"PUT": 1}

    One server can serve many concurrent clients (one thread per request), which is how tests for
    multi-user behaviour run many sessions against it at once.

    :param host: Interface to bind. Keep the default loopback address: the server accepts any credentials.
    :param port: TCP port; ``0`` picks a free one (read it back from :attr:`port`).
    :param bucket: Bucket created on start and after :meth:`reset`.
    :param region: Region the clients are configured for.
    :param verbose: Log one line per request through werkzeug's logger.
    :param enforce_iam: Check every request's signature and IAM permissions, as AWS does. :meth:`start` creates
        the bucket, then an admin IAM user (:data:`ADMIN_USER`, allowed everything) whose keys
        :meth:`storage_options`, :meth:`environment` and :meth:`client` use from then on; other principals are
        created through the IAM API (``server.client("iam")``). moto keeps this switch in a process-global setting:
        run such a server in its own process (see the module docstring). :meth:`stop` switches it back.
    """

    checks_signatures = False  # moto takes any signature

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        bucket: str = DEFAULT_BUCKET,
        *,
        region: str = "us-east-1",
        verbose: bool = False,
        enforce_iam: bool = False,
    ) -> None:
        _local_s3_import.check()
        self.host = host
        self.bucket = bucket
        self.region = region
        self.verbose = verbose
        self.enforce_iam = enforce_iam
        self.requests = RequestLog()
        self._requested_port = port
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._clients: dict[str, Any] = {}
        self._credentials = _FAKE_CREDENTIALS
        self._auth_before: str | None = None

    def start(self) -> Self:
        """
        Bind the port, start serving in a daemon thread and create the default bucket.

        :returns: The server itself, for chaining.
        :raises RuntimeError: If the server is already running.
        :raises OSError: If the port cannot be bound.
        """
        if self._server is not None:
            raise RuntimeError("LocalS3Server is already running")
        app = _RecordingMiddleware(_S3FirstDispatcher(), self.requests)
        self._server = make_server(
            self.host, self._requested_port, app, threaded=True, request_handler=_request_handler(self.verbose)
        )
        # A short poll interval keeps stop() quick; serve_forever only checks for shutdown between polls.
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"local-s3-{self.port}",
            daemon=True,
        )
        self._thread.start()
        try:
            self._set_up(enforce_iam=self.enforce_iam)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop serving, close the listening socket and wait for the server thread. Safe to call twice."""
        restore, self._auth_before = self._auth_before, None
        try:
            if restore is not None and self._server is not None:
                # Hand the process back as we found it: other moto users in it should not inherit the enforcement.
                self._set_auth_threshold(restore)
        finally:
            # Even if that failed, the server still stops (and the failure is raised afterwards).
            self._credentials = _FAKE_CREDENTIALS
            server, thread = self._server, self._thread
            self._server = self._thread = None
            self._clients = {}
            if server is not None:
                server.shutdown()
                # ThreadedMotoServer skips this and leaks the listening socket (a ResourceWarning under pytest).
                server.server_close()
            if thread is not None:
                thread.join()

    @property
    def port(self) -> int:
        """
        The bound TCP port.

        :returns: The port clients connect to.
        :raises RuntimeError: If the server is not running.
        """
        return self._running().server_port

    @property
    def endpoint_url(self) -> str:
        """
        The HTTP endpoint, e.g. ``http://127.0.0.1:54321``.

        :returns: The URL to give S3 clients as their endpoint.
        :raises RuntimeError: If the server is not running.
        """
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def create_bucket(self, name: str) -> None:
        """
        Create a bucket through the S3 API, as any client would.

        :param name: Bucket name.
        :raises botocore.exceptions.ClientError: If S3 refuses, e.g. the name is invalid.
        """
        kwargs: dict[str, Any] = {"Bucket": name}
        if self.region != "us-east-1":
            # us-east-1 is the one region that rejects an explicit LocationConstraint.
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        self.client().create_bucket(**kwargs)

    def reset(self) -> None:
        """
        Return to the just-started state: moto's state wiped, the default bucket re-created, the log emptied.

        Goes through moto's HTTP API (``POST /moto-api/reset``), like a test against a separate moto process would.
        It wipes *every* moto backend in this process, not just this server's buckets.

        :raises RuntimeError: If the server is not running.
        :raises urllib.error.URLError: If the server does not answer.
        """
        enforcing = self._auth_before is not None
        if enforcing:
            # The reset deletes the admin user too: stop enforcing until it exists again.
            self._set_auth_threshold("inf")
        self._post_to_moto("reset")
        self._set_up(enforce_iam=enforcing)

    def _set_up(self, *, enforce_iam: bool) -> None:
        """The just-started state, on a moto with no state: the default bucket, the admin user if asked, no log."""
        self.create_bucket(self.bucket)
        if enforce_iam:
            self._start_enforcing_iam()
        self.requests.clear()

    def _start_enforcing_iam(self) -> None:
        iam = self.client("iam")
        iam.create_user(UserName=ADMIN_USER)
        admin_policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName=ADMIN_USER, PolicyName="everything", PolicyDocument=json.dumps(admin_policy))
        key = iam.create_access_key(UserName=ADMIN_USER)["AccessKey"]
        self._credentials = (key["AccessKeyId"], key["SecretAccessKey"])
        self._clients = {}
        previous = self._set_auth_threshold("0")
        if self._auth_before is None:
            self._auth_before = previous

    def _set_auth_threshold(self, value: str) -> str:
        # moto's HTTP switch for INITIAL_NO_AUTH_ACTION_COUNT: requests are checked once that many have been served
        # since the switch ("0": from now on; "inf": never). It answers with the previous value.
        previous: str = json.loads(self._post_to_moto("reset-auth", value))["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"]
        return previous

    def _post_to_moto(self, action: str, text: str | None = None) -> bytes:
        """POST `text` (if any) to moto's own API at ``/moto-api/<action>``; returns the answer's body."""
        # Plain text, not form-encoded (urllib's default), or Flask consumes the body as a form and moto reads it empty.
        headers = {"Content-Type": "text/plain"} if text is not None else {}
        data = text.encode() if text is not None else None
        url = f"{self.endpoint_url}/moto-api/{action}"
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")  # noqa: S310 - our own http:// endpoint
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - our own http:// endpoint
            body: bytes = response.read()
        return body

    def _running(self) -> BaseWSGIServer:
        if self._server is None:
            raise RuntimeError("LocalS3Server is not running: call start() or use it as a context manager")
        return self._server


@dataclass(frozen=True)
class LocalS3Process:
    """
    What a local S3 server running in a process of its own printed at start-up.

    :param bucket_url: The bucket as an fsspec URL, ``s3://<bucket>``.
    :param storage_options: Options for s3fs / `FsspecToolResultStore` (endpoint and the keys to use).
    """

    bucket_url: str
    storage_options: dict[str, Any]

    @property
    def endpoint_url(self) -> str:
        """The HTTP endpoint clients connect to."""
        return str(self.storage_options["endpoint_url"])

    @property
    def bucket(self) -> str:
        """The bucket's name."""
        return self.bucket_url.removeprefix("s3://")


@contextlib.contextmanager
def local_s3_process(*, enforce_iam: bool = False, timeout: float = 30) -> Iterator[LocalS3Process]:
    """
    Run ``python -m haystack_integrations.offload.testing.local_s3`` in a process of its own, on a free loopback port.

    moto keeps state and its IAM switch per process, so a server that enforces IAM, or one that benchmarks load without
    slowing the client, belongs in its own process. The server is stopped with Ctrl-C (SIGINT) when the block ends.

    :param enforce_iam: Start it with ``--enforce-iam``.
    :param timeout: Seconds to wait for it to stop.
    :returns: A context manager yielding the printed settings.
    :raises RuntimeError: If the server exits before it is ready.
    """
    command = [sys.executable, "-m", "haystack_integrations.offload.testing.local_s3", "--port", "0", "--quiet"]
    if enforce_iam:
        command.append("--enforce-iam")
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and module, fixed arguments
        command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        if process.stdout is None:  # pragma: no cover - stdout=PIPE always gives one
            raise RuntimeError("no output from the local S3 process")
        settings: dict[str, str] = {}
        for line in process.stdout:
            name, _, value = line.partition(":")
            settings[name.strip()] = value.strip()
            if line.startswith("Press Ctrl-C"):
                break
        else:
            raise RuntimeError(f"the local S3 server exited early with code {process.wait()}")
        yield LocalS3Process(settings["Bucket URL"], json.loads(settings["storage_options"]))
        process.send_signal(signal.SIGINT)
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run a local S3 server until Ctrl-C: ``python -m haystack_integrations.offload.testing.local_s3``.

    :param argv: Command-line arguments; ``None`` reads ``sys.argv``.
    :returns: The process exit code.
    """
    parser = argparse.ArgumentParser(
        prog="python -m haystack_integrations.offload.testing.local_s3",
        description="Run moto's S3 server on loopback for offload-haystack development.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=5000, help="TCP port, 0 for any free one (default: %(default)s)")
    parser.add_argument("--bucket", default=DEFAULT_BUCKET, help="bucket to create (default: %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="do not log each request")
    parser.add_argument(
        "--enforce-iam",
        action="store_true",
        help=f"check signatures and IAM policies on every request; prints the keys of an admin user ({ADMIN_USER})",
    )
    args = parser.parse_args(argv)

    # SIGINT is how this server is stopped, so it must raise KeyboardInterrupt even where the parent left it ignored
    # (a non-interactive shell does so for every job it starts with `&`): Python installs its handler only otherwise.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Catch Ctrl-C around the whole run: it may arrive at any point, even mid-start or mid-print, and the
    # with-block stops the server whichever it is.
    try:
        with LocalS3Server(
            args.host, args.port, args.bucket, verbose=not args.quiet, enforce_iam=args.enforce_iam
        ) as server:
            print(f"Local S3 (moto) serving at {server.endpoint_url}")
            if server.enforce_iam:
                print(f"IAM enforced:    yes; the keys below are {ADMIN_USER}'s (allowed everything)")
            print(f"Bucket URL:      {server.bucket_url}")
            print(f"storage_options: {json.dumps(server.storage_options())}")
            print("Environment:")
            for name, value in server.environment().items():
                print(f"  export {name}={value}")
            print("Press Ctrl-C to stop.", flush=True)
            # Woken now and then: the kernel may hand SIGINT to a server thread, which only flags it for the main
            # thread, and an untimed wait would sleep through that flag.
            while True:
                time.sleep(0.2)
    except KeyboardInterrupt:
        print("Stopped.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
