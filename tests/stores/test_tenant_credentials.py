"""
Per-tenant credentials (`AssumeRoleCredentials`) on moto's S3 and STS: every request of a tenant's store, documents
included, signs with that tenant's temporary credentials; the root's with the worker's; one STS call per tenant
however many runs start at once; renewed before expiry; serialized by reference. (The refusals are RGW's to show:
``tests/infra/test_tenant_policy_rgw_sts.py``.)
"""

import asyncio
import gc
import re
import threading
import uuid
import weakref
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore, StorageError, StoragePermissionError
from haystack_integrations.offload.stores import AssumeRoleCredentials
from haystack_integrations.offload.stores.credentials import STS_ATTEMPTS, role_session_name
from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from support.clients import Client

pytestmark = pytest.mark.s3

ENGINES = ["obstore", "fsspec"]
ROLE = "arn:aws:iam::123456789012:role/offload-tenants"
_SIGNED_BY = re.compile(r"Credential=([A-Z0-9]+)/")


def _root(s3_server: LocalS3Server, engine: str, credentials: AssumeRoleCredentials) -> FsspecToolResultStore:
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex[:8]}"
    return FsspecToolResultStore(
        url, storage_options=s3_server.storage_options(), engine=engine, credentials=credentials
    )


def _keys(requests: RequestLog, path_part: str) -> set[str]:
    """The access keys that signed the S3 requests whose path or query holds `path_part`."""
    signed = set()
    for request in requests.snapshot():
        if path_part in request.path or path_part in request.query:
            authorization = dict(request.headers).get("authorization", "")
            if match := _SIGNED_BY.search(authorization):
                signed.add(match.group(1))
    return signed


@pytest.mark.parametrize("engine", ENGINES)
def test_each_tenant_signs_with_its_own_credentials_and_the_root_with_the_workers(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str
) -> None:
    source = AssumeRoleCredentials(ROLE)
    root = _root(s3_server, engine, source)
    acme, globex = root.for_session("acme", "s1"), root.for_session("globex", "s1")
    acme.read(acme.write(key="call-1", content="a"))
    acme.documents("approvals").create("request.json", b"{}")
    globex.write(key="call-1", content="g")
    root.list()
    acme_keys, globex_keys = _keys(s3_requests, "/acme/"), _keys(s3_requests, "/globex/")
    worker_key = s3_server.storage_options()["key"]
    assert len(acme_keys) == 1 and len(globex_keys) == 1 and acme_keys != globex_keys
    assert worker_key not in acme_keys | globex_keys
    assert source.calls == 2
    tokens = {dict(r.headers).get("x-amz-security-token") for r in s3_requests.snapshot() if "/acme/" in r.path}
    assert None not in tokens  # temporary credentials carry their session token on every request


@pytest.mark.parametrize("engine", ENGINES)
def test_one_sts_call_per_tenant_however_many_runs_start_at_once(s3_server: LocalS3Server, engine: str) -> None:
    source = AssumeRoleCredentials(ROLE)
    root = _root(s3_server, engine, source)
    start = threading.Barrier(12)
    failures: list[BaseException] = []

    def run(number: int) -> None:
        try:
            start.wait()
            session = root.for_session("acme", f"s{number}")
            session.read(session.write(key="call-1", content=str(number)))
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=run, args=(number,)) for number in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    assert source.calls == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_credentials_are_renewed_before_they_expire(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str
) -> None:
    source = AssumeRoleCredentials(ROLE, duration=timedelta(seconds=900), renew_before=timedelta(minutes=5))
    session = _root(s3_server, engine, source).for_session("acme", "s1")
    session.write(key="call-1", content="a")
    session.write(key="call-2", content="a")
    assert source.calls == 1  # fresh: reused
    # Let the clock reach the renewal point: the cached credentials now expire within `renew_before`.
    [(scope, cached)] = source._cache.items()
    source._cache[scope] = replace(cached, expires_at=datetime.now(UTC) + timedelta(minutes=5) - timedelta(seconds=1))
    session.write(key="call-3", content="b")
    assert source.calls == 2
    assert len(_keys(s3_requests, "/acme/")) == 2  # the second write signed with the renewed credentials


