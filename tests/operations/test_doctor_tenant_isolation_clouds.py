"""
``offload-haystack doctor``'s tenant-isolation check on Azure Blob Storage and Google Cloud Storage, given keys per
tenant (``--sse-c-master-key-env``: Azure's customer-provided keys, GCS's customer-supplied keys) or GCS downscoped
credentials (``--downscoped-credentials``): it runs, and it fails on the emulators, which ignore both (Azurite in
``--loose`` mode, fake-gcs-server), with the requests it sent counted through a proxy. Against local fakes that enforce
them as Azure and GCS answer (409 with a CPK error code, 400 with a CSEK reason, 403 outside a token's boundary) it
passes. Without either it is skipped, saying how to configure them.
"""

import base64
import hashlib
import json
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from google.oauth2.credentials import Credentials as StaticToken
from haystack.utils import Secret

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.operations.conformance import EXIT_FAILED, ISOLATION_TENANTS, tenant_isolation
from haystack_integrations.offload.stores import DownscopedCredentials, TenantKeys
from haystack_integrations.offload.stores.azure_keys import AZURE_HKDF_SALT
from haystack_integrations.offload.stores.encryption import hkdf_sha256
from haystack_integrations.offload.stores.failures import StorageRequestError
from haystack_integrations.offload.stores.gcs_keys import GCS_HKDF_SALT
from haystack_integrations.offload.stores.sync_api import run_on_io_loop
from haystack_integrations.offload.testing.faults import FaultProxy
from haystack_integrations.offload.testing.relay import ProxiedRequest
from support.gcp_keys import service_account_key
from support.local_http import QuietHandler, serving

MASTER_VARIABLE = "DOCTOR_TENANT_MASTER_KEY"
MASTER = "a master secret for the doctor's cloud tests, " + uuid.uuid4().hex  # 78 characters
AZURE_SHA256 = "x-ms-encryption-key-sha256"
GCS_SHA256 = "x-goog-encryption-key-sha256"
SOURCE_TOKEN = "source-token-" + uuid.uuid4().hex

# The doctor's large writes (adlfs's 4 MiB blocks, gcsfs's chunks) make aiohttp warn about large raw bodies in the SDKs'
# upload tasks: the engine's gap, not the doctor's (as in test_doctor_azure_gcs.py).
pytestmark = pytest.mark.filterwarnings("ignore:Sending a large body directly with raw bytes:ResourceWarning")


def _sha256_of(tenant: str, salt: bytes) -> str:
    key = hkdf_sha256(MASTER.encode(), salt=salt, info=tenant.encode())
    return base64.b64encode(hashlib.sha256(key).digest()).decode()


@pytest.fixture
def master_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(MASTER_VARIABLE, MASTER)
    return MASTER_VARIABLE


def _doctor(
    capsys: pytest.CaptureFixture[str], url: str, options: dict[str, Any], *extra: str
) -> tuple[int, dict[str, Any]]:
    arguments = ["doctor", "--store", url, "--storage-options", json.dumps(options), "--json", *extra]
    code = main(arguments)
    printed = capsys.readouterr()
    assert printed.out, printed.err  # the doctor ran (a report), not refused its arguments
    return code, json.loads(printed.out)


def _isolation(report: dict[str, Any]) -> dict[str, Any]:
    return next(check for check in report["checks"] if check["name"] == "tenant-isolation")


def _isolation_requests(requests: list[ProxiedRequest]) -> list[ProxiedRequest]:
    """The requests of the tenant-isolation check: those naming its directory, as a path or an encoded query value."""
    return [r for r in requests if "/isolation/" in unquote(r.target) or "%2Fisolation%2F" in r.target]


# ---------------------------------------------------------------------------------------------------------------------
# The emulators: the check runs, and fails, since neither enforces keys or tokens.


