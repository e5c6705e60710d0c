"""
Azure Blob Storage (``az://``, ``abfs://``) through the obstore engine (object_store's `AzureStore`), against Azurite:
``auto`` picks it, the store's promises hold as through adlfs (round trips, ranged reads, pages newest first, exclusive
creates with one winner, deletes), refusals and a stopped endpoint are classified, and each call is one request.
"""

import asyncio
import uuid
from typing import Any

import pytest

from haystack_integrations.offload import (
    DocumentExistsError,
    FsspecToolResultStore,
    RetryPolicy,
    StoragePermissionError,
)
from haystack_integrations.offload.stores.obstore_azure import (
    azure_settings,
    strip_azure_url,
    unsupported_azure_options,
)
from haystack_integrations.offload.testing.faults import FaultProxy
from support.stopped_server import write_after_the_server_stopped

pytest.importorskip("obstore")

# A well-formed account key that is not the emulator's: Azurite checks the signature, as Azure does.
WRONG_KEY = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk="


def _store(server: Any, protocol: str = "az", **kwargs: Any) -> FsspecToolResultStore:
    url = f"{protocol}://{server.new_container()}/{uuid.uuid4().hex}"
    options = kwargs.pop("storage_options", None) or server.storage_options()
    return FsspecToolResultStore(url, storage_options=options, **kwargs)


def _account_options(server: Any, key: str | None = None) -> dict[str, str]:
    """adlfs's other spelling: the account, its key and the endpoint (as account_host cannot say http://)."""
    from support.azurite import ACCOUNT, ACCOUNT_KEY

    return {
        "connection_string": f"AccountName={ACCOUNT};BlobEndpoint={server.endpoint}",
        "account_key": key or ACCOUNT_KEY,
    }


@pytest.mark.parametrize("protocol", ["az", "abfs", "abfss"])
def test_auto_serves_azure_through_obstore(azurite_server: Any, protocol: str) -> None:
    # Before: auto kept adlfs ("Azure is served by adlfs unless engine="obstore" is asked for") until obstore's Azure
    # store held the approvals' 30% fault run, which it now does (benchmarks/README.md).
    store = _store(azurite_server, protocol)
    assert store.resolved_engine == "obstore", store.engine_choice.reason
    assert type(store._handle.io()).__name__ == "AzureObstoreIO"


@pytest.mark.parametrize("protocol", ["az", "abfs"])
def test_results_round_trip_ranged_read_page_list_and_delete(azurite_server: Any, protocol: str) -> None:
    session = _store(azurite_server, protocol, engine="obstore").for_session("acme", "chat-1")
    references = [session.write(key=f"{n}_search_call_{n}.txt", content=f"result {n} " * 50) for n in range(5)]
    assert [session.read(reference) for reference in references] == [f"result {n} " * 50 for n in range(5)]
    assert session.read_range(references[0], 7, 13) == b"0 resu"
    assert session.read_range_and_size(references[0], 7, 13) == (b"0 resu", 450)
    assert session.read_range_and_size(references[0], 1000, 1010) == (b"", 450)  # past the end: Azure's 416
    assert sorted(result.reference for result in session.list()) == sorted(references)
    first = session.list_page(limit=3)
    second = session.list_page(limit=3, after=first.next_after)
    # Newest first, the second page after the first: Azure has no start-after, the engine filters what it lists.
    assert [r.reference for r in first.results + second.results] == references[::-1]
    assert second.next_after is None
    session.delete(references[0])
    session.delete(references[0])  # a missing blob is no error
    assert sorted(result.reference for result in session.list()) == sorted(references[1:])


def test_find_children_and_a_batch_delete_with_a_missing_blob(azurite_server: Any) -> None:
    root = _store(azurite_server, storage_options=_account_options(azurite_server), engine="obstore")
    for tenant, session in (("acme", "a"), ("acme", "b"), ("globex", "c")):
        root.for_session(tenant, session).write(key="k.txt", content="x")
    assert root.find_children().directories == ["acme", "globex"]
    assert root.for_tenant("acme").find_children().directories == ["a", "b"]
    found = root.find_objects()
    root.delete_objects([*found, "acme/a/never-written.txt"])
    assert root.find_objects() == {}


