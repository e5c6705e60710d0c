"""
Fixtures for the operations suites: moto's S3 server behind a `FaultProxy`, and stores that talk through it.

``faulty_root`` and ``direct_root`` are two views of one fresh prefix: the first through the proxy (faults injected as
the test decides), the second straight to moto, to check what really got stored.
"""

import uuid
from collections.abc import Iterator

import pytest
from ops_helpers import FAST_RETRY, Roots, proxied_options

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.testing.faults import FaultPlan, FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server


@pytest.fixture(scope="session")
def _shared_fault_proxy(s3_server: LocalS3Server) -> Iterator[FaultProxy]:
    # One proxy (one port) for the session, so the S3 clients made for it are cached and reused across tests.
    with FaultProxy(s3_server.endpoint_url, slow_seconds=0.3, hold_seconds=5.0) as proxy:
        yield proxy


@pytest.fixture
def fault_proxy(_shared_fault_proxy: FaultProxy) -> FaultProxy:
    """A fault proxy in front of the session's moto server, injecting nothing until told to, with empty logs."""
    _shared_fault_proxy.plan = FaultPlan()
    _shared_fault_proxy.faults.clear()
    _shared_fault_proxy.requests.clear()
    return _shared_fault_proxy


@pytest.fixture
def roots(s3_server: LocalS3Server, fault_proxy: FaultProxy) -> Roots:
    """A fresh prefix, through the proxy (retrying under `FAST_RETRY`) and directly."""
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    faulty = FsspecToolResultStore(
        url, storage_options=proxied_options(s3_server, fault_proxy), retry=FAST_RETRY, engine="fsspec"
    )
    # One real request first: it opens the client, and aiobotocore's read timeout holds from then on (right after a
    # bare warm_up, the very first request was seen waiting out the whole withheld answer instead).
    faulty.for_session("warm", "up").list()
    # And the exclusive-create probe, which precedes the first coordinated create: the faults a test scripts then hit
    # the requests the test makes.
    faulty.check_exclusive_creates().require()
    fault_proxy.requests.clear()
    return Roots(faulty, FsspecToolResultStore(url, storage_options=s3_server.storage_options(), engine="fsspec"))
