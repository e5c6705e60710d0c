"""
Fixtures for the infrastructure tests: the renderer of ``infra/``'s templates, and a moto server enforcing IAM.

``infra/documents.py`` is not part of the installed package (it ships with the templates it reads), so it is loaded
from the repository by path.
"""

import importlib.util
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from haystack_integrations.offload.testing.local_s3 import local_s3_process

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
    ``python -m haystack_integrations.offload.testing.local_s3 --enforce-iam`` in a subprocess.

    A process of its own because moto's IAM switch is process-global: in this process it would also lock out the
    session's ``s3_server`` that other tests share.
    """
    if sys.platform == "win32":
        pytest.skip("stops the server with SIGINT")
    with local_s3_process(enforce_iam=True) as server:
        yield IamServer(server.endpoint_url, server.bucket, server.storage_options)