def test_eight_creators_one_winner_and_the_next_create_refused(azurite_server: Any) -> None:
    session = _store(azurite_server, engine="obstore").for_session("acme", "chat-1")
    assert session.check_exclusive_creates().enforced
    claims = session.documents("claims")

    async def race() -> list[BaseException | None]:
        async def create(data: bytes) -> BaseException | None:
            try:
                await claims.create_async("call_1", data)
            except DocumentExistsError as lost:
                return lost
            return None

        return await asyncio.gather(*(create(f"writer {n}".encode()) for n in range(8)))

    outcomes = asyncio.run(race())
    assert sum(outcome is None for outcome in outcomes) == 1
    winner = outcomes.index(None)
    assert claims.get("call_1") == f"writer {winner}".encode()
    with pytest.raises(DocumentExistsError):
        claims.create("call_1", b"late")
    assert session.retry_stats.as_dict()["causes"] == {}  # Azure's 409 BlobAlreadyExists is an answer, not retried


def test_the_engines_exclusive_create_raises_file_exists_on_azures_409(azurite_server: Any) -> None:
    store = _store(azurite_server, engine="obstore")
    io = store._handle.io()
    path = f"{store._handle.root_path()}/doc.json"

    async def twice() -> None:
        await io.put_exclusive_async(path, b"one")
        await io.put_exclusive_async(path, b"two")

    with pytest.raises(FileExistsError) as caught:
        asyncio.run(twice())
    assert "409" in str(caught.value) and "BlobAlreadyExists" in str(caught.value)


@pytest.mark.parametrize("spelling", ["connection_string", "account_key"])
def test_wrong_credentials_are_a_permission_error_naming_container_and_endpoint(
    azurite_server: Any, spelling: str
) -> None:
    options = (
        azurite_server.storage_options(key=WRONG_KEY)
        if spelling == "connection_string"
        else _account_options(azurite_server, WRONG_KEY)
    )
    root = _store(azurite_server, storage_options=options, engine="obstore")
    container = root.url.split("/")[2]
    session = root.for_session("acme", "chat-1")
    with pytest.raises(StoragePermissionError) as caught:
        session.write(key="k.txt", content="x")
    assert caught.value.location == f"az://{container} at {azurite_server.endpoint}"
    assert WRONG_KEY not in str(caught.value) and WRONG_KEY not in caught.value.location
    with pytest.raises(StoragePermissionError):
        session.list()
    assert root.retry_stats.retries == 0  # a refusal is not retried


@pytest.mark.parametrize("attempts", [2, 4])
def test_a_stopped_endpoint_fails_after_our_attempts_alone(attempts: int) -> None:
    from support.azurite import AzuriteServer, azurite_available

    missing = azurite_available()
    if missing is not None:
        pytest.skip(missing)  # this one needs a server of its own to stop
    policy = RetryPolicy(attempts=attempts, base_delay=0, max_delay=0, deadline=None, attempt_timeout=10)
    error, stats, endpoint = write_after_the_server_stopped(
        AzuriteServer(), lambda server, **kwargs: _store(server, engine="obstore", **kwargs), policy
    )
    # obstore's own retries are off: each of our attempts is one refused connection.
    assert (stats["retries"], stats["gave_up"]) == (attempts - 1, 1)
    assert stats["causes"] == {"connection failed": attempts}
    assert error.location.startswith("az://") and endpoint in error.location


def _requests_per_call(store: FsspecToolResultStore, proxy: Any, size: int, results: int) -> dict[str, list[str]]:
    """The methods of the requests one write, one read and two pages send, with `results` results of `size` bytes."""
    session = store.for_session("acme", "chat-1")
    session.warm_up()
    sent: dict[str, list[str]] = {}

    def count(label: str, call: Any) -> Any:
        before = len(proxy.requests.snapshot())
        answer = call()
        sent[label] = [request.method for request in proxy.requests.snapshot()[before:]]
        return answer

    reference = count("write", lambda: session.write(key="k.txt", content="x" * size))
    for n in range(results - 1):
        session.write(key=f"{n}.txt", content="y")
    count("read", lambda: session.read(reference))
    count("ranged read", lambda: session.read_range(reference, 10, 20))
    first = count("page", lambda: session.list_page(limit=20))
    count("next page", lambda: session.list_page(limit=20, after=first.next_after))
    return sent


@pytest.mark.parametrize(("size", "results"), [(1_000, 5), (1_000_000, 50)])
def test_one_request_per_write_read_and_page_at_any_size(azurite_server: Any, size: int, results: int) -> None:
    from support.azurite import ACCOUNT

    with FaultProxy(f"http://127.0.0.1:{azurite_server.port}") as proxy:  # no faults: it counts
        through = azurite_server.connection_string().replace(azurite_server.endpoint, f"{proxy.endpoint_url}/{ACCOUNT}")
        store = FsspecToolResultStore(
            f"az://{azurite_server.new_container()}/{uuid.uuid4().hex}",
            storage_options={"connection_string": through},
            engine="obstore",
        )
        assert store.resolved_engine == "obstore"
        sent = _requests_per_call(store, proxy, size, results)
    # adlfs sends a HEAD of the prefix before its page's LIST; here a page is the LIST alone. With 5 results there is
    # no next page to read (next_after is None: the call lists from the start, filtered after the mark).
    assert sent == {"write": ["PUT"], "read": ["GET"], "ranged read": ["GET"], "page": ["GET"], "next page": ["GET"]}


