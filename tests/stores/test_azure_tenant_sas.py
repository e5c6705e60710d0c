"""
Per-tenant directory SAS on ``az://`` (`DirectorySasCredentials`), through adlfs and obstore: each tenant's client
sends its own directory's SAS (``sr=d``, its depth in ``sdd``) and no other credential, one SAS per tenant, renewed
when due; the root's operator requests keep the worker's Shared Key. Azurite refuses every ``sr=d`` SAS (it has no
hierarchical namespace), so the requests go through a proxy that plays an account with one (support/directory_sas.py):
it checks each SAS's signature from Azure's documented string-to-sign, and refuses another directory's blobs. That
Azure itself enforces the scope is not proven here (xfailed on Azurite).
"""

import datetime
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl

import pytest
from haystack.core.errors import SerializationError
from haystack.utils import Secret

from haystack_integrations.offload import FsspecToolResultStore, StorageError, StoragePermissionError
from haystack_integrations.offload.stores import AssumeRoleCredentials, DirectorySasCredentials, DownscopedCredentials
from haystack_integrations.offload.stores.azure_sas import directory_depth, directory_sas
from support.directory_sas import DirectorySasProxy, Seen, signature, string_to_sign

pytest.importorskip("adlfs")
pytest.importorskip("obstore")

ENGINES = ["fsspec", "obstore"]  # adlfs, and object_store's AzureStore
_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _connection(endpoint: str) -> str:
    from support.azurite import ACCOUNT, ACCOUNT_KEY

    return f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};BlobEndpoint={endpoint}"


@pytest.fixture
def proxy(azurite_server: Any) -> Iterator[DirectorySasProxy]:
    from support.azurite import ACCOUNT, ACCOUNT_KEY

    with DirectorySasProxy(azurite_server.port, ACCOUNT, ACCOUNT_KEY) as running:
        yield running


def _root(endpoint: str, container: str, engine: str, credentials: Any) -> FsspecToolResultStore:
    return FsspecToolResultStore(
        f"az://{container}/{uuid.uuid4().hex[:8]}",
        storage_options={"connection_string": _connection(endpoint)},
        engine=engine,
        credentials=credentials,
    )


def _directory_of(request: Seen) -> str:
    """The directory a request's SAS names: the first ``sdd`` segments of its blob (a listing's prefix)."""
    if request.subrequests:  # a Blob Batch: its blobs' (each subrequest carries the SAS, checked by the proxy)
        named = request.subrequests[0].split("/", 1)[1]
    elif request.query.get("comp") == "list":
        named = request.query.get("prefix", "")
    else:
        named = request.path.split("/", 1)[1]
    return "/".join(named.split("/")[: int(request.query["sdd"])])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("results", [5, 50])
