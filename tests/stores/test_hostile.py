"""Hostile references and ids: every one is refused with a clear error, and nothing is read."""

import os
from pathlib import Path
from typing import Any

import pytest

from haystack_integrations.offload import (
    FsspecToolResultStore,
    InvalidReferenceError,
    InvalidScopeIdError,
    ResultNotFoundError,
)

# Also on the obstore engine (tests/conftest.py). The sync methods wait for the async ones (test_sync_twins.py).
pytestmark = [pytest.mark.real_s3, pytest.mark.engines, pytest.mark.isolated]  # isolated: RGW with STS and SSE-C

A_NAME = "20261129T213400123456Z-5f3a9c1e.t.search.1_search_call.txt"

# Each is refused by a session store before any storage request is made.
HOSTILE_REFERENCES = [
    "",
    ".",
    "..",
    "../",
    "./" + A_NAME,
    "../" + A_NAME,
    "../chat-2/" + A_NAME,
    "../../globex/chat-1/" + A_NAME,
    "../../../../../../etc/passwd",
    "/etc/passwd",
    "//etc/passwd",
    "/" + A_NAME,
    "\\" + A_NAME,
    "..\\..\\globex\\chat-1\\" + A_NAME,
    "C:\\Windows\\win.ini",
    "c:/windows/win.ini",
    "file:///etc/passwd",
    "file://" + A_NAME,
    "s3://other-bucket/acme/chat-1/" + A_NAME,
    "s3a://bucket/" + A_NAME,
    "memory://offload/acme/chat-1/" + A_NAME,
    "http://169.254.169.254/latest/meta-data/",
    "%2e%2e/%2e%2e/globex/chat-1/" + A_NAME,
    "%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
    "..%2f..%2fglobex%2fchat-1%2f" + A_NAME,
    "%252e%252e%252f" + A_NAME,
    "..%c0%af..%c0%af" + A_NAME,
    "..%5c..%5c" + A_NAME,
    "\uff0e\uff0e/\uff0e\uff0e/" + A_NAME,  # fullwidth full stops
    "..\u2215..\u2215" + A_NAME,  # division slash
    "..\u2044" + A_NAME,  # fraction slash
    "..;/" + A_NAME,
    A_NAME + "/..",
    A_NAME + "/",
    A_NAME + "\x00.png",
    "\x00" + A_NAME,
    A_NAME + "\n",
    " " + A_NAME,
    "chat-1/" + A_NAME,
    "acme/chat-1/" + A_NAME,
    "globex/chat-1/" + A_NAME,
    "acme//" + A_NAME,
    "~/" + A_NAME,
    "~root/.ssh/id_rsa",
    "$HOME/" + A_NAME,
    "*",
    "*.txt",
    "**/" + A_NAME,
    A_NAME.replace("5f3a9c1e", "5F3A9C1E"),  # not a name this library produces
    A_NAME.replace(".t.", ".x."),
    "20261129T213400123456Z-5f3a9c1e.t.search",
    "x" * 5000,
    "a/" * 2000 + A_NAME,
]

NOT_STRINGS: list[Any] = [None, 42, 3.5, b"bytes-" + A_NAME.encode(), [A_NAME], {"reference": A_NAME}]


@pytest.fixture
def victim_and_attacker(store: FsspecToolResultStore) -> tuple[FsspecToolResultStore, str, FsspecToolResultStore]:
    victim = store.for_session("globex", "chat-1")
    reference = victim.write(key="secret.txt", content="globex's secret")
    return victim, reference, store.for_session("acme", "chat-1")


@pytest.mark.parametrize("reference", HOSTILE_REFERENCES)
def test_hostile_references_are_refused_by_a_session_store(
    victim_and_attacker: tuple[FsspecToolResultStore, str, FsspecToolResultStore], reference: str
) -> None:
    _, _, attacker = victim_and_attacker
    for operation in (attacker.read, attacker.info, attacker.delete, lambda r: attacker.read_range(r, 0, 10)):
        with pytest.raises(InvalidReferenceError):
            operation(reference)


@pytest.mark.parametrize("reference", NOT_STRINGS)
def test_non_string_references_are_refused(store: FsspecToolResultStore, reference: Any) -> None:
    with pytest.raises(InvalidReferenceError, match="must be a string"):
        store.for_session("acme", "chat-1").read(reference)


