"""
Real reference-server processes for the tests: ``python -m haystack_integrations.offload.cli serve`` on a free port.

Each process is started exactly as an operator would start it (the CLI, settings in ``OFFLOAD_SERVER_*`` variables),
waits until ``/api/health`` answers, and is stopped with SIGINT (uvicorn's graceful shutdown), then killed if needed.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

STARTUP_TIMEOUT = 90.0


@dataclass(frozen=True)
class ServerProcess:
    """A running server: its base URL, its worker name (host:pid) and its process."""

    base_url: str
    worker: str
    process: subprocess.Popen[str]

    def client(self, token: str) -> httpx.Client:
        """An HTTP client for this server, authenticated with `token`."""
        return httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def free_port() -> int:
    """A port nobody listens on right now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serve(
    *,
    store: str,
    tokens: Mapping[str, str],
    storage_options: Mapping[str, Any] | None = None,
    log: Path,
    environment: Mapping[str, str] | None = None,
) -> Iterator[ServerProcess]:
    """
    Run ``offload-haystack serve`` in a subprocess until the block ends.

    :param store: The store URL.
    :param tokens: Bearer token -> tenant.
    :param storage_options: fsspec options for the store.
    :param log: Where the process's output goes (read it when a test fails).
    :param environment: More variables for the process (``OFFLOAD_SERVER_*`` settings).
    :yields: The running server.
    """
    port = free_port()
    command = [sys.executable, "-m", "haystack_integrations.offload.cli", "serve", "--port", str(port)]
    command += ["--store", store, "--log-level", "warning"]
    if storage_options:
        command += ["--storage-options", json.dumps(dict(storage_options))]
    # The package comes from wherever this test process imports it (the installed wheel under tox).
    variables = {
        **os.environ,
        **(environment or {}),
        "OFFLOAD_SERVER_TOKENS": json.dumps(dict(tokens)),
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True, env=variables)
    base_url = f"http://127.0.0.1:{port}"
    try:
        worker = _wait_until_healthy(base_url, process, log)
        yield ServerProcess(base_url=base_url, worker=worker, process=process)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        process.wait()


def _wait_until_healthy(base_url: str, process: subprocess.Popen[str], log: Path) -> str:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}:\n{log.read_text()}")
        try:
            health = httpx.get(f"{base_url}/api/health", timeout=2).json()
        except httpx.HTTPError:
            time.sleep(0.1)
            continue
        return str(health["worker"])
    raise RuntimeError(f"the server did not answer within {STARTUP_TIMEOUT} s:\n{log.read_text()}")
