"""``serve`` on a port another server holds stops in one line before it prints anything (issue 43)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_serve_on_a_taken_port_prints_no_login_links_and_exits_2(tmp_path: Path) -> None:
    environment = {name: value for name, value in os.environ.items() if not name.startswith(("OFFLOAD_", "AWS_"))}
    with socket.create_server(("127.0.0.1", 0)) as other_server:  # listening: the port is taken
        port = other_server.getsockname()[1]
        command = [sys.executable, "-m", "haystack_integrations.offload.cli", "serve", "--store", str(tmp_path)]
        done = subprocess.run(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    # Links printed for that port would sign their reader in to whatever server holds it.
    assert "#token=" not in done.stdout and done.stdout == "", done.stdout
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"Cannot listen on 127.0.0.1:{port}" in line and "--port" in line, line