async def test_hostile_references_are_refused_in_async_paths(
    victim_and_attacker: tuple[FsspecToolResultStore, str, FsspecToolResultStore],
) -> None:
    _, reference, attacker = victim_and_attacker
    for hostile in ("../../globex/chat-1/" + reference, "globex/chat-1/" + reference, "/" + reference):
        with pytest.raises(InvalidReferenceError):
            await attacker.read_async(hostile)
        with pytest.raises(InvalidReferenceError):
            await attacker.read_range_async(hostile, 0, 4)
        with pytest.raises(InvalidReferenceError):
            await attacker.info_async(hostile)
        with pytest.raises(InvalidReferenceError):
            await attacker.delete_async(hostile)


def test_the_victims_own_reference_reads_nothing_elsewhere(
    victim_and_attacker: tuple[FsspecToolResultStore, str, FsspecToolResultStore],
) -> None:
    victim, reference, attacker = victim_and_attacker
    # The bare name resolves inside the attacker's own session, where it does not exist.
    with pytest.raises(ResultNotFoundError):
        attacker.read(reference)
    attacker.delete(reference)
    assert victim.read(reference) == "globex's secret"


def test_error_messages_do_not_reveal_the_bucket_or_other_tenants(
    victim_and_attacker: tuple[FsspecToolResultStore, str, FsspecToolResultStore], store: FsspecToolResultStore
) -> None:
    _, reference, attacker = victim_and_attacker
    root_path = store._scope_path()
    for hostile in (reference, "../../globex/chat-1/" + reference):
        with pytest.raises((InvalidReferenceError, ResultNotFoundError)) as caught:
            attacker.read(hostile)
        assert root_path not in str(caught.value)
        assert "acme/chat-1" not in str(caught.value)


def test_a_tenant_store_refuses_other_tenants_and_extra_depth(
    victim_and_attacker: tuple[FsspecToolResultStore, str, FsspecToolResultStore], store: FsspecToolResultStore
) -> None:
    _, reference, _ = victim_and_attacker
    acme = store.for_tenant("acme")
    for hostile in (
        reference,
        f"../globex/chat-1/{reference}",
        f"globex/chat-1/{reference}",
        f"chat-1/../../globex/chat-1/{reference}",
        f"./chat-1/{reference}",
        f"../chat-1/{reference}",
    ):
        with pytest.raises(InvalidReferenceError):
            acme.read(hostile)
    with pytest.raises(ResultNotFoundError):
        acme.read(f"chat-1/{reference}")  # a well-formed reference into acme's own session: simply absent
    assert store.for_tenant("globex").read(f"chat-1/{reference}") == "globex's secret"


def test_a_root_store_refuses_malformed_depths(
    victim_and_attacker: tuple[FsspecToolResultStore, str, FsspecToolResultStore], store: FsspecToolResultStore
) -> None:
    _, reference, _ = victim_and_attacker
    for hostile in (f"globex/{reference}", f"globex/chat-1/x/{reference}", f"globex/../globex/chat-1/{reference}"):
        with pytest.raises(InvalidReferenceError):
            store.read(hostile)
    assert store.read(f"globex/chat-1/{reference}") == "globex's secret"


def test_sibling_prefix_without_separator_is_unreachable(store: FsspecToolResultStore) -> None:
    # 'acme/ab' starts with the string 'acme/a': a store scoped to 'acme/a' must still never reach it.
    sibling = store.for_session("acme", "ab")
    reference = sibling.write(key="k.txt", content="sibling's data")
    short = store.for_session("acme", "a")
    for attempt in (reference, "b/" + reference, "../ab/" + reference, "b" + reference):
        with pytest.raises((InvalidReferenceError, ResultNotFoundError)):
            short.read(attempt)
    assert short.list() == []


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "must not be empty"),
        (".", "relative path component"),
        ("..", "relative path component"),
        ("a/b", "separator"),
        ("../globex", "separator"),
        ("a\\b", "separator"),
        ("a\x00b", "control character"),
        ("line\nbreak", "control character"),
        ("tab\t", "control character"),
        ("del\x7f", "control character"),
        ("x" * 129, "at most 128"),
        (".hidden", "must not start with '.'"),
        ("a b", "not allowed"),
        ("ä", "not allowed"),
        ("%2e%2e", "not allowed"),
        ("a:b", "not allowed"),
        ("s3:", "not allowed"),
        ("\uff0e\uff0e", "not allowed"),
        ("*", "not allowed"),
        ("~", "not allowed"),
    ],
)
@pytest.mark.parametrize("field", ["tenant", "session"])
def test_bad_scope_ids_name_the_field(store: FsspecToolResultStore, value: str, reason: str, field: str) -> None:
    ids = {"tenant": "acme", "session": "chat-1", field: value}
    with pytest.raises(InvalidScopeIdError, match=reason) as caught:
        store.for_session(ids["tenant"], ids["session"])
    assert isinstance(caught.value, ValueError)
    assert str(caught.value).startswith(f"The {field} id")