def test_a_tenants_requests_carry_its_own_directory_sas_and_nothing_else_one_sas_per_tenant(
    azurite_server: Any, proxy: DirectorySasProxy, engine: str, results: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.azurite import ACCOUNT_KEY

    # An account key in the environment too (adlfs and obstore read it): a tenant's client must not sign with it.
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", ACCOUNT_KEY)
    credentials = DirectorySasCredentials()
    root = _root(proxy.endpoint, azurite_server.new_container(), engine, credentials)
    prefix = root.url.split("/", 3)[3]
    acme, globex = root.for_session("acme", "s1"), root.for_session("globex", "s1")
    for n in range(results):
        reference = acme.write(key=f"{n}.txt", content="x" * 100)
        globex.write(key=f"{n}.txt", content="y")
    assert acme.read(reference) == "x" * 100 and acme.read_range(reference, 0, 3) == b"xxx"
    assert len(acme.list_page(limit=100).results) == results
    acme.delete(reference)

    seen = proxy.snapshot()
    signed = [request for request in seen if request.sas]
    # Every request of a tenant's store (writes, reads, the listing, the delete) carried a directory SAS the proxy
    # accepted, for its own tenant's directory, and no Authorization header (no Shared Key, no bearer token).
    assert len(signed) >= 2 * results + 4
    assert all(request.allowed and request.query["sr"] == "d" and request.query["sdd"] == "2" for request in signed)
    assert not any(request.authorization for request in signed)
    assert {_directory_of(request) for request in signed} == {f"{prefix}/acme", f"{prefix}/globex"}
    assert {request.query["sp"] for request in signed} == {"racwdl"}
    # One SAS per tenant, the same on each of its requests, at both sizes; one namespace check (Shared Key) in all.
    sas_of = {
        tenant: {r.query["sig"] for r in signed if _directory_of(r).endswith(tenant)} for tenant in ("acme", "globex")
    }
    assert credentials.calls == 2 and all(len(sigs) == 1 for sigs in sas_of.values())
    assert credentials.namespace_checks == 1 and credentials.delegation_keys == 0
    unsigned = [request for request in seen if not request.sas]
    assert [(r.method, r.query.get("restype"), r.authorization) for r in unsigned] == [("GET", "account", True)]


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_tenants_sas_reaches_no_other_directory(
    azurite_server: Any, proxy: DirectorySasProxy, engine: str
) -> None:
    root = _root(proxy.endpoint, azurite_server.new_container(), engine, DirectorySasCredentials())
    globex = root.for_session("globex", "s1")
    reference = await globex.write_async(key="k", content="globex's")
    acme = root.for_session("acme", "s1")
    await acme.write_async(key="k", content="acme's")
    # Past the store's own scope checks: acme's client, asked for globex's blob, is refused by the proxy's check of
    # acme's SAS (as Azure checks it), and never reaches Azurite.
    path = f"{root.url.split('://', 1)[1]}/globex/s1/{reference}"
    with pytest.raises(OSError):  # adlfs: HTTP 403; object_store: "Access denied"
        await acme._handle.request("get", path, lambda io: io.get_async(path))
    refused = [request for request in proxy.snapshot() if not request.allowed]
    assert len(refused) == 1 and refused[0].method == "GET" and "/globex/" in refused[0].path


@pytest.mark.parametrize("engine", ENGINES)
def test_the_roots_operator_requests_keep_the_workers_shared_key(
    azurite_server: Any, proxy: DirectorySasProxy, engine: str
) -> None:
    credentials = DirectorySasCredentials()
    root = _root(proxy.endpoint, azurite_server.new_container(), engine, credentials)
    reference = root.for_session("acme", "s1").write(key="k", content="acme's")
    before = len(proxy.snapshot())
    assert root.read(f"acme/s1/{reference}") == "acme's"
    root.list()
    root.purge()
    operator = proxy.snapshot()[before:]
    assert operator and all(request.authorization and not request.sas for request in operator)
    assert credentials.calls == 1  # the root made no SAS


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_async_path_sends_the_sas_and_asks_for_it_once(
    azurite_server: Any, proxy: DirectorySasProxy, engine: str
) -> None:
    credentials = DirectorySasCredentials()
    session = _root(proxy.endpoint, azurite_server.new_container(), engine, credentials).for_session("acme", "s2")
    for n in range(5):
        reference = await session.write_async(key=f"{n}", content="async")
    assert await session.read_async(reference) == "async"
    signed = [request for request in proxy.snapshot() if request.sas]
    assert len(signed) == 6 and all(request.allowed and not request.authorization for request in signed)
    assert credentials.calls == 1


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_a_sas_due_for_renewal_is_made_again_and_the_tenants_client_with_it(
    azurite_server: Any, proxy: DirectorySasProxy, engine: str
) -> None:
    # Due 1.5 s after it is made: the first write's requests share one SAS, the second write's (after the wait) make
    # and share another, whose expiry (whole seconds, as Azure takes it) is later, so its signature differs.
    credentials = DirectorySasCredentials(
        lifetime=datetime.timedelta(hours=1),
        renew_before=datetime.timedelta(hours=1) - datetime.timedelta(seconds=1.5),
    )
    session = _root(proxy.endpoint, azurite_server.new_container(), engine, credentials).for_session("acme", "s1")
    session.write(key="a", content="first")
    first = [request.query["sig"] for request in proxy.snapshot() if request.sas]
    time.sleep(1.6)  # past the renewal point (a bounded wait; nothing is timed)
    session.write(key="b", content="second")
    second = [request.query["sig"] for request in proxy.snapshot() if request.sas][len(first) :]
    assert credentials.calls == 2
    assert len(set(first)) == 1 and len(set(second)) == 1 and set(first) != set(second)
    assert all(request.allowed and not request.authorization for request in proxy.snapshot() if request.sas)


def test_the_sas_is_the_documented_directory_sas_and_its_signature_checks_independently() -> None:
    expiry = datetime.datetime(2026, 12, 6, 18, 0, tzinfo=datetime.UTC)
    sas = directory_sas("acct", "results", "prod/acme", expiry=expiry, account_key=_KEY)
    query = dict(parse_qsl(sas))
    assert query["sr"] == "d" and query["sdd"] == "2" and query["sp"] == "racwdl" and query["spr"] == "https"
    assert query["se"] == "2026-12-06T18:00:00Z" and query["sv"] >= "2020-12-06" and "st" not in query
    # The signature, computed from Azure's documented string-to-sign (support/directory_sas.py), not the SDK's.
    assert query["sig"] == signature(query, "acct", _KEY, "results", "prod/acme")
    assert string_to_sign(query, "acct", "results", "prod/acme").split("\n")[3] == "/blob/acct/results/prod/acme"
    assert query["sig"] != signature(query, "acct", _KEY, "results", "prod/globex")  # bound to its directory
    assert directory_depth("acme") == 1 and directory_depth("/a/b/c/") == 3
    with pytest.raises(ValueError, match="directory"):
        directory_sas("acct", "results", "", expiry=expiry, account_key=_KEY)


def test_azurite_has_no_hierarchical_namespace_and_refuses_directory_sas_but_checks_container_sas(
    azurite_server: Any,
) -> None:
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob import BlobServiceClient, ContainerClient, generate_container_sas

    from support.azurite import ACCOUNT, ACCOUNT_KEY

    container = azurite_server.new_container()
    with BlobServiceClient.from_connection_string(azurite_server.connection_string()) as service:
        assert service.get_account_information()["is_hns_enabled"] is False
    expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
    directory = directory_sas(ACCOUNT, container, "p/acme", expiry=expiry, account_key=ACCOUNT_KEY, https_only=False)
    good = generate_container_sas(ACCOUNT, container, account_key=ACCOUNT_KEY, permission="racwdl", expiry=expiry)
    bad = generate_container_sas(
        ACCOUNT, container, account_key=_KEY.replace("E", "F"), permission="racwdl", expiry=expiry
    )
    read_only = generate_container_sas(ACCOUNT, container, account_key=ACCOUNT_KEY, permission="r", expiry=expiry)
    outcomes = {}
    for name, sas in {"directory": directory, "container": good, "bad": bad, "read only": read_only}.items():
        with ContainerClient(azurite_server.endpoint, container, credential=sas) as client:
            try:
                client.upload_blob("p/acme/x", b"x", overwrite=True)
                outcomes[name] = 201
            except HttpResponseError as error:
                outcomes[name] = error.status_code
    assert outcomes == {"directory": 403, "container": 201, "bad": 403, "read only": 403}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.xfail(
    strict=True,
    raises=StoragePermissionError,
    reason="Azurite 3.35 has no hierarchical namespace and refuses every sr=d SAS (403 AuthorizationFailure), a "
    "tenant's own blobs included: whether Azure confines a directory SAS to its directory is not proven here",
)
def test_the_emulator_serves_a_tenant_with_its_directory_sas(azurite_server: Any, engine: str) -> None:
    credentials = DirectorySasCredentials(require_namespace=False)
    session = _root(azurite_server.endpoint, azurite_server.new_container(), engine, credentials).for_session("a", "s")
    session.read(session.write(key="k", content="acme's"))


def test_a_flat_namespace_account_is_refused_before_any_sas_is_made(azurite_server: Any) -> None:
    credentials = DirectorySasCredentials()
    session = _root(azurite_server.endpoint, azurite_server.new_container(), "fsspec", credentials).for_session(
        "a", "s"
    )
    with pytest.raises(StorageError, match=r"no hierarchical namespace.*require_namespace=False"):
        session.write(key="k", content="x")
    assert credentials.namespace_checks == 1 and credentials.calls == 0


def test_the_credentials_round_trip_with_their_account_key_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_TEST_AZURE_KEY", _KEY)
    credentials = DirectorySasCredentials(
        Secret.from_env_var("OFFLOAD_TEST_AZURE_KEY"),
        lifetime=datetime.timedelta(minutes=30),
        renew_before=datetime.timedelta(minutes=5),
        permission="rl",
        require_namespace=False,
    )
    data = credentials.to_dict()
    assert _KEY not in str(data)
    again = DirectorySasCredentials.from_dict(data)
    assert again.account_key is not None and again.account_key.resolve_value() == _KEY
    assert (again.lifetime, again.renew_before, again.permission, again.require_namespace) == (
        datetime.timedelta(minutes=30),
        datetime.timedelta(minutes=5),
        "rl",
        False,
    )
    store = FsspecToolResultStore(
        "az://results/prod", storage_options={"account_name": "acct"}, credentials=credentials
    )
    restored = FsspecToolResultStore.from_dict(store.to_dict())
    assert isinstance(restored.credentials, DirectorySasCredentials)
    assert restored.credentials.to_dict() == data
    with pytest.raises(ValueError, match="token"):
        DirectorySasCredentials(Secret.from_token(_KEY)).to_dict()
    with pytest.raises(SerializationError, match="Secret"):
        FsspecToolResultStore(
            "az://results/prod",
            storage_options={"account_name": "acct"},
            credentials=DirectorySasCredentials(Secret.from_token(_KEY)),
        ).to_dict()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"lifetime": datetime.timedelta(days=8)}, "at most 7 days"),
        ({"lifetime": datetime.timedelta(0)}, "more than 0"),
        ({"renew_before": datetime.timedelta(hours=1)}, "less than lifetime"),
        ({"permission": "racwdlx"}, "letters of 'racwdl'"),
        ({"account_key": _KEY}, "haystack Secret"),
    ],
)
def test_bad_settings_are_refused_when_made(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DirectorySasCredentials(**arguments)


@pytest.mark.parametrize(
    ("url", "options", "credentials", "message"),
    [
        ("s3://bucket/prod", {}, DirectorySasCredentials(), "DirectorySasCredentials"),
        ("gs://bucket/prod", {"token": "anon"}, DirectorySasCredentials(), "DirectorySasCredentials"),
        ("az://results/prod", {"account_name": "acct"}, DownscopedCredentials(), "DirectorySasCredentials"),
        ("az://results/prod", {"account_name": "acct"}, AssumeRoleCredentials("arn:aws:iam::1:role/r"), "az://"),
        ("az://results/prod", {}, DirectorySasCredentials(), "account_name or a connection_string"),
        (
            "abfs://results/prod",
            {"connection_string": _connection("http://10.1.2.3/acct")},
            DirectorySasCredentials(),
            "must be https://",
        ),
    ],
)
def test_credentials_a_store_cannot_use_are_refused_before_anything_is_sent(
    url: str, options: dict[str, Any], credentials: Any, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_CONNECTION_STRING"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=message):
        FsspecToolResultStore(url, storage_options=options, credentials=credentials)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_secret_connection_string_to_a_plain_http_endpoint_elsewhere_gets_no_sas(engine: str) -> None:
    secret = Secret.from_token(f"AccountName=a;AccountKey={_KEY};BlobEndpoint=http://10.0.0.7:10000/a")
    credentials = DirectorySasCredentials(require_namespace=False)
    store = FsspecToolResultStore(
        "az://results/p", storage_options={"connection_string": secret}, engine=engine, credentials=credentials
    )
    with pytest.raises(ValueError, match="must be https://"):
        store.for_session("acme", "s1").write(key="k", content="never sent")
    assert credentials.calls == 0


@pytest.mark.slow
def test_without_an_account_key_one_user_delegation_key_signs_every_tenants_sas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from support.azurite import ACCOUNT, azurite_available
    from support.azurite_oauth import OBJECT_ID, TENANT_ID, FakeIdentity, azurite_with_oauth

    missing = azurite_available() or (None if shutil.which("openssl") else "openssl is not installed")
    if missing is not None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
    for name in ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_CONNECTION_STRING"):
        monkeypatch.delenv(name, raising=False)
    with azurite_with_oauth() as (endpoint, certificate):
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", certificate)
        identity = FakeIdentity()
        options = {"account_name": ACCOUNT, "account_host": endpoint.removeprefix("https://"), "credential": identity}
        credentials = DirectorySasCredentials(require_namespace=False)
        acme = credentials.credentials_for("acme", bucket="results", prefix="prod/acme", base_options=options)
        globex = credentials.credentials_for("globex", bucket="results", prefix="prod/globex", base_options=options)
        assert credentials.credentials_for("acme", bucket="results", prefix="prod/acme", base_options=options) is acme
        # Azure AD's identity asked Azurite for one user delegation key; it signed both tenants' SAS.
        assert credentials.delegation_keys == 1 and credentials.calls == 2 and identity.tokens == 1
        for sas, directory in ((acme, "prod/acme"), (globex, "prod/globex")):
            query = dict(parse_qsl(sas.sas))
            assert (query["sr"], query["sdd"], query["skoid"], query["sktid"], query["sks"]) == (
                "d",
                "2",
                OBJECT_ID,
                TENANT_ID,
                "b",
            )
            key_expiry = datetime.datetime.strptime(query["ske"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
            assert sas.expiry <= key_expiry and sas.scope == f"results/{directory}"
        # An identity Azure refuses (a token for another audience): a permission error, no SAS made.
        refused = DirectorySasCredentials(require_namespace=False)
        other = {**options, "credential": FakeIdentity(audience="https://management.azure.com")}
        with pytest.raises(StoragePermissionError, match="user delegation key"):
            refused.credentials_for("acme", bucket="results", prefix="prod/acme", base_options=other)
        assert refused.calls == 0 and refused.delegation_keys == 1
