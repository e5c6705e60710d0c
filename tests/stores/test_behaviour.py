"""One behaviour suite for FsspecToolResultStore, run on memory, local disk and S3 (moto's server over HTTP)."""

import asyncio
import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore, InvalidReferenceError, ResultNotFoundError
from haystack_integrations.offload.stores import StoredResult

# Also on the obstore engine (tests/conftest.py). The sync methods wait for the async ones (test_sync_twins.py).
pytestmark = [pytest.mark.real_s3, pytest.mark.engines]

TEXTS = [
    "plain ascii",
    "ünïcödé, 中文, emoji 🦜🔥, RTL שלום",
    "line one\nline two\r\n\ttabbed\x00nul inside",
    "lone surrogate \ud800 survives",
]
BINARIES = [
    b"\x89PNG\r\n\x1a\n\x00\x00binary",
    b"\xff\xfe\xfd not utf-8",
    b"valid utf-8 text, given as bytes",
    bytes(range(256)),
]


@pytest.fixture
def session(store: FsspecToolResultStore) -> FsspecToolResultStore:
    return store.for_session("acme", "chat-1")


@pytest.mark.parametrize("text", TEXTS)
def test_text_round_trips_as_str(session: FsspecToolResultStore, text: str) -> None:
    reference = session.write(key="1_search_call_a.txt", content=text)
    assert session.read(reference) == text
    assert isinstance(session.read(reference), str)


@pytest.mark.parametrize("data", BINARIES)
def test_bytes_round_trip_as_bytes_even_when_valid_utf8(session: FsspecToolResultStore, data: bytes) -> None:
    reference = session.write(key="1_render_call_a.png", content=data)
    result = session.read(reference)
    assert isinstance(result, bytes)
    assert result == data


def test_bytearray_and_memoryview_are_stored_as_bytes(session: FsspecToolResultStore) -> None:
    first = session.write(key="a.bin", content=bytearray(b"abc"))  # type: ignore[arg-type]
    second = session.write(key="b.bin", content=memoryview(b"def"))  # type: ignore[arg-type]
    assert session.read(first) == b"abc"
    assert session.read(second) == b"def"


def test_text_of_a_txt_key_given_as_bytes_stays_bytes(session: FsspecToolResultStore) -> None:
    # The kind comes from what was written, not from the key's extension.
    reference = session.write(key="notes.txt", content=b"hello")
    assert session.read(reference) == b"hello"


@pytest.mark.parametrize("empty", ["", b""])
def test_empty_results_round_trip(session: FsspecToolResultStore, empty: str | bytes) -> None:
    reference = session.write(key="empty.txt", content=empty)
    assert session.read(reference) == empty
    assert type(session.read(reference)) is type(empty)
    assert session.info(reference).size == 0


def test_huge_result_round_trips_byte_for_byte(session: FsspecToolResultStore) -> None:
    block = "".join(f"row {i:07d}: {'x' * 90} é\n" for i in range(60_000))  # ~6 MB of text
    reference = session.write(key="huge.txt", content=block)
    read = session.read(reference)
    assert isinstance(read, str)
    assert hashlib.sha256(read.encode()).digest() == hashlib.sha256(block.encode()).digest()
    assert session.info(reference).size == len(block.encode())


def test_same_key_never_collides(session: FsspecToolResultStore) -> None:
    references = [session.write(key="0_search_call0.txt", content=f"result {i}") for i in range(30)]
    assert len(set(references)) == 30
    assert [session.read(reference) for reference in references] == [f"result {i}" for i in range(30)]


def test_overlong_key_is_bounded_and_distinct(session: FsspecToolResultStore) -> None:
    # Some providers send tool-call ids of ~1.5 KB.
    long_a = "3_search_" + "a" * 1500 + ".txt"
    long_b = "3_search_" + "a" * 1499 + "b.txt"
    ref_a = session.write(key=long_a, content="A")
    ref_b = session.write(key=long_b, content="B")
    assert len(ref_a) <= 200
    assert len(ref_b) <= 200
    assert ref_a.endswith(".txt")
    info_a, info_b = session.info(ref_a), session.info(ref_b)
    assert info_a.key != info_b.key  # the hash of the original key keeps them apart
    assert (session.read(ref_a), session.read(ref_b)) == ("A", "B")