def test_a_store_with_tenant_credentials_serializes_them_by_reference(s3_server: LocalS3Server) -> None:
    source = AssumeRoleCredentials(ROLE, duration=timedelta(minutes=30), sts_endpoint_url="http://127.0.0.1:1")
    store = FsspecToolResultStore("s3://bucket/prod", credentials=source)
    data = store.to_dict()
    assert data["init_parameters"]["credentials"]["init_parameters"] == {
        "role_arn": ROLE,
        "duration": 1800.0,
        "renew_before": 300.0,
        "sts_endpoint_url": "http://127.0.0.1:1",
        "region": None,
        "tenant_tag": None,
    }
    again = FsspecToolResultStore.from_dict(data)
    assert isinstance(again.credentials, AssumeRoleCredentials)
    assert again.credentials.duration == timedelta(minutes=30) and again.credentials.role_arn == ROLE


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        AssumeRoleCredentials(ROLE, duration=timedelta(minutes=5))
    with pytest.raises(ValueError, match="renew_before"):
        AssumeRoleCredentials(ROLE, duration=timedelta(minutes=15), renew_before=timedelta(minutes=15))
    with pytest.raises(ValueError, match="s3://"):
        FsspecToolResultStore("memory://x", credentials=AssumeRoleCredentials(ROLE))


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_async_path_asks_sts_off_the_event_loop_once_per_tenant(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str
) -> None:
    source = AssumeRoleCredentials(ROLE)
    root = _root(s3_server, engine, source)
    sessions = [root.for_session("acme", f"a{number}") for number in range(8)]
    references = await asyncio.gather(*(s.write_async(key="call-1", content="x") for s in sessions))
    assert [await s.read_async(r) for s, r in zip(sessions, references, strict=True)] == ["x"] * 8
    assert source.calls == 1
    assert s3_server.storage_options()["key"] not in _keys(s3_requests, "/acme/")


def test_one_source_serving_two_roots_asks_for_each_roots_prefix(s3_server: LocalS3Server) -> None:
    source = AssumeRoleCredentials(ROLE)
    first, second = _root(s3_server, "obstore", source), _root(s3_server, "obstore", source)
    first.for_session("acme", "s1").write(key="call-1", content="a")
    second.for_session("acme", "s1").write(key="call-1", content="b")
    assert source.calls == 2  # acme's credentials for one root's prefix would be refused under the other's


class _ThreadNoting(AssumeRoleCredentials):
    """The real source, noting which thread each STS round trip ran on."""

    threads: list[int]

    def credentials_for(self, tenant: str, **scope: Any) -> Any:
        self.threads.append(threading.get_ident())
        return super().credentials_for(tenant, **scope)


@pytest.mark.parametrize("first", ["warm_up_async", "check_exclusive_creates_async", "write_async"])
async def test_a_tenants_first_async_call_never_asks_sts_on_the_event_loop(
    s3_server: LocalS3Server, first: str
) -> None:
    source = _ThreadNoting(ROLE)
    source.threads = []
    session = _root(s3_server, "obstore", source).for_session("acme", f"first-{first}")
    call = getattr(session, first)
    await (call(key="call-1", content="x") if first == "write_async" else call())
    assert source.threads and threading.get_ident() not in source.threads


@pytest.mark.parametrize(
    ("tenant", "expected"),
    [("acme", "offload-acme"), ("a.b@c=d", "offload-a.b@c=d"), ("a+b", None), ("x" * 80, None)],
)
def test_a_tenants_sts_session_name_is_one_sts_takes(tenant: str, expected: str | None) -> None:
    name = role_session_name(tenant)
    assert re.fullmatch(r"[A-Za-z0-9_=,.@-]{2,64}", name)
    if expected is not None:
        assert name == expected
    else:  # spelled differently: a hash keeps it apart from every other tenant's
        assert name != role_session_name(tenant + "x") and name.startswith("offload-")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("faults", [[Fault.SLOW_DOWN, Fault.RESET_AFTER], [Fault.INTERNAL_ERROR, Fault.RESET]])
def test_a_transient_sts_failure_is_retried_and_the_tenant_gets_its_credentials(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str, faults: list[Fault]
) -> None:
    with FaultProxy(s3_server.endpoint_url) as sts:
        sts.inject(*faults, method="POST")  # AssumeRole is a POST; S3's requests do not go through this proxy
        source = AssumeRoleCredentials(ROLE, sts_endpoint_url=sts.endpoint_url)
        session = _root(s3_server, engine, source).for_session("acme", "s1")
        assert session.read(session.write(key="call-1", content="kept")) == "kept"
        injected = [entry.kind for entry in sts.faults.snapshot()]
    assert injected == faults  # the injector did inject each, in order, and nothing more
    assert source.calls == 1  # one call of ours; botocore's attempts inside it
    assert _keys(s3_requests, "/acme/") and s3_server.storage_options()["key"] not in _keys(s3_requests, "/acme/")


