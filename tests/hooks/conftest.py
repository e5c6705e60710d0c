"""Fixtures of the hook suites."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from haystack import tracing
from tracing_spy import RecordingTracer

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.testing.local_s3 import LocalS3Server


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


@pytest.fixture
def recording_tracer() -> Iterator[RecordingTracer]:
    """Haystack's tracing, enabled with a tracer that records every span; the previous tracer is put back after."""
    previous = tracing.tracer.actual_tracer
    recorder = RecordingTracer()
    tracing.enable_tracing(recorder)
    try:
        yield recorder
    finally:
        tracing.enable_tracing(previous)
