"""
``offload-haystack doctor`` on Azure Blob Storage (Azurite) and Google Cloud Storage (fake-gcs-server): every check
that has a meaning there runs in the store's own protocol (delimited and paged listings, the large write the client
makes, its conditional form), each seen on the wire through a counting proxy; only tenant isolation is skipped, as
these stores have no keys or credentials per tenant configured, saying how to configure them (with them, it runs:
test_doctor_tenant_isolation_clouds.py). The requests of the store's own large write, at two sizes each side of the
client's limit.
"""

import json
import re
import uuid
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.operations.conformance import CHECK_NAMES, EXIT_PASSED
from haystack_integrations.offload.testing.faults import FaultProxy
from haystack_integrations.offload.testing.relay import ProxiedRequest

MiB = 2**20

# aiohttp warns (ResourceWarning) for every request body over 1 MiB given as bytes, which is how adlfs and gcsfs send
# the store's large writes (each Azure block is 4 MiB, each GCS chunk up to 50 MiB): a hint about the event loop, not a
# failure, raised in the SDK's upload tasks. A gap of the engine (stores/async_fsspec_io.py), not of the doctor.
pytestmark = pytest.mark.filterwarnings("ignore:Sending a large body directly with raw bytes:ResourceWarning")


def _doctor(capsys: pytest.CaptureFixture[str], url: str, options: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    # adlfs's engine on Azure, whose requests these tests count ("auto" would pick obstore for az://).
    code = main(["doctor", "--store", url, "--storage-options", json.dumps(options), "--engine", "fsspec", "--json"])
    return code, json.loads(capsys.readouterr().out)


def _checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["name"]: check for check in report["checks"]}


def _below(requests: list[ProxiedRequest], part: str) -> list[ProxiedRequest]:
    """The requests whose target names `part` of the doctor's prefix (as a path or a URL-encoded query value)."""
    encoded = part.replace("/", "%2F")
    return [request for request in requests if part in request.target or encoded in request.target]


def _azure_through(server: Any, proxy: FaultProxy) -> dict[str, str]:
    from support.azurite import ACCOUNT

    through = server.connection_string().replace(server.endpoint, f"{proxy.endpoint_url}/{ACCOUNT}")
    return {"connection_string": through}


def _gcs_shape(request: ProxiedRequest) -> str:
    """A GCS upload request: a simple upload, a resumable upload's start, or one of its chunks (all POSTs in gcsfs)."""
    if "upload_id=" in request.target:
        return "chunk"
    return "start" if "uploadType=resumable" in request.target else "simple"


def _assert_no_generic_skip(report: dict[str, Any]) -> None:
    skipped = {check["name"] for check in report["checks"] if check["verdict"] == "skipped"}
    assert skipped == {"tenant-isolation"}, report
    assert not any("S3 only" in check["detail"] for check in report["checks"]), report