@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_doctor_runs_the_key_check_on_azurite_and_fails_it_as_azurite_ignores_keys(
    loose_azurite: Any, master_key: str, engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from support.azurite import ACCOUNT

    with FaultProxy(f"http://127.0.0.1:{loose_azurite.port}") as proxy:  # no faults: it counts
        through = loose_azurite.connection_string().replace(loose_azurite.endpoint, f"{proxy.endpoint_url}/{ACCOUNT}")
        options = {"connection_string": through}
        url = f"az://{loose_azurite.new_container()}/{uuid.uuid4().hex[:8]}"
        code, report = _doctor(capsys, url, options, "--engine", engine, "--sse-c-master-key-env", master_key)
        sent = _isolation_requests(proxy.requests.snapshot())
    check = _isolation(report)
    assert code == EXIT_FAILED and check["verdict"] == "fail", report
    assert (
        "a blob written with a tenant's customer-provided key was returned without a key and with another tenant's "
        "key" in check["detail"]
    )
    assert "Azurite ignores customer-provided keys" in check["detail"]
    assert {c["name"]: c["verdict"] for c in report["checks"]}["cleanup"] == "pass"
    # Tenant A's key on its write, none on the first read, tenant B's on the second, then the delete (obstore's is a
    # Blob Batch, whose target names no blob): each read one request, refused or not, nothing retried.
    a, b = (_sha256_of(tenant, AZURE_HKDF_SALT) for tenant in ISOLATION_TENANTS)
    deleted = [("DELETE", None)] if engine == "fsspec" else []
    assert [(r.method, r.header(AZURE_SHA256)) for r in sent] == [("PUT", a), ("GET", None), ("GET", b), *deleted]


def test_doctor_runs_the_key_check_on_fake_gcs_and_fails_it_as_the_endpoint_ignores_keys(
    fake_gcs_server: Any, master_key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with FaultProxy(fake_gcs_server.endpoint) as proxy:
        endpoint = proxy.endpoint_url
        options = {**fake_gcs_server.storage_options(), "endpoint_url": endpoint}
        url = f"gs://{fake_gcs_server.new_bucket()}/{uuid.uuid4().hex[:8]}"
        code, report = _doctor(capsys, url, options, "--sse-c-master-key-env", master_key)
        everything = proxy.requests.snapshot()
    check = _isolation(report)
    assert code == EXIT_FAILED and check["verdict"] == "fail", report
    assert (
        "an object written with a tenant's customer-supplied key was returned without a key and with another "
        "tenant's key" in check["detail"]
    )
    assert f"at {endpoint}): this endpoint ignores customer-supplied keys" in check["detail"]
    # The upload names its object in its body: of the whole run's requests, two carry a key, the check's write with
    # tenant A's and its read with tenant B's; the reads (one request each, refused or not) and the delete name it.
    a, b = (_sha256_of(tenant, GCS_HKDF_SALT) for tenant in ISOLATION_TENANTS)
    keyed = [(r.method, r.header(GCS_SHA256)) for r in everything if r.header(GCS_SHA256)]
    assert keyed == [("POST", a), ("GET", b)]
    named = [(r.method, r.target.split("/o/")[0], r.header(GCS_SHA256)) for r in _isolation_requests(everything)]
    bucket = url.removeprefix("gs://").split("/")[0]
    assert named == [
        ("GET", f"/download/storage/v1/b/{bucket}", None),
        ("GET", f"/download/storage/v1/b/{bucket}", b),
        ("DELETE", f"/storage/v1/b/{bucket}", None),
    ]


class _TokenService(QuietHandler):
    """
    Google's two token endpoints, for the worker's and the tenants' tokens: ``/token`` refreshes the worker's (an
    authorized user's refresh token), ``/v1/token`` is STS, which downscopes it and records each token's boundary.
    """

    def do_POST(self) -> None:
        server: Any = self.server
        form = {k: v[0] for k, v in parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode()).items()}
        if self.path == "/token":
            self.answer_json(200, {"access_token": SOURCE_TOKEN, "expires_in": 3600, "token_type": "Bearer"})
            return
        assert form["subject_token"] == SOURCE_TOKEN, form  # the worker's token, refreshed here
        rule = json.loads(unquote(form["options"]))["accessBoundary"]["accessBoundaryRules"][0]
        prefix = re.search(r"/objects/([^']*)'\)", rule["availabilityCondition"]["expression"])
        with server.lock:
            token = f"downscoped-{len(server.prefixes)}-{uuid.uuid4().hex[:6]}"
            server.prefixes[token] = prefix.group(1) if prefix else None
        self.answer_json(
            200,
            {
                "access_token": token,
                "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                "token_type": "Bearer",
                "expires_in": 3600,
            },
        )


@pytest.fixture
def token_service() -> Iterator[Any]:
    with serving(_TokenService, lock=threading.Lock(), prefixes={}) as server:
        server.url = f"http://127.0.0.1:{server.server_address[1]}"
        yield server


def _service_account_file(directory: Path, token_uri: str) -> str:
    path = directory / "worker-key.json"
    path.write_text(json.dumps(service_account_key(token_uri)))
    return str(path)


def _bearer(request: ProxiedRequest) -> str | None:
    return (request.header("Authorization") or "").removeprefix("Bearer ") or None


def test_doctor_runs_the_credentials_check_on_fake_gcs_and_fails_it_as_the_endpoint_checks_no_token(
    fake_gcs_server: Any,
    token_service: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The worker's credentials as a key file, its token asked for at the local token service (google-auth honours a
    # service account's token_uri; an authorized user's it overrides with Google's).
    key_file = _service_account_file(tmp_path, f"{token_service.url}/token")
    with FaultProxy(fake_gcs_server.endpoint) as proxy:
        endpoint = proxy.endpoint_url
        options = {**fake_gcs_server.storage_options(), "endpoint_url": endpoint, "token": key_file}
        root = uuid.uuid4().hex[:8]
        url = f"gs://{fake_gcs_server.new_bucket()}/{root}"
        arguments = ["--downscoped-credentials", "--sts-endpoint-url", f"{token_service.url}/v1/token"]
        code, report = _doctor(capsys, url, options, *arguments)
        everything = proxy.requests.snapshot()
    check = _isolation(report)
    assert code == EXIT_FAILED and check["verdict"] == "fail", report
    assert check["detail"].startswith(
        "a tenant's downscoped token reached another tenant's objects (read, overwrite, list, delete)"
    )
    assert check["detail"].endswith("this endpoint does not enforce Credential Access Boundaries")
    # One exchange per tenant, each token bounded to its own prefix below the run's.
    prefixes = dict(token_service.prefixes)
    run = report["prefix"].removeprefix(url.split("/" + root)[0] + "/")
    assert sorted(prefixes.values()) == [f"{run}/isolation/{tenant}/" for tenant in ISOLATION_TENANTS]
    mine, theirs = (next(t for t, p in prefixes.items() if p.endswith(f"/{tenant}/")) for tenant in ISOLATION_TENANTS)
    # Tenant B's token wrote its object (the upload names it in its body); then tenant A's token was sent to read,
    # overwrite, list and delete it, one request each; the root's (the worker's) token removed it.
    tokened = [(r.method, _bearer(r)) for r in everything if _bearer(r) in {mine, theirs}]
    assert tokened == [("POST", theirs), ("GET", mine), ("POST", mine), ("GET", mine), ("DELETE", mine)]
    assert all(_bearer(r) == SOURCE_TOKEN for r in everything if _bearer(r) not in {mine, theirs})


# ---------------------------------------------------------------------------------------------------------------------
# Local fakes that enforce keys and tokens as the clouds answer: the check passes.


def _isolation_on(root: FsspecToolResultStore) -> tuple[str, str]:
    """The doctor's tenant-isolation check on `root`, below a run prefix, as `run_conformance` runs it."""
    probe = FsspecToolResultStore(
        f"{root.url}/.doctor/{uuid.uuid4().hex[:12]}", storage_options=root.storage_options, engine=root.engine
    )
    return run_on_io_loop(tenant_isolation, root, probe)


class _EnforcingGCS(QuietHandler):
    """
    GCS's JSON API over a dict, enforcing what the check tests: a customer-supplied key (400 with GCS's reasons for a
    missing or wrong one) and a downscoped token's prefix (403 outside it; the worker's token, or none, reaches all).
    """

    protocol_version = "HTTP/1.1"

    def _allowed(self, name: str) -> bool:
        server: Any = self.server
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        if not token or token == SOURCE_TOKEN:
            return True
        prefix = server.tokens.prefixes.get(token)
        return prefix is not None and name.startswith(prefix)

    def _refuse(self, status: int, reason: str) -> None:
        self.server.refusals.append((self.command, status, reason))  # type: ignore[attr-defined]
        self.answer_json(status, {"error": {"code": status, "message": "Refused.", "errors": [{"reason": reason}]}})

    def _object(self, bucket: str, name: str, size: int) -> dict[str, Any]:
        return {"kind": "storage#object", "bucket": bucket, "name": name, "size": str(size), "generation": "1"}

    def do_POST(self) -> None:  # a simple upload: its name in the body's JSON part
        server: Any = self.server
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        bucket = urlsplit(self.path).path.split("/b/", 1)[1].split("/", 1)[0]
        name = json.loads(re.search(rb'\{"name": "[^"]*"\}', body).group(0))["name"]  # type: ignore[union-attr]
        if not self._allowed(name):
            self._refuse(403, "forbidden")
            return
        data = body.rsplit(b"\r\n--", 1)[0].rsplit(b"\r\n\r\n", 1)[-1]
        server.objects[name] = (data, self.headers.get(GCS_SHA256))
        self.answer_json(200, self._object(bucket, name, len(data)))

    def do_GET(self) -> None:
        server: Any = self.server
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        bucket, _, name = url.path.split("/b/", 1)[1].partition("/o")
        name = unquote(name.removeprefix("/"))
        if not name:  # a listing
            prefix = query.get("prefix", "")
            if not self._allowed(prefix):
                self._refuse(403, "forbidden")
                return
            items = [self._object(bucket, key, len(data)) for key, (data, _) in server.objects.items()]
            self.answer_json(
                200, {"kind": "storage#objects", "items": [i for i in items if i["name"].startswith(prefix)]}
            )
            return
        if not self._allowed(name):
            self._refuse(403, "forbidden")
            return
        if name not in server.objects:
            self.answer_json(404, {"error": {"code": 404, "message": "No such object."}})
            return
        data, key = server.objects[name]
        sent = self.headers.get(GCS_SHA256)
        if key != sent and server.other_400:  # a 400 that is no key's refusal
            self._refuse(400, "badRequest")
        elif key is not None and sent is None:
            self._refuse(400, "resourceIsEncryptedWithCustomerEncryptionKey")
        elif key != sent:
            self._refuse(400, "customerEncryptionKeyIsIncorrect")
        elif query.get("alt") == "media":
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self.answer_json(200, self._object(bucket, name, len(data)))

    def do_DELETE(self) -> None:
        server: Any = self.server
        name = unquote(urlsplit(self.path).path.split("/o/", 1)[1])
        if not self._allowed(name):
            self._refuse(403, "forbidden")
            return
        found = server.objects.pop(name, None)
        self.send_response(204 if found is not None else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def enforcing_gcs(token_service: Any) -> Iterator[Any]:
    with serving(_EnforcingGCS, objects={}, refusals=[], tokens=token_service, other_400=False) as server:
        server.url = f"http://127.0.0.1:{server.server_address[1]}"
        yield server


def _gcs_root(enforcing_gcs: Any, **isolation: Any) -> FsspecToolResultStore:
    options = {"endpoint_url": enforcing_gcs.url, "token": StaticToken(SOURCE_TOKEN), "project": "offload-tests"}
    return FsspecToolResultStore(f"gs://results/{uuid.uuid4().hex[:8]}", storage_options=options, **isolation)


def test_the_check_passes_where_gcs_refuses_an_object_without_its_key_or_with_another(enforcing_gcs: Any) -> None:
    keys = TenantKeys(Secret.from_token(MASTER))
    verdict, detail = _isolation_on(_gcs_root(enforcing_gcs, encryption=keys))
    assert (verdict, detail) == (
        "pass",
        "an object written with a tenant's key is refused without it, and with another tenant's key",
    )
    assert enforcing_gcs.refusals == [
        ("GET", 400, "resourceIsEncryptedWithCustomerEncryptionKey"),
        ("GET", 400, "customerEncryptionKeyIsIncorrect"),
    ]
    assert enforcing_gcs.objects == {}  # removed after


def test_the_check_passes_where_gcs_refuses_a_token_outside_its_boundary(
    enforcing_gcs: Any, token_service: Any
) -> None:
    credentials = DownscopedCredentials(sts_endpoint_url=f"{token_service.url}/v1/token")
    verdict, detail = _isolation_on(_gcs_root(enforcing_gcs, credentials=credentials))
    assert (verdict, detail) == (
        "pass",
        "a tenant's downscoped token is refused another tenant's objects (read, overwrite, list, delete)",
    )
    # Read, overwrite, list, delete: one 403 each, none retried.
    assert enforcing_gcs.refusals == [(method, 403, "forbidden") for method in ("GET", "POST", "GET", "DELETE")]
    assert enforcing_gcs.objects == {}


def test_another_400_is_not_taken_for_a_refused_key_on_gcs(enforcing_gcs: Any) -> None:
    # S3 answers a bare 400 to a read without an SSE-C object's key; GCS names its reason, and the engine raises its
    # key refusals as permission errors: any other 400 is a failure the check reports, not a pass.
    enforcing_gcs.other_400 = True
    with pytest.raises(StorageRequestError, match="HTTP 400"):  # the doctor reports it as a fail naming it
        _isolation_on(_gcs_root(enforcing_gcs, encryption=TenantKeys(Secret.from_token(MASTER))))


class _EnforcingAzure(QuietHandler):
    """Azure Blob Storage over a dict, enforcing customer-provided keys with Azure's 409s and error codes."""

    protocol_version = "HTTP/1.1"

    def _empty(self, status: int, **headers: str) -> None:
        self.send_response(status)
        for name, value in {"Content-Length": "0", **headers}.items():
            self.send_header(name, value)
        self.end_headers()

    def do_PUT(self) -> None:
        server: Any = self.server
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        server.blobs[urlsplit(self.path).path] = (data, self.headers.get(AZURE_SHA256))
        self._empty(201, ETag='"0x1"', **{"Last-Modified": "Sun, 06 Dec 2026 12:00:00 GMT"})

    def do_GET(self) -> None:
        self._read(body=True)

    def do_HEAD(self) -> None:
        self._read(body=False)

    def _read(self, *, body: bool) -> None:
        server: Any = self.server
        found = server.blobs.get(urlsplit(self.path).path)
        if found is None:
            self._empty(404, **{"x-ms-error-code": "BlobNotFound"})
            return
        data, key = found
        sent = self.headers.get(AZURE_SHA256)
        code = (
            "BlobUsesCustomerSpecifiedEncryption"
            if key is not None and sent is None
            else "BlobDoesNotUseCustomerSpecifiedEncryption"
            if key is None and sent is not None
            else "BlobCustomerSpecifiedEncryptionMismatch"
            if key != sent
            else None
        )
        if code is None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("ETag", '"0x1"')
            self.send_header("Last-Modified", "Sun, 06 Dec 2026 12:00:00 GMT")
            self.end_headers()
            if body:
                self.wfile.write(data)
            return
        server.refusals.append((self.command, code))
        error = f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>No.</Message></Error>'
        self.send_response(409)
        self.send_header("x-ms-error-code", code)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(error)))
        self.end_headers()
        if body:
            self.wfile.write(error.encode())

    def do_DELETE(self) -> None:
        server: Any = self.server
        found = server.blobs.pop(urlsplit(self.path).path, None)
        self._empty(202 if found is not None else 404)


@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_the_check_passes_where_azure_refuses_a_blob_without_its_key_or_with_another(engine: str) -> None:
    from support.azurite import ACCOUNT, ACCOUNT_KEY

    pytest.importorskip("adlfs" if engine == "fsspec" else "obstore")
    with serving(_EnforcingAzure, blobs={}, refusals=[]) as server:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/{ACCOUNT}"
        connection = (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};BlobEndpoint={endpoint}"
        )
        root = FsspecToolResultStore(
            f"az://results/{uuid.uuid4().hex[:8]}",
            storage_options={"connection_string": connection},
            engine=engine,
            encryption=TenantKeys(Secret.from_token(MASTER)),
        )
        verdict, detail = _isolation_on(root)
    assert (verdict, detail) == (
        "pass",
        "an object written with a tenant's key is refused without it, and with another tenant's key",
    )
    # One refusal each, never retried (a 409 is not "exists" or "in flight" here).
    assert server.refusals == [
        ("GET", "BlobUsesCustomerSpecifiedEncryption"),
        ("GET", "BlobCustomerSpecifiedEncryptionMismatch"),
    ]


# ---------------------------------------------------------------------------------------------------------------------
# The flags.


def test_downscoped_credentials_are_for_gs_stores_and_one_kind_of_credentials_is_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["doctor", "--store", "gs://b/p", "--downscoped-credentials", "--tenant-role-arn", "arn:aws:x"]) == 2
    assert "Give --tenant-role-arn (s3://) or --downscoped-credentials (gs://), not both." in capsys.readouterr().err
    assert main(["doctor", "--store", "s3://b/p", "--downscoped-credentials"]) == 2
    assert "gs:// ones (DownscopedCredentials)" in capsys.readouterr().err
    # Downscoping needs the worker's own credentials: anonymous access has none.
    assert (
        main(["doctor", "--store", "gs://b/p", "--downscoped-credentials", "--storage-options", '{"token": "anon"}'])
        == 2
    )
    assert "token='anon' names none" in capsys.readouterr().err
