"""
``offload-haystack doctor --directory-sas`` on Azure: the tenant-isolation check gives each tenant a directory SAS
(`DirectorySasCredentials`) and sends one tenant's to another tenant's blob (read, overwrite, list, delete). Azurite
refuses every directory SAS (it has no hierarchical namespace), so the doctor runs behind the proxy that plays an
account with one (support/directory_sas.py): enforcing, the check passes; told to let out-of-scope requests through,
it fails naming the SAS; on Azurite itself (a flat namespace) it fails saying why. On both engines (adlfs, obstore).
"""

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.operations.conformance import (
    CHECK_NAMES,
    EXIT_FAILED,
    EXIT_PASSED,
    tenant_isolation,
)
from haystack_integrations.offload.stores import DirectorySasCredentials
from haystack_integrations.offload.stores.sync_api import run_on_io_loop
from support.directory_sas import DirectorySasProxy, Seen

pytest.importorskip("adlfs")
pytest.importorskip("obstore")

ENGINES = ["fsspec", "obstore"]  # adlfs, and object_store's AzureStore

# The doctor's large writes (adlfs's 4 MiB blocks) make aiohttp warn about large raw bodies in the SDK's upload tasks:
# the engine's gap, not the doctor's (as in test_doctor_azure_gcs.py).
pytestmark = pytest.mark.filterwarnings("ignore:Sending a large body directly with raw bytes:ResourceWarning")


@pytest.fixture(params=[False, True], ids=["enforcing", "lenient"])
def proxy(request: pytest.FixtureRequest, azurite_server: Any) -> Iterator[DirectorySasProxy]:
    from support.azurite import ACCOUNT, ACCOUNT_KEY

    with DirectorySasProxy(azurite_server.port, ACCOUNT, ACCOUNT_KEY, lenient=request.param) as running:
        yield running


def _options(endpoint: str) -> dict[str, str]:
    from support.azurite import ACCOUNT, ACCOUNT_KEY

    return {
        "connection_string": (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};BlobEndpoint={endpoint}"
        )
    }


def _doctor(capsys: pytest.CaptureFixture[str], url: str, endpoint: str, *extra: str) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", "--store", url, "--storage-options", json.dumps(_options(endpoint)), "--json", *extra])
    printed = capsys.readouterr()
    assert printed.out, printed.err  # the doctor ran (a report), not refused its arguments
    return code, json.loads(printed.out)


def _checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["name"]: check for check in report["checks"]}


def _isolation_requests(seen: list[Seen]) -> list[Seen]:
    """The check's requests: those naming its directory (a blob, a listing's prefix, a Blob Batch's blobs)."""
    return [
        request
        for request in seen
        if "/isolation/" in request.path
        or "/isolation/" in request.query.get("prefix", "")
        or any("/isolation/" in blob for blob in request.subrequests)
    ]


def _kind(request: Seen) -> tuple[str, str]:
    """A request's method and what it names: a listing, a Blob Batch, or a blob."""
    return request.method, "list" if request.query.get("comp") == "list" else "batch" if request.subrequests else "blob"