def test_options_the_engine_cannot_honour_are_refused_and_auto_falls_back_to_adlfs(azurite_server: Any) -> None:
    pytest.importorskip("adlfs")
    options = {**azurite_server.storage_options(), "timeout": 5, "location_mode": "secondary"}
    assert unsupported_azure_options(options) == ["timeout", "location_mode='secondary'"]
    url = f"az://{azurite_server.new_container()}/prod"
    with pytest.raises(ValueError, match=r"timeout, location_mode='secondary' not supported by the obstore"):
        FsspecToolResultStore(url, storage_options=options, engine="obstore")
    store = FsspecToolResultStore(url, storage_options=options)
    assert store.resolved_engine == "fsspec" and "timeout" in store.engine_choice.reason
    # adlfs's caching options mean nothing here, and are accepted as s3fs's are.
    assert unsupported_azure_options({"blocksize": 2**20, "use_listings_cache": False, "anon": True}) == []


def test_adlfs_options_become_azure_store_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ANON"):
        monkeypatch.delenv(variable, raising=False)
    settings = azure_settings(
        {
            "connection_string": (
                "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5;EndpointSuffix=core.windows.net"
            ),
            "connection_timeout": 3,
        },
        retrying=True,
        attempt_timeout=20,
    )
    assert settings.config == {
        "account_name": "acct",
        "account_key": "a2V5",
        "endpoint": "https://acct.blob.core.windows.net",
    }
    assert settings.retry_config == {"max_retries": 0}
    assert {name: value.total_seconds() for name, value in settings.client_options.items()} == {
        "connect_timeout": 3,
        "timeout": 20,
    }
    sas = azure_settings(
        {"account_name": "acct", "sas_token": "?sv=2024&sig=abc"}, retrying=False, attempt_timeout=None
    )
    assert sas.config == {"account_name": "acct", "sas_key": "sv=2024&sig=abc"} and sas.retry_config == {}
    anon = azure_settings(
        {"account_name": "acct", "account_host": "acct.blob.example"}, retrying=False, attempt_timeout=None
    )
    assert anon.config == {"account_name": "acct", "endpoint": "https://acct.blob.example"}
    assert azure_settings({"account_name": "acct", "anon": True}, retrying=False, attempt_timeout=None).config[
        "skip_signature"
    ]
    development = azure_settings(
        {"connection_string": "UseDevelopmentStorage=true"}, retrying=False, attempt_timeout=None
    )
    assert development.config == {"use_emulator": True} and "use_emulator" not in repr(development)
    assert "a2V5" not in repr(settings)  # the account key stays out of logs
    with pytest.raises(ValueError, match="needs the Azure account"):
        azure_settings({}, retrying=False, attempt_timeout=None)
    assert strip_azure_url("abfs://results@acct.dfs.core.windows.net/prod/") == "results/prod"
    assert strip_azure_url("az://results/prod") == "results/prod"


@pytest.mark.parametrize("engine", [[], ["--engine", "obstore"]])
def test_doctor_passes_on_azure_through_obstore(
    azurite_server: Any, capsys: pytest.CaptureFixture[str], engine: list[str]
) -> None:
    import json

    from haystack_integrations.offload.cli import main
    from haystack_integrations.offload.operations.conformance import EXIT_PASSED

    pytest.importorskip("adlfs")  # the checks that speak Azure's protocol go through the engine's adlfs fallback
    url = f"az://{azurite_server.new_container()}/{uuid.uuid4().hex}"
    options = json.dumps(azurite_server.storage_options())
    code = main(["doctor", "--store", url, "--storage-options", options, *engine, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["engine"] == "obstore"
    verdicts = {check["name"]: check["verdict"] for check in report["checks"]}
    assert code == EXIT_PASSED and set(verdicts.values()) == {"pass", "skipped"}, report
    assert [name for name, verdict in verdicts.items() if verdict == "skipped"] == ["tenant-isolation"]
    # The store's large write is obstore's: above its 16 MiB, 5 MiB blocks (adlfs's would be 4 MiB above 64 MiB).
    large = next(check["detail"] for check in report["checks"] if check["name"] == "multipart-write")
    assert "obstore engine's 16 MiB" in large and "committed as 4 blocks of up to 5 MiB" in large
