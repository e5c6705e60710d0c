"""Documents beside the results (approvals, claims, audit): plain and conditional writes on every backend."""

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from haystack_integrations.offload import (
    DocumentExistsError,
    FsspecToolResultStore,
    InvalidReferenceError,
    ResultNotFoundError,
)

pytestmark = [pytest.mark.engines, pytest.mark.real_s3]  # also on the obstore engine (tests/conftest.py)


def test_put_get_list_delete(store: FsspecToolResultStore) -> None:
    docs = store.for_session("acme", "chat-1").documents("approvals")
    assert docs.list() == []
    docs.put("b.json", b'{"b": 1}')
    docs.put("a.json", b'{"a": 1}')
    docs.put("a.json", b'{"a": 2}')
    assert docs.get("a.json") == b'{"a": 2}'
    assert docs.list() == ["a.json", "b.json"]
    docs.delete("a.json")
    docs.delete("a.json")
    assert docs.list() == ["b.json"]
    with pytest.raises(ResultNotFoundError):
        docs.get("a.json")


def test_documents_are_not_results_and_stay_in_their_scope(store: FsspecToolResultStore) -> None:
    mine = store.for_session("acme", "chat-1")
    reference = mine.write(key="k.txt", content="result")
    mine.documents("audit").put("0001.json", b"{}")
    assert [record.reference for record in mine.list()] == [reference]
    assert [record.reference for record in store.list()] == [f"acme/chat-1/{reference}"]
    assert store.for_session("acme", "chat-2").documents("audit").list() == []
    assert store.for_session("globex", "chat-1").documents("audit").list() == []
    assert mine.documents("approvals").list() == []
    assert mine.purge() == 1
    assert mine.documents("audit").list() == ["0001.json"]  # purge removes results only


def test_create_is_exclusive(store: FsspecToolResultStore) -> None:
    docs = store.for_session("acme", "chat-1").documents("claims")
    docs.create("call_1", b"worker-a")
    with pytest.raises(DocumentExistsError) as caught:
        docs.create("call_1", b"worker-b")
    assert isinstance(caught.value, FileExistsError)
    assert docs.get("call_1") == b"worker-a"


def test_concurrent_creates_have_exactly_one_winner(store: FsspecToolResultStore) -> None:
    docs = store.for_session("acme", "chat-1").documents("claims")

    def claim(worker: int) -> bool:
        try:
            docs.create("call_1", str(worker).encode())
        except DocumentExistsError:
            return False
        return True

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(claim, range(16)))
    assert outcomes.count(True) == 1
    assert docs.get("call_1") == str(outcomes.index(True)).encode()


async def test_async_documents_and_racing_creates(store: FsspecToolResultStore) -> None:
    docs = store.for_session("acme", "chat-1").documents("claims")
    await docs.put_async("x", b"1")
    assert await docs.get_async("x") == b"1"
    assert await docs.list_async() == ["x"]

    async def claim(worker: int) -> bool:
        try:
            await docs.create_async("call_2", str(worker).encode())
        except DocumentExistsError:
            return False
        return True

    outcomes = await asyncio.gather(*(claim(worker) for worker in range(10)))
    assert outcomes.count(True) == 1
    await docs.delete_async("x")
    assert await docs.list_async() == ["call_2"]


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", ".hidden", "a\x00", "x" * 201, "é"])
def test_bad_document_names_are_refused(store: FsspecToolResultStore, name: str) -> None:
    docs = store.for_session("acme", "chat-1").documents("approvals")
    with pytest.raises(InvalidReferenceError):
        docs.put(name, b"x")
    with pytest.raises(InvalidReferenceError):
        docs.get(name)


@pytest.mark.parametrize("namespace", ["", "Approvals", "../x", ".x", "a/b", "x" * 40])
def test_bad_namespaces_are_refused(store: FsspecToolResultStore, namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        store.documents(namespace)


@pytest.mark.s3
@pytest.mark.parametrize("engine", [{}, {"engine": "obstore"}], ids=["fsspec", "obstore"])
def test_s3_create_is_one_conditional_put_and_a_lost_race_one_read_back(s3_server, s3_requests, engine) -> None:  # type: ignore[no-untyped-def]
    store = FsspecToolResultStore(
        f"{s3_server.bucket_url}/documents-{uuid.uuid4().hex}", storage_options=s3_server.storage_options(), **engine
    )
    docs = store.for_session("acme", "chat-1").documents("claims")
    store.warm_up()
    store.check_exclusive_creates().require()  # once per process and backend, before the first create
    s3_requests.clear()
    docs.create("call_9", b"first")
    with pytest.raises(DocumentExistsError):
        docs.create("call_9", b"second")
    # The 412 is not taken for an answer: one GET tells whether the document there is this writer's own.
    assert [(r.method, r.status, r.header("if-none-match")) for r in s3_requests] == [
        ("PUT", 200, "*"),
        ("PUT", 412, "*"),
        ("GET", 200, None),
    ]
