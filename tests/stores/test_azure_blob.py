"""
Azure Blob Storage (``az://``, ``abfs://``) through adlfs, against Azurite: the store's promises as on S3 (round trips,
pages, exclusive creates), refusals classified by status, and an unreachable endpoint retried by our loop alone.
"""

import asyncio
import uuid
from typing import Any

import pytest

from haystack_integrations.offload import (
    DocumentExistsError,
    FsspecToolResultStore,
    RetryPolicy,
    StorageError,
    StoragePermissionError,
)
from haystack_integrations.offload.stores import fsspec_store
from haystack_integrations.offload.testing.faults import FaultProxy
from support.stopped_server import write_after_the_server_stopped

pytest.importorskip("adlfs")

# A well-formed account key that is not the emulator's: Azurite checks the signature, as Azure does.
WRONG_KEY = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXk="


def _store(server: Any, protocol: str = "az", **kwargs: Any) -> FsspecToolResultStore:
    url = f"{protocol}://{server.new_container()}/{uuid.uuid4().hex}"
    options = kwargs.pop("storage_options", None) or server.storage_options()
    # adlfs's engine (the fsspec one): "auto" picks obstore for az:// (tests/stores/test_obstore_azure.py).
    return FsspecToolResultStore(url, storage_options=options, **{"engine": "fsspec", **kwargs})


def _requests_per_call(store: FsspecToolResultStore, proxy: Any, size: int, results: int) -> dict[str, list[str]]:
    """The methods of the requests one write, one read and one page send, with `results` results of `size` bytes."""
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
    count("page", lambda: session.list_page(limit=20))
    return sent


@pytest.mark.parametrize(("size", "results"), [(1_000, 5), (1_000_000, 50)])
def test_one_request_per_write_and_read_and_two_per_page_at_any_size(
    azurite_server: Any, size: int, results: int
) -> None:
    from support.azurite import ACCOUNT

    with FaultProxy(f"http://127.0.0.1:{azurite_server.port}") as proxy:  # no faults: it counts
        through = azurite_server.connection_string().replace(azurite_server.endpoint, f"{proxy.endpoint_url}/{ACCOUNT}")
        store = FsspecToolResultStore(
            f"az://{azurite_server.new_container()}/{uuid.uuid4().hex}",
            storage_options={"connection_string": through},
            engine="fsspec",
        )
        sent = _requests_per_call(store, proxy, size, results)
    # The page: adlfs asks whether the prefix is a blob (HEAD), then lists.
    assert sent == {"write": ["PUT"], "read": ["GET"], "page": ["HEAD", "GET"]}


@pytest.mark.parametrize("protocol", ["az", "abfs"])
def test_results_round_trip_page_list_and_delete(azurite_server: Any, protocol: str) -> None:
    session = _store(azurite_server, protocol).for_session("acme", "chat-1")
    references = [session.write(key=f"{n}_search_call_{n}.txt", content=f"result {n} " * 50) for n in range(5)]
    assert [session.read(reference) for reference in references] == [f"result {n} " * 50 for n in range(5)]
    assert session.read_range(references[0], 7, 13) == b"0 resu"
    assert sorted(result.reference for result in session.list()) == sorted(references)
    first = session.list_page(limit=3)
    second = session.list_page(limit=3, after=first.next_after)
    assert len(first.results) == 3 and len(second.results) == 2 and second.next_after is None
    assert {r.reference for r in first.results + second.results} == set(references)
    session.delete(references[0])
    assert sorted(result.reference for result in session.list()) == sorted(references[1:])