@pytest.mark.parametrize(
    "key",
    [
        "../../../escape.txt",
        "/etc/passwd",
        "a/b\\c.txt",
        "nul\x00.txt",
        "",
        ".",
        "..",
        ".hidden",
        "ключ.txt",
        " sp ace ",
    ],
)
def test_odd_keys_stay_inside_the_session(
    session: FsspecToolResultStore, store: FsspecToolResultStore, key: str
) -> None:
    reference = session.write(key=key, content="contained")
    assert "/" not in reference
    assert session.read(reference) == "contained"
    # Everything the root store can see is under this session's prefix.
    assert [record.reference for record in store.list()] == [f"acme/chat-1/{reference}"]


def test_write_records_kind_size_tool_and_time(session: FsspecToolResultStore) -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    text_ref = session.write(key="1_search_x.txt", content="héllo", tool_name="web_search")
    bytes_ref = session.write(key="1_render_x.png", content=b"\x89PNG", tool_name="render_chart")
    text_info, bytes_info = session.info(text_ref), session.info(bytes_ref)
    assert text_info == StoredResult(
        reference=text_ref, kind="text", size=6, created=text_info.created, tool_name="web_search", key="1_search_x.txt"
    )
    assert (bytes_info.kind, bytes_info.size, bytes_info.tool_name) == ("bytes", 4, "render_chart")
    assert before <= text_info.created <= datetime.now(UTC) + timedelta(seconds=1)
    assert session.info(session.write(key="k.txt", content="x")).tool_name is None


def test_list_is_newest_first_and_bounded(session: FsspecToolResultStore) -> None:
    references = []
    for i in range(5):
        references.append(session.write(key=f"{i}.txt", content=str(i), tool_name="t"))
    listed = session.list()
    assert [record.reference for record in listed] == list(reversed(references))
    assert [record.reference for record in session.list(limit=2)] == list(reversed(references))[:2]


def test_list_of_an_empty_scope_is_empty(store: FsspecToolResultStore) -> None:
    assert store.for_session("nobody", "nothing").list() == []
    assert store.list() == []


def test_sessions_and_tenants_are_isolated(store: FsspecToolResultStore) -> None:
    a1 = store.for_session("acme", "chat-1")
    a2 = store.for_session("acme", "chat-2")
    b1 = store.for_session("globex", "chat-1")
    ref = a1.write(key="secret.txt", content="acme's data")
    for other in (a2, b1):
        assert other.list() == []
        with pytest.raises(ResultNotFoundError):
            other.read(ref)
        with pytest.raises(InvalidReferenceError):
            other.read(f"acme/chat-1/{ref}")
    # The wider scopes see the result under their own, longer references.
    assert [r.reference for r in store.for_tenant("acme").list()] == [f"chat-1/{ref}"]
    assert store.for_tenant("acme").read(f"chat-1/{ref}") == "acme's data"
    assert store.read(f"acme/chat-1/{ref}") == "acme's data"
    assert store.for_tenant("globex").list() == []


def test_root_store_writes_for_single_user_use(store: FsspecToolResultStore) -> None:
    reference = store.write(key="x.txt", content="single user")
    assert store.read(reference) == "single user"
    assert [record.reference for record in store.list()] == [reference]


def test_tenant_store_does_not_write(store: FsspecToolResultStore) -> None:
    with pytest.raises(ValueError, match="for_session"):
        store.for_tenant("acme").write(key="x.txt", content="x")


def test_scoped_stores_do_not_rescope(session: FsspecToolResultStore) -> None:
    with pytest.raises(ValueError, match="already scoped"):
        session.for_session("globex", "chat-1")


def test_missing_result_is_not_found(session: FsspecToolResultStore) -> None:
    reference = session.write(key="gone.txt", content="soon gone")
    session.delete(reference)
    with pytest.raises(ResultNotFoundError) as caught:
        session.read(reference)
    assert isinstance(caught.value, FileNotFoundError)
    with pytest.raises(ResultNotFoundError):
        session.info(reference)
    session.delete(reference)  # deleting again is not an error


def test_read_range(session: FsspecToolResultStore) -> None:
    reference = session.write(key="r.txt", content="0123456789")
    assert session.read_range(reference, 2, 5) == b"234"
    assert session.read_range(reference, 8, 100) == b"89"
    assert session.read_range(reference, 4, 4) == b""
    with pytest.raises(ValueError, match="range"):
        session.read_range(reference, 5, 2)
    with pytest.raises(ValueError, match="range"):
        session.read_range(reference, -1, 2)


