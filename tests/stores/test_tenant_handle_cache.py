"""
A root store with credentials or keys per tenant keeps at most `tenant_clients` tenant clients: the least recently
used is evicted and its client closed (s3fs: its aiohttp sessions; obstore: its buckets' stores dropped), but never
under a request still using it; s3fs tenant clients share one botocore session (the S3 model loaded once).
On moto's S3 and STS, both engines.
"""

import asyncio
import gc
import uuid
from typing import Any

import pytest
from haystack.utils import Secret

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.stores import AssumeRoleCredentials, TenantKeys
from haystack_integrations.offload.stores.io import Engine
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from support.clients import Client

pytestmark = pytest.mark.s3

ENGINES = ["obstore", "fsspec"]
ROLE = "arn:aws:iam::123456789012:role/offload-tenants"
MASTER = "the tests' SSE-C master secret, not a real one"


def _root(s3_server: LocalS3Server, engine: str, isolation: str, size: int) -> FsspecToolResultStore:
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex[:8]}"
    kwargs: dict[str, Any] = (
        {"credentials": AssumeRoleCredentials(ROLE)}
        if isolation == "credentials"
        else {"encryption": TenantKeys(Secret.from_token(MASTER))}
    )
    root = FsspecToolResultStore(url, storage_options=s3_server.storage_options(), engine=engine, **kwargs)
    root._handle.tenant_clients = size
    return root


def _current_io(store: FsspecToolResultStore, tenant: str) -> Engine:
    root_handle = store._handle._root or store._handle
    for (name, _signs), handle in root_handle._tenant_handles.items():
        if name == tenant and handle._io is not None:
            return handle._io
    raise AssertionError(f"no live client for {tenant!r}")


@pytest.mark.parametrize("isolation", ["credentials", "keys"])
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("size", [2, 4])
async def test_live_tenant_clients_stay_within_the_cache_and_evicted_ones_are_closed(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str, isolation: str, size: int
) -> None:
    root = _root(s3_server, engine, isolation, size)
    clients: dict[str, Client] = {}
    references: dict[str, str] = {}
    s3_requests.clear()
    for number in range(size * 3):
        tenant = f"t{number}"
        session = root.for_session(tenant, "s1")
        references[tenant] = reference = await session.write_async(key="call-1", content=tenant)
        assert await session.read_async(reference) == tenant
        clients[tenant] = Client(_current_io(session, tenant))
        assert len(root._handle._tenant_handles) <= size
    await root.for_session("t0", "s1").read_async(references["t0"])  # a request: it closes what is due first
    evicted = {tenant for tenant, client in clients.items() if client.closed()}
    # t0 is back (made again, evicting the least recent): only the last size - 1 tenants' first clients are live.
    assert evicted == {f"t{number}" for number in range(size * 3 - size + 1)}
    # Eviction costs no request of its own: one PUT and one GET per tenant, one GET for t0's return.
    methods = [request.method for request in s3_requests.snapshot() if "/s1/" in request.path]
    assert methods.count("PUT") == size * 3 and methods.count("GET") == size * 3 + 1
    if isolation == "credentials":
        source = root.credentials
        assert source is not None and source.calls == size * 3  # t0 again: its credentials are still cached


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_request_in_flight_on_an_evicted_tenant_completes_before_its_client_closes(
    s3_server: LocalS3Server, engine: str
) -> None:
    root = _root(s3_server, engine, "credentials", 2)
    acme = root.for_session("acme", "s1")
    reference = await acme.write_async(key="call-1", content="kept")
    path = acme._path_of(reference)[0]
    started, go_on = asyncio.Event(), asyncio.Event()

    async def held_get(io: Engine) -> bytes:
        started.set()
        await go_on.wait()  # the client is evicted meanwhile
        return await io.get_async(path)

    reading = asyncio.create_task(acme._handle.request("get", path, held_get))
    await started.wait()
    used = Client(_current_io(acme, "acme"))
    for number in range(3):
        await root.for_session(f"other-{number}", "s1").write_async(key="call-1", content="x")
    assert acme._handle not in root._handle._tenant_handles.values()
    assert len(root._handle._tenant_handles) == 2
    assert not used.closed()  # still in use
    go_on.set()
    assert await reading == b"kept"
    assert used.closed()  # closed as its last request ended
    # The store still holding the evicted handle reads through the tenant's new one.
    assert await acme.read_async(reference) == "kept"
    assert len(root._handle._tenant_handles) == 2


async def test_s3fs_tenant_clients_share_one_botocore_session(s3_server: LocalS3Server) -> None:
    root = _root(s3_server, "fsspec", "credentials", 4)
    stores = [root.for_session(tenant, "s1") for tenant in ("acme", "globex", "initech")]
    for store in stores:
        await store.write_async(key="call-1", content="a")
    clients = [entry.value for store in stores for entry in store._handle.io().loop_clients._entries.values()]  # type: ignore[attr-defined]
    assert len(clients) == 3 and len({id(client.session) for client in clients}) == 1
    gc.collect()


@pytest.mark.parametrize("tenants", [8, 32])
async def test_evicted_obstore_clients_are_not_kept_by_fsspecs_instance_cache(
    s3_server: LocalS3Server, tenants: int
) -> None:
    # fsspec caches every filesystem it makes, by its arguments: each tenant's obstore filesystem (its own credential
    # provider) would stay there after the handle cache let it go, ~21 KiB a tenant for the life of the process.
    from obstore.fsspec import FsspecStore

    root = _root(s3_server, "obstore", "keys", 2)
    before = len(FsspecStore._cache)
    for number in range(tenants):
        await root.for_session(f"t{number}", "s1").write_async(key="call-1", content="x")
    assert len(FsspecStore._cache) == before