def test_doctor_on_azurite_runs_every_check_in_azures_protocol(
    azurite_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with FaultProxy(f"http://127.0.0.1:{azurite_server.port}") as proxy:  # no faults: it counts
        url = f"az://{azurite_server.new_container()}/{uuid.uuid4().hex}"
        code, report = _doctor(capsys, url, _azure_through(azurite_server, proxy))
        sent = proxy.requests.snapshot()
    checks = _checks(report)
    assert code == EXIT_PASSED and list(checks) == list(CHECK_NAMES), report
    _assert_no_generic_skip(report)
    assert {name: check["verdict"] for name, check in checks.items()} == {
        **{name: "pass" for name in CHECK_NAMES},
        "tenant-isolation": "skipped",
    }
    isolation = checks["tenant-isolation"]["detail"]
    assert "Azure Blob Storage" in isolation and "customer-provided keys" in isolation
    assert "no keys or credentials per tenant configured" in isolation and "--sse-c-master-key-env" in isolation
    assert "--directory-sas" in isolation and "hierarchical namespace" in isolation

    # Listing: 3 common prefixes and 2 blobs in pages of 2, delimited and not: 3 List Blobs pages each.
    listings = [r for r in _below(sent, "/listing/") if r.method == "GET" and "comp=list" in r.target]
    assert all("maxresults=2" in r.target for r in listings)
    assert sum("delimiter=" in r.target for r in listings) == 3 and len(listings) == 6
    assert "3 common prefixes and 2 keys, complete and each once in 3 pages of 2" in checks["list-delimiter"]["detail"]

    # The large write: 65 MiB, above the SDK's 64 MiB single put, as 17 staged blocks of 4 MiB and one block list.
    written = [r for r in _below(sent, "/multipart") if r.method == "PUT"]
    blocks = [r for r in written if "comp=block&" in r.target or r.target.endswith("comp=block")]
    commits = [r for r in written if "comp=blocklist" in r.target]
    assert (len(blocks), len(commits), len(written)) == (-(-65 * MiB // (4 * MiB)), 1, 18)
    assert "committed as 17 blocks" in checks["multipart-write"]["detail"]

    # The conditional form: Put Block List with If-None-Match: * over an existing blob, refused.
    conditional = [r for r in _below(sent, "/conditional") if "comp=blocklist" in r.target]
    assert [r.header("If-None-Match") for r in conditional] == ["*"]
    assert checks["conditional-multipart"]["finding"] == "refused"
    assert checks["cleanup"]["verdict"] == "pass"


def test_doctor_on_fake_gcs_runs_every_check_in_gcss_protocol(
    fake_gcs_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with FaultProxy(fake_gcs_server.endpoint) as proxy:  # no faults: it counts
        url = f"gs://{fake_gcs_server.new_bucket()}/{uuid.uuid4().hex}"
        options = {**fake_gcs_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        code, report = _doctor(capsys, url, options)
        sent = proxy.requests.snapshot()
    checks = _checks(report)
    # No failure; two warnings, each the emulator's own gap (real GCS pages and enforces both; untested here).
    assert code == EXIT_PASSED and list(checks) == list(CHECK_NAMES), report
    _assert_no_generic_skip(report)
    assert {name: check["verdict"] for name, check in checks.items()} == {
        **{name: "pass" for name in CHECK_NAMES},
        "list-delimiter": "warn",
        "conditional-multipart": "warn",
        "tenant-isolation": "skipped",
    }
    isolation = checks["tenant-isolation"]["detail"]
    assert "Google Cloud Storage" in isolation and "downscoped credentials" in isolation
    assert "no keys or credentials per tenant configured" in isolation
    assert "--sse-c-master-key-env" in isolation and "--downscoped-credentials" in isolation

    # Listing: fake-gcs-server answers a delimited listing in one page whatever maxResults says; without a delimiter
    # it pages (3 pages of 2 for 5 objects).
    listings = [r for r in _below(sent, "/listing/") if r.method == "GET" and re.search(r"/b/[^/]+/o\?", r.target)]
    assert all("maxResults=2" in r.target for r in listings)
    assert sum("delimiter=" in r.target for r in listings) == 1 and len(listings) == 4
    assert sum("pageToken=" in r.target for r in listings) == 2
    detail = checks["list-delimiter"]["detail"]
    assert "1 page(s) of up to 5 entries where 2 were asked for" in detail and "5 keys" in detail

    # The large write: 51 MiB, above gcsfs's 50 MiB chunk, as one resumable upload of 2 chunks.
    written = [r for r in _below(sent, "/multipart") if r.method in {"POST", "PUT"}]
    assert [_gcs_shape(r) for r in written] == ["start", "chunk", "chunk"]
    assert "ifGenerationMatch" not in written[0].target

    # The conditional form: a resumable upload started with ifGenerationMatch=0, which fake-gcs-server ignores.
    started = [r for r in _below(sent, "/conditional") if _gcs_shape(r) == "start"]
    assert len(started) == 1 and "ifGenerationMatch=0" in started[0].target
    assert checks["conditional-multipart"]["finding"] == "ignored"
    assert "an exclusive create of 50 MiB or more" in checks["conditional-multipart"]["detail"]
    # The coordination path itself, a simple upload with ifGenerationMatch=0, is refused the second time.
    assert checks["exclusive-create"]["finding"] == "enforced"


def test_doctor_on_memory_says_what_memory_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _doctor(capsys, f"memory://doctor-{uuid.uuid4().hex}", {})
    details = {check["name"]: check["detail"] for check in report["checks"] if check["verdict"] == "skipped"}
    assert code == EXIT_PASSED
    assert set(details) == {"list-delimiter", "multipart-write", "conditional-multipart", "tenant-isolation"}
    assert all(detail.startswith("memory:// ") and "S3 only" not in detail for detail in details.values())


def _large_write_requests(store: FsspecToolResultStore, proxy: FaultProxy, size: int) -> list[ProxiedRequest]:
    session = store.for_session("acme", "chat-1")
    session.warm_up()
    before = len(proxy.requests.snapshot())
    session.write(key="big.txt", content="x" * size)
    return proxy.requests.snapshot()[before:]


@pytest.mark.slow
@pytest.mark.parametrize(("size", "blocks"), [(20 * MiB, 0), (65 * MiB, 17)])
def test_azure_large_write_requests_at_two_sizes(azurite_server: Any, size: int, blocks: int) -> None:
    with FaultProxy(f"http://127.0.0.1:{azurite_server.port}") as proxy:
        url = f"az://{azurite_server.new_container()}/{uuid.uuid4().hex}"
        store = FsspecToolResultStore(url, storage_options=_azure_through(azurite_server, proxy), engine="fsspec")
        sent = _large_write_requests(store, proxy, size)
    shapes = [
        "block" if "comp=block&" in r.target else "blocklist" if "comp=blocklist" in r.target else r.method
        for r in sent
    ]
    # Up to 64 MiB one Put Blob; above, a Put Block per 4 MiB and one Put Block List.
    assert shapes == (["PUT"] if blocks == 0 else ["block"] * blocks + ["blocklist"])


@pytest.mark.slow
@pytest.mark.parametrize(("size", "chunks"), [(20 * MiB, 0), (51 * MiB, 2)])
def test_gcs_large_write_requests_at_two_sizes(fake_gcs_server: Any, size: int, chunks: int) -> None:
    with FaultProxy(fake_gcs_server.endpoint) as proxy:
        url = f"gs://{fake_gcs_server.new_bucket()}/{uuid.uuid4().hex}"
        store = FsspecToolResultStore(
            url, storage_options={**fake_gcs_server.storage_options(), "endpoint_url": proxy.endpoint_url}
        )
        sent = _large_write_requests(store, proxy, size)
    # Below 50 MiB one simple upload; from it, a resumable upload: one request to start it, then one per 50 MiB chunk.
    assert [_gcs_shape(r) for r in sent] == (["simple"] if chunks == 0 else ["start"] + ["chunk"] * chunks)
