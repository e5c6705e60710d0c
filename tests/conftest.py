"""
Shared fixtures: one local S3 server per session, a backend per test, and resets of fsspec's global state.

The behaviour suite asks for ``store`` (or ``backend``) and runs once per backend: ``memory``, ``local`` and
``s3`` (moto's S3 server over real HTTP on loopback, marked ``s3``; deselect with ``-m "not s3"``). Modules marked
``engines`` run on ``s3-obstore`` too: the same server through the obstore engine. Only those: other suites build
their stores from ``url, storage_options = backend`` alone, which would quietly use s3fs under that id.
"""

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest
from fsspec.implementations.memory import MemoryFileSystem

if TYPE_CHECKING:
    from haystack_integrations.offload import FsspecToolResultStore
    from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog


class Backend(NamedTuple):
    """Where a test's store lives: unpack as ``url, storage_options = backend``, and pass ``**backend.store_kwargs``."""

    url: str
    storage_options: dict[str, Any]
    # A class attribute, not a field: two-name unpacking keeps working everywhere.
    engine = "fsspec"

    @property
    def store_kwargs(self) -> dict[str, Any]:
        """The store's engine argument; none for the default engine."""
        return {} if self.engine == "fsspec" else {"engine": self.engine}


class ObstoreBackend(Backend):
    """An S3 backend served by the obstore engine."""

    engine = "obstore"


BACKENDS = ["memory", "local", pytest.param("s3", marks=pytest.mark.s3)]
ENGINES = [pytest.param("s3-obstore", marks=pytest.mark.s3)]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "engines: the module's backend tests also run on every S3 engine (s3-obstore)")


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Give tests of modules marked ``engines`` the S3 engines as further backends (as a parametrize mark, so the
    fixture's own params step aside, as for any test that parametrizes ``backend`` itself)."""
    if "backend" not in metafunc.fixturenames or metafunc.definition.get_closest_marker("engines") is None:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0] if mark.args else mark.kwargs.get("argnames", "")
        if "backend" in (names.replace(" ", "").split(",") if isinstance(names, str) else names):
            return
    metafunc.definition.add_marker(pytest.mark.parametrize("backend", BACKENDS + ENGINES, indirect=True))


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


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A fresh, unique, empty root for one test, on each backend in turn."""
    if request.param == "memory":
        return Backend(f"memory://offload-test-{uuid.uuid4().hex}", {})
    if request.param == "local":
        return Backend(str(tmp_path / "results"), {})
    # Only S3 runs start the server.
    server: LocalS3Server = request.getfixturevalue("s3_server")
    kind = ObstoreBackend if request.param == "s3-obstore" else Backend
    return kind(f"{server.bucket_url}/{uuid.uuid4().hex}", server.storage_options())


@pytest.fixture
def store(backend: Backend) -> "FsspecToolResultStore":
    """An ``FsspecToolResultStore`` on the test's backend."""
    from haystack_integrations.offload import FsspecToolResultStore

    url, storage_options = backend
    return FsspecToolResultStore(url, storage_options=storage_options, **backend.store_kwargs)