def test_two_creators_one_winner(azurite_server: Any) -> None:
    session = _store(azurite_server).for_session("acme", "chat-1")
    assert session.check_exclusive_creates().enforced
    claims = session.documents("claims")

    async def race() -> list[BaseException | None]:
        async def create(data: bytes) -> BaseException | None:
            try:
                await claims.create_async("call_1", data)
            except DocumentExistsError as lost:
                return lost
            return None

        return await asyncio.gather(create(b"first"), create(b"second"))

    outcomes = asyncio.run(race())
    assert sorted(outcome is None for outcome in outcomes) == [False, True]
    assert claims.get("call_1") in (b"first", b"second")
    with pytest.raises(DocumentExistsError):
        claims.create("call_1", b"third")


def test_wrong_credentials_are_a_permission_error_naming_container_and_endpoint(azurite_server: Any) -> None:
    root = _store(azurite_server, storage_options=azurite_server.storage_options(key=WRONG_KEY))
    container = root.url.split("/")[2]
    session = root.for_session("acme", "chat-1")
    with pytest.raises(StoragePermissionError) as caught:
        session.write(key="k.txt", content="x")
    assert caught.value.location == f"az://{container} at {azurite_server.endpoint}"
    assert WRONG_KEY not in str(caught.value) and WRONG_KEY not in caught.value.location
    with pytest.raises(StoragePermissionError):
        session.list()
    assert root.retry_stats.retries == 0  # a refusal is not retried


def test_a_missing_container_is_said_to_be_missing_and_not_retried(azurite_server: Any) -> None:
    root = FsspecToolResultStore("az://no-such-container/prod", storage_options=azurite_server.storage_options())
    with pytest.raises(StorageError, match="the bucket or directory does not exist") as caught:
        root.for_session("acme", "chat-1").write(key="k.txt", content="x")
    assert caught.value.location == f"az://no-such-container at {azurite_server.endpoint}"
    assert root.retry_stats.as_dict()["causes"] == {}


@pytest.mark.parametrize("attempts", [2, 4])
def test_a_stopped_endpoint_fails_after_our_attempts_alone(attempts: int) -> None:
    from support.azurite import AzuriteServer, azurite_available

    missing = azurite_available()
    if missing is not None:
        pytest.skip(missing)  # the session fixture fails it under CI; this one needs a server of its own to stop
    # attempt_timeout well above our attempts' own time: the Azure SDK's first backoff (15 s) would outlast it
    # and show up as a "timeout" cause, where a refused connection fails each attempt at once.
    policy = RetryPolicy(attempts=attempts, base_delay=0, max_delay=0, deadline=None, attempt_timeout=10)
    error, stats, endpoint = write_after_the_server_stopped(AzuriteServer(), _store, policy)
    assert (stats["retries"], stats["gave_up"]) == (attempts - 1, 1)
    assert stats["causes"] == {"connection failed": attempts}
    assert error.location.startswith("az://") and endpoint in error.location


def test_without_adlfs_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(protocol: str) -> None:
        raise ImportError("Install adlfs to access Azure Datalake Gen2 and Azure Blob Storage")

    # fsspec's registry, not our code: as it answers where adlfs is not installed.
    monkeypatch.setattr(fsspec_store.fsspec, "get_filesystem_class", missing)
    for url in ("az://results/prod", "abfs://results/prod"):
        with pytest.raises(ImportError, match=r'pip install "offload-haystack\[azure\]"'):
            FsspecToolResultStore(url, engine="fsspec")  # "auto" serves az:// through obstore, without adlfs
    with pytest.raises(ImportError, match=r'pip install "offload-haystack\[gcs\]"'):
        FsspecToolResultStore("gs://results/prod")


def test_the_stores_filesystem_is_its_own_so_the_applications_keeps_its_sdk_retries(azurite_server: Any) -> None:
    # The store turns the SDK's retries off on its filesystem; before, that was fsspec's cached instance, so the
    # application's own fsspec.filesystem("az", **the same options) came back with its retries off too.
    import fsspec

    store = _store(azurite_server)
    store.for_session("acme", "chat-1").write(key="k.txt", content="x")
    theirs = fsspec.filesystem("az", **azurite_server.storage_options())
    assert theirs.service_client._config.retry_policy.total_retries > 0
