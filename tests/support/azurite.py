"""
Azurite, Microsoft's Azure Blob Storage emulator (npm ``azurite``), run on a free loopback port for the tests.

It keeps its data in memory (``--inMemoryPersistence``) and checks Shared Key signatures, so wrong credentials are
refused as Azure refuses them. A start takes about a second; `stop` lets a test see an endpoint that has gone away.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Self

__all__ = ["ACCOUNT", "ACCOUNT_KEY", "NPM_INSTALL", "AzuriteServer", "azurite_available"]

NPM_INSTALL = "npm install -g azurite@3.35"
# Azurite's well-known development account (the same in every Azurite: documented, not a secret).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_START_TIMEOUT = 30.0


def azurite_available() -> str | None:
    """
    Check that Azurite's blob server can be run.

    :returns: ``None`` when ``azurite-blob`` is on ``PATH``, else a sentence naming the command that installs it.
    """
    if shutil.which("azurite-blob") is None:
        return f"azurite-blob is not installed (Node.js and npm needed); run: {NPM_INSTALL}"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class AzuriteServer:
    """One Azurite blob server on loopback; a context manager that starts it and stops it."""

    def __init__(self, *, loose: bool = False) -> None:
        """
        :param loose: Start it with ``--loose``: headers it does not implement (customer-provided keys among them) are
            ignored; in its default strict mode it answers them with 500 ``FeatureNotSupported``.
        """
        self.loose = loose
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}/{ACCOUNT}"
        self._process: subprocess.Popen[bytes] | None = None
        self._folder = Path(tempfile.mkdtemp(prefix="azurite-"))

    def connection_string(self, *, key: str = ACCOUNT_KEY) -> str:
        """
        The connection string of the emulator's account, as Azure's own tools take it.

        :param key: The account key to sign with (another one to see a refusal).
        """
        return f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};BlobEndpoint={self.endpoint};"

    def storage_options(self, *, key: str = ACCOUNT_KEY) -> dict[str, str]:
        """adlfs's options for this emulator."""
        return {"connection_string": self.connection_string(key=key)}

    @functools.cached_property
    def bucket_url(self) -> str:
        """``az://`` and one container made for this server on first use: the lane's tests keep apart by prefix."""
        return f"az://{self.new_container()}"

    def new_container(self) -> str:
        """Create a container of a fresh name and return its name."""
        from azure.storage.blob import BlobServiceClient

        name = f"c{uuid.uuid4().hex[:16]}"
        with BlobServiceClient.from_connection_string(self.connection_string()) as client:
            client.create_container(name)
        return name

    def start(self) -> Self:
        """Start Azurite and wait until it accepts connections."""
        binary = shutil.which("azurite-blob")
        if binary is None:
            raise RuntimeError(azurite_available())
        self._process = subprocess.Popen(
            [
                binary,
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(self.port),
                "--inMemoryPersistence",
                "--silent",
                "--skipApiVersionCheck",
                "--disableTelemetry",
                *(["--loose"] if self.loose else []),
            ],
            # Its debug and extent files, if any, land here rather than in the tests' working directory.
            cwd=self._folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                error = self._process.stderr.read().decode(errors="replace") if self._process.stderr else ""
                raise RuntimeError(f"Azurite exited at start ({self._process.returncode}): {error[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"Azurite did not listen on port {self.port} within {_START_TIMEOUT:.0f} s")

    def stop(self) -> None:
        """Stop Azurite (its data goes with it); nothing listens on its port afterwards."""
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stderr is not None:
                process.stderr.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