@pytest.mark.parametrize("value", [None, 7, b"acme", ["acme"]])
def test_non_string_scope_ids_are_type_errors(store: FsspecToolResultStore, value: Any) -> None:
    with pytest.raises(TypeError, match="tenant id must be a string"):
        store.for_session(value, "chat-1")
    with pytest.raises(TypeError, match="session id must be a string"):
        store.for_session("acme", value)


def test_good_scope_ids_are_accepted(store: FsspecToolResultStore) -> None:
    for tenant, session in [("acme", "chat-1"), ("org_42", "5f0c7b1e-uuid"), ("a.b@c+d=e", "x" * 128), ("A", "0")]:
        scoped = store.for_session(tenant, session)
        assert scoped.read(scoped.write(key="k.txt", content="ok")) == "ok"
        assert scoped.scope == (tenant, session)


def test_hostile_keys_cannot_write_outside_the_session(store: FsspecToolResultStore) -> None:
    session = store.for_session("acme", "chat-1")
    for key in ("../../globex/chat-1/planted.txt", "/etc/cron.d/x", "..\\..\\x", "%2e%2e/x", "a/../../../../x"):
        session.write(key=key, content="planted?")
    assert store.for_tenant("globex").list() == []
    assert {record.reference.rsplit("/", 1)[0] for record in store.list()} == {"acme/chat-1"}


# Local disk: symlinks must not carry a read, a write or a listing outside the scope.


@pytest.fixture
def local_root(tmp_path: Path) -> tuple[FsspecToolResultStore, Path]:
    root = tmp_path / "results"
    return FsspecToolResultStore(str(root)), root


def test_symlinked_result_pointing_out_of_the_root_is_refused(
    local_root: tuple[FsspecToolResultStore, Path], tmp_path: Path
) -> None:
    store, root = local_root
    outside = tmp_path / "outside-secret.txt"
    outside.write_text("host secret")
    session = store.for_session("acme", "chat-1")
    session.write(key="k.txt", content="legit")  # creates the session directory
    planted = root / "acme" / "chat-1" / A_NAME
    planted.symlink_to(outside)
    with pytest.raises(InvalidReferenceError, match="symlink"):
        session.read(A_NAME)
    with pytest.raises(InvalidReferenceError, match="symlink"):
        session.read_range(A_NAME, 0, 4)
    assert A_NAME not in {record.reference for record in session.list()}


def test_symlinked_session_directory_into_another_tenant_is_refused(
    local_root: tuple[FsspecToolResultStore, Path],
) -> None:
    store, root = local_root
    victim = store.for_session("globex", "chat-1")
    reference = victim.write(key="k.txt", content="globex's secret")
    (root / "acme").mkdir()
    os.symlink(root / "globex" / "chat-1", root / "acme" / "chat-1")
    attacker = store.for_session("acme", "chat-1")
    with pytest.raises(InvalidReferenceError):
        attacker.read(reference)
    with pytest.raises(InvalidReferenceError):
        attacker.write(key="k.txt", content="planted")
    with pytest.raises(InvalidReferenceError):
        attacker.list()
    assert [record.reference for record in victim.list()] == [reference]


def test_local_root_reached_through_a_symlink_still_works(tmp_path: Path) -> None:
    real = tmp_path / "real-root"
    real.mkdir()
    link = tmp_path / "link-root"
    link.symlink_to(real)
    session = FsspecToolResultStore(str(link)).for_session("acme", "chat-1")
    assert session.read(session.write(key="k.txt", content="ok")) == "ok"


def test_local_writes_are_atomic_and_leave_no_temporary_files(local_root: tuple[FsspecToolResultStore, Path]) -> None:
    store, root = local_root
    session = store.for_session("acme", "chat-1")
    for i in range(10):
        session.write(key=f"{i}.txt", content="x" * 100_000)
    files = sorted(path.name for path in (root / "acme" / "chat-1").iterdir())
    assert len(files) == 10
    assert not [name for name in files if name.startswith(".")]


def test_memory_writes_stay_under_the_scope_prefix() -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    store = FsspecToolResultStore("memory://hostile-keys")
    store.for_session("acme", "chat-1").write(key="../../../x.txt", content="x")
    assert list(MemoryFileSystem.store)
    assert all(path.startswith("/hostile-keys/acme/chat-1/") for path in MemoryFileSystem.store)