@pytest.mark.parametrize("engine", ENGINES)
def test_doctor_checks_each_tenants_directory_sas_against_another_tenants_blob(
    azurite_server: Any, proxy: DirectorySasProxy, engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"az://{azurite_server.new_container()}/{uuid.uuid4().hex[:8]}"
    code, report = _doctor(capsys, url, proxy.endpoint, "--engine", engine, "--directory-sas")
    checks = _checks(report)
    isolation = checks["tenant-isolation"]
    assert list(checks) == list(CHECK_NAMES) and checks["cleanup"]["verdict"] == "pass", report
    if proxy.lenient:
        assert code == EXIT_FAILED and isolation["verdict"] == "fail", report
        assert isolation["detail"].startswith(
            "a tenant's directory SAS reached another tenant's blobs (read, overwrite, list, delete) at "
        )
        assert isolation["detail"].endswith("this account does not confine a directory SAS (sr=d) to its directory")
        assert "session policy" not in isolation["detail"]
    else:
        assert code == EXIT_PASSED and isolation["verdict"] == "pass", report
        assert isolation["detail"] == (
            "a tenant's directory SAS (sr=d) is refused another tenant's blobs (read, overwrite, list, delete)"
        )

    seen = proxy.snapshot()
    sent = _isolation_requests(seen)
    signed = [request for request in sent if request.sas]
    # Tenant B's SAS wrote its blob; tenant A's was sent to read, overwrite, list and delete it, each refused once and
    # never retried (a refusal is the answer looked for). adlfs's listing first asks whether the prefix is a blob
    # (HEAD); obstore deletes with a Blob Batch and, refused, blob by blob (a SAS may lack the batch's rights).
    attempts = {
        "fsspec": [("GET", "blob"), ("PUT", "blob"), ("HEAD", "blob"), ("GET", "list"), ("DELETE", "blob")],
        "obstore": [("GET", "blob"), ("PUT", "blob"), ("GET", "list"), ("POST", "batch"), ("DELETE", "blob")],
    }[engine]
    if engine == "obstore" and proxy.lenient:
        attempts = attempts[:-1]  # the batch went through
    assert [_kind(r) for r in signed] == [("PUT", "blob"), *attempts]
    assert [r.allowed for r in signed] == [True] + [False] * len(attempts)
    # Two SAS, one per tenant's directory: B's on its write, A's on every attempt; never an Authorization header.
    assert len({r.query["sig"] for r in signed}) == 2 and len({r.query["sig"] for r in signed[1:]}) == 1
    assert all(r.query["sr"] == "d" and not r.authorization for r in signed)
    # The worker's Shared Key removed tenant B's blob, in one request; where tenant A's batch had deleted it already,
    # obstore sends the blob's 404 in a batch of its own again (as it does for any blob a batch did not delete).
    removed = [("DELETE", "blob")] if engine == "fsspec" else [("POST", "batch")] * (2 if proxy.lenient else 1)
    assert [(*_kind(r), r.authorization) for r in sent if not r.sas] == [(*kind, True) for kind in removed]
    # One Get Account Information (the namespace check), with the worker's Shared Key, for the whole run.
    account = [r for r in seen if r.query.get("restype") == "account" and r.query.get("comp") == "properties"]
    assert [(r.method, r.authorization, r.sas) for r in account] == [("GET", True, False)]
    assert len(account) + len(sent) == 8  # on both engines, enforced or not


@pytest.mark.parametrize("engine", ENGINES)
def test_azures_403_for_a_sas_without_the_operations_permission_counts_as_a_refusal_too(
    azurite_server: Any, engine: str
) -> None:
    from support.azurite import ACCOUNT, ACCOUNT_KEY

    refusal = "AuthorizationPermissionMismatch"
    with DirectorySasProxy(azurite_server.port, ACCOUNT, ACCOUNT_KEY, refusal=refusal) as proxy:
        root = FsspecToolResultStore(
            f"az://{azurite_server.new_container()}/{uuid.uuid4().hex[:8]}",
            storage_options=_options(proxy.endpoint),
            engine=engine,
            credentials=DirectorySasCredentials(),
        )
        probe = FsspecToolResultStore(
            f"{root.url}/.doctor/{uuid.uuid4().hex[:12]}", storage_options=root.storage_options, engine=engine
        )
        verdict, detail = run_on_io_loop(tenant_isolation, root, probe)
        refused = [request for request in proxy.snapshot() if not request.allowed]
    assert (verdict, detail) == (
        "pass",
        "a tenant's directory SAS (sr=d) is refused another tenant's blobs (read, overwrite, list, delete)",
    )
    assert len(refused) == 5  # the four attempts, each refused once (adlfs's listing: a HEAD, then the listing)


@pytest.mark.parametrize("engine", ENGINES)
def test_doctor_fails_the_check_saying_why_on_an_account_without_a_hierarchical_namespace(
    azurite_server: Any, engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"az://{azurite_server.new_container()}/{uuid.uuid4().hex[:8]}"
    code, report = _doctor(capsys, url, azurite_server.endpoint, "--engine", engine, "--directory-sas")
    checks = _checks(report)
    # Azurite has no hierarchical namespace: the credentials refuse it before any SAS is made, at the first tenant's
    # first write; the doctor reports that as the check's failure, in full, and runs the other checks.
    assert code == EXIT_FAILED and list(checks) == list(CHECK_NAMES), report
    assert {name: check["verdict"] for name, check in checks.items()} == {
        **{name: "pass" for name in CHECK_NAMES},
        "tenant-isolation": "fail",
    }
    detail = checks["tenant-isolation"]["detail"]
    assert detail.startswith("a tenant's directory SAS could not write the tenant's own blob at "), detail
    assert (
        "so another tenant's was not tried: StorageError: Azure account 'devstoreaccount1' has no hierarchical "
        "namespace: the directory SAS of credentials=DirectorySasCredentials() need one (a Data Lake Storage "
        "account)." in detail
    )


def test_without_the_flag_the_check_is_skipped_naming_both_ways_to_configure_it(
    azurite_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"az://{azurite_server.new_container()}/{uuid.uuid4().hex[:8]}"
    code, report = _doctor(capsys, url, azurite_server.endpoint, "--engine", "fsspec")
    isolation = _checks(report)["tenant-isolation"]
    assert code == EXIT_PASSED and isolation["verdict"] == "skipped", report
    assert isolation["detail"].startswith(
        "Azure Blob Storage: no keys or credentials per tenant configured (customer-provided keys: "
        "encryption=TenantKeys, doctor's --sse-c-master-key-env; a directory SAS per tenant: "
        "credentials=DirectorySasCredentials, doctor's --directory-sas, on an account with a hierarchical namespace)"
    )
    assert "not built" not in isolation["detail"]


@pytest.mark.parametrize(
    "extra",
    [
        ["--tenant-role-arn", "arn:aws:iam::1:role/tenant"],
        ["--downscoped-credentials"],
    ],
)
def test_directory_sas_is_one_kind_of_credentials_per_tenant(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--store", "az://results/prod", "--directory-sas", *extra]) == 2
    assert (
        "Give one of --tenant-role-arn (s3://), --downscoped-credentials (gs://) and --directory-sas (az://), not two."
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("url", ["s3://bucket/prod", "gs://bucket/prod"])
def test_directory_sas_is_for_azure_stores(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--store", url, "--directory-sas", "--storage-options", '{"token": "anon"}']) == 2
    error = capsys.readouterr().err
    assert "Cannot open the store" in error and "DirectorySasCredentials" in error