def test_delete_and_purge_stay_in_scope(store: FsspecToolResultStore) -> None:
    a1 = store.for_session("acme", "chat-1")
    a2 = store.for_session("acme", "chat-2")
    b1 = store.for_session("globex", "chat-1")
    keep = [a2.write(key="k.txt", content="a2"), b1.write(key="k.txt", content="b1")]
    for i in range(3):
        a1.write(key=f"{i}.txt", content=str(i))
    assert a1.purge() == 3
    assert a1.list() == []
    assert a2.read(keep[0]) == "a2"
    assert b1.read(keep[1]) == "b1"
    assert store.for_tenant("acme").purge() == 1
    assert b1.read(keep[1]) == "b1"
    assert store.purge() == 1
    assert store.list() == []


def test_purge_of_a_prefix_spares_the_sibling_prefix(store: FsspecToolResultStore) -> None:
    # 'acme/chat-1' is a string prefix of 'acme/chat-10': only the separator tells them apart.
    short = store.for_session("acme", "chat-1")
    long = store.for_session("acme", "chat-10")
    survivor = long.write(key="k.txt", content="still here")
    short.write(key="k.txt", content="doomed")
    assert [record.reference for record in short.list()] != [survivor]
    assert short.purge() == 1
    assert long.read(survivor) == "still here"


async def test_async_twins(session: FsspecToolResultStore) -> None:
    text_ref = await session.write_async(key="a.txt", content="async text", tool_name="search")
    bytes_ref = await session.write_async(key="a.png", content=b"\x00\xff")
    assert await session.read_async(text_ref) == "async text"
    assert await session.read_async(bytes_ref) == b"\x00\xff"
    assert await session.read_range_async(text_ref, 0, 5) == b"async"
    assert (await session.info_async(text_ref)).tool_name == "search"
    assert {record.reference for record in await session.list_async()} == {text_ref, bytes_ref}
    await session.delete_async(bytes_ref)
    assert [record.reference for record in await session.list_async(limit=5)] == [text_ref]
    assert await session.purge_async() == 1
    with pytest.raises(ResultNotFoundError):
        await session.read_async(text_ref)


async def test_concurrent_async_writes_across_sessions(store: FsspecToolResultStore) -> None:
    sessions = [store.for_session(f"tenant-{i % 5}", f"chat-{i}") for i in range(20)]

    async def write_and_read(index: int, session: FsspecToolResultStore) -> None:
        references = await asyncio.gather(
            *(session.write_async(key="0_tool_call.txt", content=f"{index}:{n}" * 100) for n in range(3))
        )
        assert [await session.read_async(reference) for reference in references] == [
            f"{index}:{n}" * 100 for n in range(3)
        ]
        assert len(await session.list_async()) == 3

    await asyncio.gather(*(write_and_read(i, s) for i, s in enumerate(sessions)))
    assert len(await store.list_async()) == 60


async def test_async_methods_on_a_fresh_store_do_not_need_warm_up(store: FsspecToolResultStore, backend: Any) -> None:
    fresh = FsspecToolResultStore(store.url, storage_options=store.storage_options, **backend.store_kwargs)
    fresh = fresh.for_session("a", "b")
    reference = await fresh.write_async(key="x.txt", content="cold start")
    assert await fresh.read_async(reference) == "cold start"


def test_warm_up_is_idempotent(store: FsspecToolResultStore) -> None:
    store.warm_up()
    store.warm_up()
    session = store.for_session("a", "b")
    assert session.read(session.write(key="x.txt", content="warm")) == "warm"


async def test_async_warm_up(store: FsspecToolResultStore) -> None:
    await store.warm_up_async()
    session = store.for_session("a", "b")
    assert await session.read_async(await session.write_async(key="x.txt", content="warm")) == "warm"


def test_find_children_lists_one_level_without_what_lies_below(store: FsspecToolResultStore) -> None:
    # A LIST by delimiter on S3 (`ls --tenant`): sibling tenants apart, nothing deeper than the next level named.
    for tenant, session in (("acme", "chat-b"), ("acme", "chat-a"), ("acme-2", "chat-a")):
        store.for_session(tenant, session).write(key="x.txt", content="x")
    tenant = store.for_tenant("acme").find_children()
    assert tenant.directories == ["chat-a", "chat-b"] and tenant.objects == {}
    assert store.find_children().directories == ["acme", "acme-2"]
    inside = store.for_session("acme", "chat-a").find_children()
    assert inside.directories == [] and len(inside.objects) == 1
