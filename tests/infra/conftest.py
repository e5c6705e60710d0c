"""
Fixtures for the infrastructure tests: the renderer of ``infra/``'s templates, and a moto server enforcing IAM.

``infra/documents.py`` is not part of the installed package (it ships with the templates it reads), so it is loaded
from the repository by path.
"""

import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

INFRA_DIR = Path(__file__).resolve().parents[2] / "infra"


def _load_documents_module() -> ModuleType:
    name = "offload_infra_documents"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, INFRA_DIR / "documents.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class body runs
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def infra_documents() -> ModuleType:
    """``infra/documents.py``: renders the templates' documents with concrete values."""
    return _load_documents_module()


@dataclass(frozen=True)
class IamServer:
    """A local S3 server in its own process, enforcing IAM; ``storage_options`` carry its admin user's keys."""

    endpoint_url: str
    bucket: str
    storage_options: dict[str, Any]

    def client(self, service: str, key: str | None = None, secret: str | None = None) -> Any:
        import boto3

        session = boto3.session.Session(
            aws_access_key_id=key or self.storage_options["key"],
            aws_secret_access_key=secret or self.storage_options["secret"],
            region_name=self.storage_options["client_kwargs"]["region_name"],
        )
        return session.client(service, endpoint_url=self.endpoint_url)


@pytest.fixture(scope="module")
def iam_server() -> Iterator[IamServer]:
    """
    ``python -m haystack_integrations.offload.local_s3 --enforce-iam`` in a subprocess.

    A process of its own because moto's IAM switch is process-global: in this process it would also lock out the
    session's ``s3_server`` that other tests share.
    """
    if sys.platform == "win32":
        pytest.skip("stops the server with SIGINT")
    process = subprocess.Popen(
        [sys.executable, "-m", "haystack_integrations.offload.local_s3", "--port", "0", "--quiet", "--enforce-iam"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        settings: dict[str, str] = {}
        for line in process.stdout:
            name, _, value = line.partition(":")
            settings[name.strip()] = value.strip()
            if line.startswith("Press Ctrl-C"):
                break
        else:
            pytest.fail(f"the local S3 server exited early with code {process.wait()}")
        storage_options = json.loads(settings["storage_options"])
        bucket = settings["Bucket URL"].removeprefix("s3://")
        yield IamServer(storage_options["endpoint_url"], bucket, storage_options)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