@pytest.mark.parametrize("engine", ENGINES)
async def test_sts_failing_throughout_is_a_storage_error_loses_nothing_and_is_asked_again(
    s3_server: LocalS3Server, engine: str
) -> None:
    with FaultProxy(s3_server.endpoint_url, plan=FaultPlan(rate=1.0, kinds=[Fault.SLOW_DOWN])) as sts:
        source = AssumeRoleCredentials(ROLE, sts_endpoint_url=sts.endpoint_url)
        root = _root(s3_server, engine, source)
        session = root.for_session("acme", "s1")
        with pytest.raises(StorageError, match="credentials: STS answered 503") as failed:
            await session.write_async(key="call-1", content="not lost")
        assert not isinstance(failed.value, StoragePermissionError)  # told apart from a refusal
        assert failed.value.location is not None and "acme" in failed.value.location
        assert [entry.kind for entry in sts.faults.snapshot()] == [Fault.SLOW_DOWN] * STS_ATTEMPTS
        sts.plan.rate = 0.0
        # Nothing was cached: the next request asks STS again, and the caller's retry of the write lands.
        reference = await session.write_async(key="call-1", content="not lost")
    assert await session.read_async(reference) == "not lost" and source.calls == 2


# A replaced client is closed as its last request ends (never under one: `test_tenant_handle_cache`), not left to
# the garbage collector, whose "Unclosed client session" warnings are errors here.
@pytest.mark.parametrize("engine", ENGINES)
async def test_renewing_credentials_leaves_no_client_behind(s3_server: LocalS3Server, engine: str) -> None:
    source = AssumeRoleCredentials(ROLE)
    session = _root(s3_server, engine, source).for_session("acme", "s1")
    replaced = []
    closed_when_replaced = []
    for number in range(4):
        session.write(key=f"sync-{number}", content="a")  # the sync path's client (fsspec's loop)
        await session.write_async(key=f"async-{number}", content="b")  # this loop's own client
        replaced.append(weakref.ref(session._handle.io()))
        closed_when_replaced.append(Client(session._handle.io()))
        source._cache.clear()  # as if they were due: the next request renews them
    assert source.calls == 4
    await asyncio.sleep(0.1)  # a sync client is closed on fsspec's loop, in its thread
    assert [client.closed() for client in closed_when_replaced] == [True, True, True, False]
    del closed_when_replaced
    gc.collect()
    assert [ref() is None for ref in replaced[:-1]] == [True, True, True]  # only the current client is alive
    s3fs = pytest.importorskip("s3fs")
    temporary = {fs.key for fs in s3fs.S3FileSystem._cache.values()} & _keys_issued(session)
    assert temporary == set()  # and fsspec's instance cache keeps none of the tenant's clients


def _keys_issued(session: FsspecToolResultStore) -> set[str]:
    signer = session._handle._signer
    assert signer is not None and signer.signing is not None
    return {signer.signing.key}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tenant_tag_carries_the_tenant_id_as_a_session_tag(s3_server: LocalS3Server, engine: str) -> None:
    source = AssumeRoleCredentials(ROLE, tenant_tag="tenant")
    root = _root(s3_server, engine, source)
    sent: list[dict[str, Any]] = []
    client = source._sts(s3_server.storage_options())
    client.meta.events.register("before-call.sts.AssumeRole", lambda params, **_: sent.append(params["body"]))
    for tenant in ("acme", "globex"):
        session = root.for_session(tenant, "s1")
        session.read(session.write(key="call-1", content=tenant))
    assert [(body["Tags.member.1.Key"], body["Tags.member.1.Value"]) for body in sent] == [
        ("tenant", "acme"),
        ("tenant", "globex"),
    ]
    again = AssumeRoleCredentials.from_dict(source.to_dict())
    assert again.tenant_tag == "tenant"
    with pytest.raises(ValueError, match="not an STS tag key"):
        AssumeRoleCredentials(ROLE, tenant_tag="tenant*")
