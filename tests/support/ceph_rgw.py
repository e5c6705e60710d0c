"""
A real S3 server for tests: a throwaway one-node Ceph RADOS Gateway (one mon, one memstore OSD, one radosgw).

Where :class:`~haystack_integrations.offload.testing.local_s3.LocalS3Server` models S3, this runs an implementation
of it on loopback, with signatures checked and its own answers to conditional requests. It keeps no request log.
It needs Debian's Ceph daemons (see :func:`ceph_available`), not systemd or containers: every file lives in one
temporary folder, never in ``/etc/ceph`` or ``/var/lib/ceph``. A cold start takes about 1.5 s, a stop 0.5 s.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self

from haystack.lazy_imports import LazyImport

from haystack_integrations.offload.testing.endpoint import DEFAULT_BUCKET, _S3Server

with LazyImport(message="Run 'pip install \"offload-haystack[local-s3]\"'") as _boto3_import:
    import boto3  # noqa: F401 - client() needs it; checked at construction, so the error names the extra

__all__ = ["APT_INSTALL", "DEFAULT_BUCKET", "CephRGWServer", "ceph_available"]

logger = logging.getLogger(__name__)

APT_INSTALL = "apt-get install -y --no-install-recommends ceph-mon ceph-osd radosgw ceph-common"
# Every binary the start runs, in the order it first needs them.
_BINARIES = ("ceph-authtool", "monmaptool", "ceph-mon", "ceph", "ceph-osd", "radosgw", "radosgw-admin")
_RGW_NAME = "client.rgw.test"
_USER_ID = "offload-tests"
_TAIL_LINES = 30
# Seconds a daemon gets to exit on SIGTERM before SIGKILL. Normally it needs 0.3 s at most, but one blocked on a full
# OSD never exits, and nothing in a throwaway cluster is worth waiting longer for.
_STOP_GRACE = 5.0

# Runs beside the daemons and outlives us: when our end of its stdin closes - stop() closed it, or this process
# died, even by SIGKILL - it kills the daemon pids it was sent and removes the folder. It only kills processes
# still in its own process group (the daemons join it), so a pid reused by an unrelated process is left alone,
# and it counts a zombie as gone: where PID 1 reaps no orphans (some containers), zombies are all that remain.
_WATCHDOG = """
import os, shutil, signal, sys, time
pids = [int(line) for line in sys.stdin]
group = os.getpgid(0)
def ours(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state, _, pgrp = stat.read().rpartition(")")[2].split()[:3]
    except OSError:
        return False
    return state != "Z" and int(pgrp) == group
for pid in filter(ours, pids):
    os.kill(pid, signal.SIGKILL)
deadline = time.monotonic() + 10
while any(map(ours, pids)) and time.monotonic() < deadline:
    time.sleep(0.05)
shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


def ceph_available() -> str | None:
    """
    Check that the Ceph binaries :class:`CephRGWServer` runs are installed.

    :returns: ``None`` when they all are on ``PATH``, else a sentence naming the first one missing and the
        ``apt-get`` command that installs them (for a skip or fail message).
    """
    for binary in _BINARIES:
        if shutil.which(binary) is None:
            return f"{binary} is not installed; on Debian or Ubuntu run: {APT_INSTALL}"
    return None


class _PortTaken(RuntimeError):
    """A daemon could not bind the port we picked for it: someone took it between our probe and its bind."""


class _Daemon:
    """One running Ceph daemon: its process and the files where it tells what went wrong."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], log: Path, output: Path) -> None:
        self.name = name
        self.process = process
        self.log = log
        self.output = output

    def tail(self) -> str:
        parts = [f"--- {path}\n{_tail(path)}" for path in (self.log, self.output) if path.exists()]
        return "\n".join(parts) or "(no log written)"

    def stop(self, timeout: float) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                logger.warning("%s ignored SIGTERM for %.0f s; killing it", self.name, timeout)
                self.process.kill()
        self.process.wait()


class CephRGWServer(_S3Server):
    """
    A one-node Ceph cluster serving S3 through radosgw on a free loopback port, with a bucket and a user of its own.

    Example::

        from haystack_integrations.offload.testing.ceph_rgw import CephRGWServer

        with CephRGWServer() as server:
            import s3fs

            fs = s3fs.S3FileSystem(**server.storage_options())
            fs.pipe_file(f"{server.bucket}/tenant-a/result.txt", b"hello", mode="create")

    Each server is a cluster of its own (own ports, folder and random keys), so several can run side by side, e.g.
    one per pytest-xdist worker. The OSD keeps objects in RAM (memstore): size ``memstore_bytes`` for the largest
    test data, because once it is full, PUTs **hang** (no error is returned; DELETEs of large objects too), while
    GETs still work.

    The daemons are stopped by :meth:`stop`, at interpreter exit, and, if this process dies without either (even by
    SIGKILL), by a small watchdog process that notices the end of its parent, kills them and removes the folder.
    Their logs are in ``directory / "log"`` while the server runs; a failed start quotes the relevant one.
    Differences from moto that tests meet: a 412 to ``If-None-Match: *`` has an empty message and no condition (s3fs
    then raises ``OSError(EINVAL)``, not ``FileExistsError``), and ``CompleteMultipartUpload`` ignores
    ``If-None-Match``. Any region signs correctly; clients must address buckets path-style (they do, by default,
    for an IP endpoint).

    :param bucket: The bucket created at start.
    :param region: The region clients sign for; RGW's default zonegroup accepts any, and expects no
        ``LocationConstraint``.
    :param memstore_bytes: RAM the OSD may fill with objects (and their metadata), 2 GiB by default; it is taken
        only as objects are written.
    :param timeout: Seconds each start step may take before the start is abandoned.
    :param sts: Serve STS (``AssumeRole``) and IAM on the S3 endpoint too, with a random ``rgw sts key``; roles are
        made with `create_role`.
    :raises ValueError: If ``memstore_bytes`` is not positive.
    """

    def __init__(
        self,
        bucket: str = DEFAULT_BUCKET,
        *,
        region: str = "us-east-1",
        memstore_bytes: int = 2 * 1024**3,
        timeout: float = 60.0,
        sts: bool = False,
    ) -> None:
        _boto3_import.check()
        if memstore_bytes <= 0:
            raise ValueError(f"memstore_bytes must be positive, not {memstore_bytes}")
        self.bucket = bucket
        self.region = region
        self.memstore_bytes = memstore_bytes
        self.timeout = timeout
        self.sts = sts
        self._directory: Path | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._daemons: list[_Daemon] = []
        self._mon_port = 0
        self._rgw_port = 0
        self._credentials = ("", "")
        self._clients: dict[str, Any] = {}
        self._owner_pid = os.getpid()

    # -- life cycle ---------------------------------------------------------------------------------------------

    def start(self) -> Self:
        """
        Create the cluster in a fresh temporary folder, start its daemons, create the user and the default bucket.

        :returns: The server itself, for chaining.
        :raises RuntimeError: If it is already running, a Ceph binary is missing, or a step fails or times out; the
            message names the step and ends with the tail of the relevant daemon's log. Nothing is left running.
        """
        if self._directory is not None:
            raise RuntimeError("CephRGWServer is already running")
        missing = ceph_available()
        if missing is not None:
            raise RuntimeError(missing)
        self._owner_pid = os.getpid()
        atexit.register(self.stop)
        try:
            try:
                self._start_cluster()
            except _PortTaken as exc:
                # Free ports are probed, then bound by the daemons later: another process can win that race. Rare,
                # so one retry on fresh ports is enough.
                logger.info("retrying the Ceph RGW start on other ports: %s", exc.args[0].splitlines()[0])
                self.stop()
                atexit.register(self.stop)
                self._start_cluster()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """
        Stop radosgw, the OSD and the mon (SIGTERM, in that order, waiting for each) and remove the folder.

        Safe to call twice, and on a server that failed to start. A daemon that ignores SIGTERM for 5 s (one
        blocked by a full OSD does) is killed.
        """
        atexit.unregister(self.stop)
        if os.getpid() != self._owner_pid:
            # A forked child inherited this object (and the atexit hook): the daemons are its parent's to stop.
            self._daemons, self._watchdog, self._directory = [], None, None
            return
        daemons, self._daemons = self._daemons, []
        watchdog, self._watchdog = self._watchdog, None
        directory, self._directory = self._directory, None
        self._clients = {}
        try:
            for daemon in reversed(daemons):
                daemon.stop(_STOP_GRACE)
        finally:
            if watchdog is not None:
                # Closing its stdin is the watchdog's signal; the daemons are gone, so it only removes the folder.
                _close(watchdog.stdin)
                watchdog.wait()
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)

    # -- what clients need --------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """
        The TCP port radosgw serves S3 on.

        :returns: The port clients connect to.
        :raises RuntimeError: If the server is not running.
        """
        self._running()
        return self._rgw_port

    @property
    def endpoint_url(self) -> str:
        """
        The HTTP endpoint, e.g. ``http://127.0.0.1:54321``.

        :returns: The URL to give S3 clients as their endpoint.
        :raises RuntimeError: If the server is not running.
        """
        return f"http://127.0.0.1:{self.port}"

    @property
    def directory(self) -> Path:
        """
        The temporary folder holding the cluster: its configuration, keyring, mon store and ``log/``.

        :returns: The folder's path; :meth:`stop` removes it.
        :raises RuntimeError: If the server is not running.
        """
        return self._running()

    @property
    def pids(self) -> dict[str, int]:
        """
        The daemons' process ids, e.g. to check their memory.

        :returns: A new dict from daemon name (``"mon.a"``, ``"osd.0"``, ``"client.rgw.test"``) to pid.
        """
        return {daemon.name: daemon.process.pid for daemon in self._daemons}

    def create_bucket(self, name: str) -> None:
        """
        Create a bucket through the S3 API, as any client would.

        No ``LocationConstraint`` is sent, whatever the region: RGW refuses any other than its zonegroup's name.

        :param name: Bucket name.
        :raises botocore.exceptions.ClientError: If S3 refuses, e.g. the name is invalid or taken.
        """
        self.client().create_bucket(Bucket=name)

    # -- the start, step by step ----------------------------------------------------------------------------------

    def _start_cluster(self) -> None:
        started = time.monotonic()
        directory = Path(tempfile.mkdtemp(prefix="ceph-rgw-"))
        self._directory = directory
        for sub in ("run", "log", "mon", "osd/osd.0", "rgw", "crash"):
            (directory / sub).mkdir(parents=True)
        self._start_watchdog(directory)
        self._mon_port, self._rgw_port = _free_port(), _free_port()
        fsid, osd_uuid = str(uuid.uuid4()), str(uuid.uuid4())
        conf = directory / "ceph.conf"
        conf.write_text(self._config(directory, fsid))
        self._make_keyring(directory / "keyring")
        self._make_mon(conf, directory, fsid)
        mon = self._spawn(conf, "mon.a", ["ceph-mon", "-i", "a"])
        # Listening is enough: the CLI retries until the mon answers (and _run notices if the mon dies meanwhile).
        self._wait("wait for the mon to listen", mon, lambda: _accepts(self._mon_port))
        self._run(
            conf, "register the OSD", ["ceph", "--connect-timeout", str(int(self.timeout)), "osd", "new", osd_uuid, "0"]
        )
        self._run(conf, "make the OSD", ["ceph-osd", "-i", "0", "--mkfs", "--osd-uuid", osd_uuid])
        osd = self._spawn(conf, "osd.0", ["ceph-osd", "-i", "0"])
        # radosgw would wait for the OSD by itself, but then a sick OSD would look like a sick radosgw.
        self._wait("wait for the OSD to come up", osd, lambda: self._osd_up(conf))
        rgw = self._spawn(conf, _RGW_NAME, ["radosgw", "-n", _RGW_NAME])
        self._wait("wait for radosgw to answer HTTP", rgw, lambda: _http_ok(self._rgw_port))
        self._create_user(conf)
        self.create_bucket(self.bucket)
        logger.debug("Ceph RGW ready at %s in %.2f s", self.endpoint_url, time.monotonic() - started)

    def _config(self, directory: Path, fsid: str) -> str:
        return f"""\
[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{self._mon_port}]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind retry count = 1
keyring = {directory}/keyring
run dir = {directory}/run
crash dir = {directory}/crash
log file = {directory}/log/$name.log
pid file = {directory}/run/$name.pid
mon data = {directory}/mon/$name
mon cluster log file = {directory}/log/cluster.log
osd data = {directory}/osd/$name
osd objectstore = memstore
memstore device bytes = {self.memstore_bytes}
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
paxos propose interval = 0.01
paxos min wait = 0.001

[{_RGW_NAME}]
rgw data = {directory}/rgw
rgw frontends = beast endpoint=127.0.0.1:{self._rgw_port} tcp_nodelay=1
rgw crypt require ssl = false
{self._sts_config()}"""

    def _sts_config(self) -> str:
        if not self.sts:
            return ""
        # The STS key encrypts the session tokens RGW hands out: 16 characters, as RGW requires.
        return (
            "rgw s3 auth use sts = true\n"
            f"rgw sts key = {secrets.token_hex(8)}\n"
            "rgw enable apis = s3, s3website, admin, sts, iam\n"
        )

    def create_tenant_role(self, name: str = "offload-tenants") -> str:
        """
        A role over the whole bucket that this server's user may assume with its permanent keys only (temporary
        credentials could otherwise assume it again without their session policy): what `AssumeRoleCredentials` needs.

        :param name: The role's name.
        :returns: The role's ARN.
        """
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"AWS": [f"arn:aws:iam:::user/{_USER_ID}"]},
                    "Action": ["sts:AssumeRole"],
                    "Condition": {"StringEquals": {"sts:authentication": "false"}},
                }
            ],
        }
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": ["*"]}]}
        return self.create_role(name, trust=trust, policy=policy)

    def create_role(self, name: str, *, trust: Mapping[str, Any], policy: Mapping[str, Any]) -> str:
        """
        Create an IAM role that principals may assume (``trust``) with its rights (``policy``), on a server started
        with ``sts=True``.

        :param name: The role's name.
        :param trust: The assume-role policy document.
        :param policy: The role's one inline policy.
        :returns: The role's ARN.
        """
        conf = self._running() / "ceph.conf"
        compact = {"separators": (",", ":")}
        created = self._run(
            conf,
            "create a role",
            [
                "radosgw-admin",
                "role",
                "create",
                f"--role-name={name}",
                "--path=/",
                f"--assume-role-policy-doc={json.dumps(trust, **compact)}",
            ],
        )
        self._run(
            conf,
            "put a role policy",
            [
                "radosgw-admin",
                "role-policy",
                "put",
                f"--role-name={name}",
                f"--policy-name={name}-policy",
                f"--policy-doc={json.dumps(policy, **compact)}",
            ],
        )
        return str(json.loads(created)["Arn"])

    def _make_keyring(self, keyring: Path) -> None:
        # One keyring holds every key: it seeds the mon's auth database at mkfs, and each daemon and the CLI read it.
        entities = (
            ("mon.", ["mon", "allow *"]),
            ("client.admin", ["mon", "allow *", "osd", "allow *", "mgr", "allow *"]),
            (_RGW_NAME, ["mon", "allow rw", "osd", "allow rwx"]),
            ("osd.0", ["mon", "allow profile osd", "osd", "allow *"]),
        )
        for index, (name, caps) in enumerate(entities):
            create = ["--create-keyring"] if index == 0 else []
            cap_args = [
                arg for kind, grant in zip(caps[::2], caps[1::2], strict=True) for arg in ("--cap", kind, grant)
            ]
            # ceph-authtool takes the keyring file first and the operations after it.
            self._run(
                None,
                f"make the {name} key",
                ["ceph-authtool", str(keyring), *create, "--gen-key", "-n", name, *cap_args],
            )

    def _make_mon(self, conf: Path, directory: Path, fsid: str) -> None:
        monmap = directory / "monmap"
        self._run(
            None,
            "make the monmap",
            ["monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{self._mon_port}]", "--fsid", fsid, str(monmap)],
        )
        self._run(
            conf,
            "make the mon",
            ["ceph-mon", "--mkfs", "-i", "a", "--monmap", str(monmap), "--keyring", str(directory / "keyring")],
        )

    def _osd_up(self, conf: Path) -> bool:
        output = self._run(conf, "read the OSD map", ["ceph", "osd", "stat", "-f", "json"])
        return int(json.loads(output)["num_up_osds"]) == 1

    def _create_user(self, conf: Path) -> None:
        key, secret = secrets.token_hex(10).upper(), secrets.token_hex(20)
        self._run(
            conf,
            "create the S3 user",
            [
                "radosgw-admin",
                "user",
                "create",
                f"--uid={_USER_ID}",
                "--display-name=offload-haystack tests",
                f"--access-key={key}",
                f"--secret-key={secret}",
            ],
        )
        self._credentials = (key, secret)

    # -- processes ------------------------------------------------------------------------------------------------

    def _start_watchdog(self, directory: Path) -> None:
        # Its own process group, which the daemons join: Ctrl-C in a terminal reaches only our process, which then
        # stops them in order, and the watchdog can tell its daemons from strangers that reuse a pid.
        self._watchdog = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            process_group=0,
        )

    def _spawn(self, conf: Path, name: str, command: Sequence[str]) -> _Daemon:
        directory, watchdog = self._running(), self._watchdog
        if watchdog is None or watchdog.stdin is None:  # pragma: no cover - _start_cluster starts it first
            raise RuntimeError("Ceph RGW start: the watchdog is not running")
        log, output = directory / "log" / f"{name}.log", directory / "log" / f"{name}.out"
        with output.open("wb") as sink:
            # -f: stay in the foreground as our child, so we can wait for it and see it exit.
            process = _ceph_process(
                [*command, "-f", "-c", str(conf)], stdout=sink, stderr=subprocess.STDOUT, process_group=watchdog.pid
            )
        daemon = _Daemon(name, process, log, output)
        self._daemons.append(daemon)
        watchdog.stdin.write(f"{process.pid}\n".encode())
        watchdog.stdin.flush()
        return daemon

    def _wait(self, step: str, daemon: _Daemon, ready: Callable[[], bool]) -> None:
        started = time.monotonic()
        while not ready():
            self._check(step, started, daemon)
            time.sleep(0.02)
        logger.debug("%s: %.2f s", step, time.monotonic() - started)

    def _run(self, conf: Path | None, step: str, command: Sequence[str]) -> str:
        arguments = [*command, "-c", str(conf)] if conf is not None else list(command)
        started = time.monotonic()
        with _ceph_process(arguments, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
            while True:
                try:
                    stdout, stderr = process.communicate(timeout=0.05)
                    break
                except subprocess.TimeoutExpired:
                    pass
                try:
                    # A command waits, unbounded, for a daemon that died (e.g. the mon lost the race for its port).
                    self._check(step, started, None)
                except BaseException:
                    process.kill()
                    raise
        if process.returncode != 0:
            said = "\n".join((stdout + stderr).decode(errors="replace").splitlines()[-_TAIL_LINES:])
            raise RuntimeError(
                f"Ceph RGW start, step {step!r}: {arguments[0]} exited with code {process.returncode}\n{said}"
                + self._tail_of(None)
            )
        logger.debug("%s: %s took %.2f s", step, arguments[0], time.monotonic() - started)
        return stdout.decode(errors="replace")

    def _check(self, step: str, started: float, suspect: _Daemon | None) -> None:
        """Raise if a daemon exited, or if the step, begun at `started`, took longer than `timeout`."""
        for daemon in self._daemons:
            code = daemon.process.poll()
            if code is not None:
                tail = daemon.tail()
                error = _PortTaken if "Address already in use" in tail else RuntimeError
                raise error(f"Ceph RGW start, step {step!r}: {daemon.name} exited with code {code}\n{tail}")
        if time.monotonic() > started + self.timeout:
            raise RuntimeError(
                f"Ceph RGW start, step {step!r}: not done after {self.timeout:.0f} s" + self._tail_of(suspect)
            )

    def _tail_of(self, daemon: _Daemon | None) -> str:
        # Without a better suspect, blame the newest daemon: the step in trouble most likely talks to it.
        if daemon is None and self._daemons:
            daemon = self._daemons[-1]
        return f"\n{daemon.tail()}" if daemon is not None else ""

    def _running(self) -> Path:
        if self._directory is None:
            raise RuntimeError("CephRGWServer is not running: call start() or use it as a context manager")
        return self._directory


def _free_port() -> int:
    # Port 0 makes the kernel pick a free port; the daemon binds it a moment later (see _PortTaken for the race).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _http_ok(port: int) -> bool:
    # http.client, not urllib: urllib would follow HTTP_PROXY from the environment, even for loopback.
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(unreadable: {exc})"
    return "\n".join(lines[-_TAIL_LINES:])


def _close(stream: IO[bytes] | None) -> None:
    if stream is not None:
        # The watchdog may be dead already (someone killed it); a broken pipe then is no news.
        with contextlib.suppress(OSError):
            stream.close()


def _ceph_process(command: Sequence[str], **options: Any) -> subprocess.Popen[bytes]:
    """Start a Ceph command, with no input and none of the environment's ``CEPH_*`` variables."""
    # CEPH_ARGS and CEPH_CONF would point our commands at someone else's cluster.
    environ = {name: value for name, value in os.environ.items() if not name.startswith("CEPH_")}
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, env=environ, **options)
