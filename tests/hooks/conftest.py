"""Fixtures of the hook suites."""

from pathlib import Path

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.local_s3 import LocalS3Server


@pytest.fixture(params=[pytest.param("s3", marks=pytest.mark.s3), "local"])
def failing_store(request: pytest.FixtureRequest, tmp_path: Path) -> FsspecToolResultStore:
    """A session store whose writes fail for real: a bucket moto's server does not have, or a directory under a file."""
    if request.param == "s3":
        server: LocalS3Server = request.getfixturevalue("s3_server")
        root = FsspecToolResultStore("s3://no-such-bucket-here/prod", storage_options=server.storage_options())
    else:
        # Root may write anywhere (tests run as root), but nobody can create a directory inside a regular file.
        blocker = tmp_path / "not-a-directory"
        blocker.write_text("")
        root = FsspecToolResultStore(str(blocker / "results"))
    return root.for_session("acme", "chat-1")
