"""
Local disk against a hostile writer in the store's directory: symlinks swapped in while the store works, hard links
planted in a session, and the temporary files a killed writer leaves behind.

Each swap test runs a thread that flips a path between the real thing and a symlink to another tenant's data for about
a second while the store reads (or deletes): not one byte of the other tenant's may come back, and nothing of theirs
may go. A check-then-open store loses these races hundreds of times a second.
"""

import contextlib
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from haystack_integrations.offload import (
    FsspecToolResultStore,
    InvalidReferenceError,
    ResultNotFoundError,
    end_session,
    end_session_async,
)
from haystack_integrations.offload.errors import StorageError
from haystack_integrations.offload.operations import scan, usage
from haystack_integrations.offload.stores.names import new_object_name

SECRET = "globex's secret: the merger closes on Friday"  # noqa: S105 - a tenant's data, not a credential
SWAP_SECONDS = 1.0


def _temporary_name(at: datetime) -> str:
    """A temporary file's name as local writes make them: ``.tmp-<UTC time>-<16 hex>``."""
    return f".tmp-{at.astimezone(UTC):%Y%m%dT%H%M%S%f}Z-{secrets.token_hex(8)}"


@pytest.fixture
def disk(tmp_path: Path) -> tuple[FsspecToolResultStore, Path]:
    root = tmp_path / "results"
    return FsspecToolResultStore(str(root)), root


@contextlib.contextmanager
def _swapping(flip: Callable[[bool], None]) -> Iterator[None]:
    """Run `flip(True)` (to the symlink) and `flip(False)` (back) in a loop on a thread until the event is set."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                flip(True)
                flip(False)
        except BaseException as error:  # surfaced below: a broken swapper would make the test pass for nothing
            errors.append(error)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not errors, errors


def _read_for_a_while(reads: list[Callable[[], object]]) -> tuple[list[object], int, list[StorageError]]:
    """
    Call the reads in turn for `SWAP_SECONDS`.

    :returns: What they gave back, how many were refused or found nothing, and the storage errors they raised.
    """
    returned: list[object] = []
    refused = 0
    failed: list[StorageError] = []
    deadline = time.monotonic() + SWAP_SECONDS
    while time.monotonic() < deadline:
        for read in reads:
            try:
                returned.append(read())
            except (InvalidReferenceError, ResultNotFoundError):
                refused += 1
            except StorageError as error:
                failed.append(error)
    return returned, refused, failed


def _foreign(returned: list[object]) -> list[object]:
    return [item for item in returned if b"globex" in (item if isinstance(item, bytes) else str(item).encode())]


def _reads(store: FsspecToolResultStore, reference: str) -> list[Callable[[], object]]:
    return [
        lambda: store.read(reference),
        lambda: store.read_range(reference, 0, 100),
        lambda: store.read_range_and_size(reference, 0, 100)[0],
    ]


def test_a_result_swapped_for_a_symlink_never_reads_the_other_tenants_file(
    disk: tuple[FsspecToolResultStore, Path],
) -> None:
    store, root = disk
    victim = store.for_session("globex", "chat-1")
    victim_file = root / "globex" / "chat-1" / victim.write(key="k.txt", content=SECRET)
    attacker = store.for_session("acme", "chat-1")
    reference = attacker.write(key="mine.txt", content="acme's own result")
    target = root / "acme" / "chat-1" / reference
    staged = root / "acme" / "chat-1" / "staged"

    def flip(to_symlink: bool) -> None:
        # Staged beside the result, then renamed over it: each swap is atomic, the name never vanishes.
        if to_symlink:
            staged.symlink_to(victim_file)
        else:
            staged.write_text("acme's own result")
        os.replace(staged, target)

    with _swapping(flip):
        returned, refused, failed = _read_for_a_while(_reads(attacker, reference))
    assert _foreign(returned) == []
    assert refused > 0  # the swaps did land while the store was reading
    assert failed == []  # every swap is refused clearly, never a confusing backend error
    assert victim.read(victim_file.name) == SECRET


def test_a_session_directory_swapped_for_a_symlink_never_reads_the_other_tenants_files(
    disk: tuple[FsspecToolResultStore, Path],
) -> None:
    store, root = disk
    victim = store.for_session("globex", "chat-1")
    reference = victim.write(key="k.txt", content=SECRET)  # a name the attacker has learned
    attacker = store.for_session("acme", "chat-1")
    attacker.write(key="mine.txt", content="acme's own result")
    session, aside = root / "acme" / "chat-1", root / "acme" / "chat-1-aside"

    def swap(to_symlink: bool) -> None:
        if to_symlink:
            os.rename(session, aside)
            os.symlink(root / "globex" / "chat-1", session)
        else:
            os.unlink(session)
            os.rename(aside, session)

    with _swapping(swap):
        returned, refused, failed = _read_for_a_while(
            [*_reads(attacker, reference), lambda: [record.reference for record in attacker.list()]]
        )
    assert _foreign(returned) == []
    assert all(reference not in str(item) for item in returned)
    assert refused > 0
    assert failed == []
    assert victim.read(reference) == SECRET


def test_deleting_through_a_symlinked_session_directory_deletes_nothing_of_the_other_tenant(
    disk: tuple[FsspecToolResultStore, Path],
) -> None:
    store, root = disk
    victim = store.for_session("globex", "chat-1")
    reference = victim.write(key="k.txt", content=SECRET)
    victim.documents("approvals").put("request.json", b"{}")
    (root / "acme").mkdir()
    os.symlink(root / "globex" / "chat-1", root / "acme" / "chat-1")
    attacker = store.for_session("acme", "chat-1")

    with pytest.raises(InvalidReferenceError, match="symlink"):
        attacker.delete(reference)
    for purge in (attacker.purge, lambda: end_session(attacker, documents=True)):
        with pytest.raises((InvalidReferenceError, StorageError)):
            purge()
    assert victim.read(reference) == SECRET
    assert victim.documents("approvals").list() == ["request.json"]


async def test_deleting_through_a_symlinked_session_directory_is_refused_in_async_paths(
    disk: tuple[FsspecToolResultStore, Path],
) -> None:
    store, root = disk
    victim = store.for_session("globex", "chat-1")
    reference = victim.write(key="k.txt", content=SECRET)
    (root / "acme").mkdir()
    os.symlink(root / "globex" / "chat-1", root / "acme" / "chat-1")
    attacker = store.for_session("acme", "chat-1")
    with pytest.raises(InvalidReferenceError):
        await attacker.delete_async(reference)
    with pytest.raises(InvalidReferenceError):
        await end_session_async(attacker)
    assert victim.read(reference) == SECRET


def test_a_session_directory_swapped_while_deleting_never_deletes_the_other_tenants_file(
    disk: tuple[FsspecToolResultStore, Path],
) -> None:
    store, root = disk
    victim = store.for_session("globex", "chat-1")
    reference = victim.write(key="k.txt", content=SECRET)
    victim_file = root / "globex" / "chat-1" / reference
    attacker = store.for_session("acme", "chat-1")
    attacker.write(key="mine.txt", content="mine")
    session, aside = root / "acme" / "chat-1", root / "acme" / "chat-1-aside"

    def swap(to_symlink: bool) -> None:
        if to_symlink:
            os.rename(session, aside)
            os.symlink(root / "globex" / "chat-1", session)
        else:
            os.unlink(session)
            os.rename(aside, session)

    deadline = time.monotonic() + SWAP_SECONDS
    with _swapping(swap):
        while time.monotonic() < deadline and victim_file.exists():
            try:
                attacker.delete(reference)
            except (InvalidReferenceError, StorageError):
                continue
    assert victim_file.exists(), "a delete through the swapped session directory removed the other tenant's result"
    assert victim_file.read_text() == SECRET


def test_a_symlink_planted_as_a_result_is_deleted_itself_not_its_target(
    disk: tuple[FsspecToolResultStore, Path],
) -> None:
    store, root = disk
    victim = store.for_session("globex", "chat-1")
    victim_file = root / "globex" / "chat-1" / victim.write(key="k.txt", content=SECRET)
    attacker = store.for_session("acme", "chat-1")
    attacker.write(key="mine.txt", content="mine")
    name = new_object_name(key="planted.txt", kind="text", tool_name=None)
    (root / "acme" / "chat-1" / name).symlink_to(victim_file)
    attacker.delete(name)
    assert not (root / "acme" / "chat-1" / name).is_symlink()
    assert victim_file.read_text() == SECRET


def test_a_hard_link_to_another_tenants_file_is_refused(disk: tuple[FsspecToolResultStore, Path]) -> None:
    store, root = disk
    victim = store.for_session("globex", "chat-1")
    victim_file = root / "globex" / "chat-1" / victim.write(key="k.txt", content=SECRET)
    attacker = store.for_session("acme", "chat-1")
    attacker.write(key="mine.txt", content="mine")
    planted = new_object_name(key="planted.txt", kind="text", tool_name=None)
    os.link(victim_file, root / "acme" / "chat-1" / planted)

    refusals = [
        lambda: attacker.read(planted),
        lambda: attacker.read_range(planted, 0, 10),
        lambda: attacker.read_range_and_size(planted, 0, 10),
        lambda: attacker.info(planted),
        lambda: store.read(f"acme/chat-1/{planted}"),
    ]
    for refusal in refusals:
        with pytest.raises(InvalidReferenceError, match="hard link"):
            refusal()
    # A document planted the same way is refused too.
    (root / "acme" / "chat-1" / ".approvals").mkdir()
    os.link(victim_file, root / "acme" / "chat-1" / ".approvals" / "decision.json")
    with pytest.raises(InvalidReferenceError, match="hard link"):
        attacker.documents("approvals").get("decision.json")
    # While a planted link stands, the victim's own name is refused too: two names of one file cannot be told apart.
    with pytest.raises(InvalidReferenceError, match="hard link"):
        victim.read(victim_file.name)
    # Ending the session removes the planted links, never the file they name.
    end_session(attacker, documents=True)
    assert not (root / "acme" / "chat-1" / planted).exists()
    assert victim.read(victim_file.name) == SECRET


async def test_a_hard_link_is_refused_in_async_paths(disk: tuple[FsspecToolResultStore, Path]) -> None:
    store, root = disk
    victim_file = root / "globex" / "chat-1" / store.for_session("globex", "chat-1").write(key="k", content=SECRET)
    attacker = store.for_session("acme", "chat-1")
    attacker.write(key="mine.txt", content="mine")
    planted = new_object_name(key="planted.txt", kind="text", tool_name=None)
    os.link(victim_file, root / "acme" / "chat-1" / planted)
    with pytest.raises(InvalidReferenceError, match="hard link"):
        await attacker.read_async(planted)
    with pytest.raises(InvalidReferenceError, match="hard link"):
        await attacker.read_range_and_size_async(planted, 0, 10)


def test_a_document_being_published_by_a_conditional_create_is_readable(
    disk: tuple[FsspecToolResultStore, Path],
) -> None:
    store, root = disk
    documents = store.for_session("acme", "chat-1").documents("claims")
    documents.create("claim.json", b"worker-a")
    directory = root / "acme" / "chat-1" / ".claims"
    # The moment between put_exclusive's link() and its temporary file's unlink(): two links, both in the directory.
    os.link(directory / "claim.json", directory / _temporary_name(datetime.now(UTC)))
    assert documents.get("claim.json") == b"worker-a"


def test_conditional_creates_and_reads_race_without_spurious_refusals(
    disk: tuple[FsspecToolResultStore, Path],
) -> None:
    store, _ = disk
    documents = store.for_session("acme", "chat-1").documents("claims")
    created: list[str] = []
    stop = threading.Event()

    def create() -> None:
        for number in range(400):
            documents.create(f"claim-{number}.json", b"x")
            created.append(f"claim-{number}.json")
        stop.set()

    thread = threading.Thread(target=create)
    thread.start()
    while not stop.is_set():
        if created:
            assert documents.get(created[-1]) == b"x"
    thread.join()


def test_a_fifo_planted_as_a_result_is_refused_without_blocking(disk: tuple[FsspecToolResultStore, Path]) -> None:
    store, root = disk
    session = store.for_session("acme", "chat-1")
    session.write(key="mine.txt", content="mine")
    fifo = new_object_name(key="fifo.txt", kind="text", tool_name=None)
    os.mkfifo(root / "acme" / "chat-1" / fifo)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            session.read(fifo)
        except Exception as error:
            outcome.append(error)
        else:
            outcome.append(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=5)
    if reader.is_alive():
        os.close(os.open(root / "acme" / "chat-1" / fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the reader go
        reader.join(timeout=5)
        pytest.fail("Reading a FIFO planted as a result blocked the reader until something wrote to it.")
    assert isinstance(outcome[0], InvalidReferenceError) and "regular file" in str(outcome[0])
    assert fifo not in {record.reference for record in session.list()}


# Temporary files of writers killed mid-write


def _leftover(directory: Path, *, age: timedelta | None, size: int) -> Path:
    """A temporary file as a killed writer leaves it: `age` old by its name (None: an older version's, unstamped)."""
    directory.mkdir(parents=True, exist_ok=True)
    name = ".tmp-0123456789abcdef" if age is None else _temporary_name(datetime.now(UTC) - age)
    path = directory / name
    path.write_bytes(b"\0" * size)
    return path


def test_purge_removes_stale_temporary_files_and_usage_counts_them(disk: tuple[FsspecToolResultStore, Path]) -> None:
    store, root = disk
    session = store.for_session("acme", "chat-1")
    kept = session.write(key="mine.txt", content="mine")
    directory = root / "acme" / "chat-1"
    legacy = _leftover(directory, age=None, size=3_000)
    stale = _leftover(directory, age=timedelta(hours=2), size=5_000)
    stale_document = _leftover(directory / ".approvals", age=timedelta(hours=2), size=700)
    running = _leftover(directory, age=timedelta(seconds=5), size=11)  # a write in progress right now

    found = usage(scan(store))
    figures = found.tenants["acme"].sessions["chat-1"]
    assert (figures.temporary_files, figures.temporary_bytes) == (4, 8_711)
    assert figures.total_bytes == figures.result_bytes + 8_711
    assert found.total.temporary_bytes == 8_711 and found.other_bytes == 0

    assert store.purge(older_than=timedelta(days=1)) == 0  # temporary files are removed, not counted
    assert not legacy.exists() and not stale.exists() and not stale_document.exists()
    assert running.exists()
    assert session.read(kept) == "mine"
    assert usage(scan(store)).total.temporary_bytes == 11


async def test_end_session_removes_every_temporary_file_of_the_session(
    disk: tuple[FsspecToolResultStore, Path],
) -> None:
    store, root = disk
    ended, other = store.for_session("acme", "chat-1"), store.for_session("acme", "chat-2")
    ended.write(key="mine.txt", content="mine")
    other.write(key="theirs.txt", content="theirs")
    running = _leftover(root / "acme" / "chat-1", age=timedelta(seconds=5), size=10)
    stale = _leftover(root / "acme" / "chat-1", age=timedelta(hours=3), size=10)
    elsewhere = _leftover(root / "acme" / "chat-2", age=timedelta(seconds=5), size=10)
    assert end_session(ended) == 1
    assert not running.exists() and not stale.exists()
    assert elsewhere.exists()
    again = _leftover(root / "acme" / "chat-2", age=timedelta(seconds=1), size=10)
    assert await end_session_async(other) == 1
    assert not again.exists() and not elsewhere.exists()


async def test_purge_async_removes_stale_temporary_files(disk: tuple[FsspecToolResultStore, Path]) -> None:
    store, root = disk
    store.for_session("acme", "chat-1").write(key="mine.txt", content="mine")
    stale = _leftover(root / "acme" / "chat-1", age=timedelta(hours=2), size=10)
    assert await store.for_tenant("acme").purge_async(older_than=timedelta(days=1)) == 0
    assert not stale.exists()


def test_writes_name_their_temporary_files_with_their_time(
    disk: tuple[FsspecToolResultStore, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, root = disk
    seen: list[str] = []
    real_replace = os.replace

    def spy(source: str, destination: str, **kwargs: object) -> None:
        seen.append(os.path.basename(os.fsdecode(source)))
        real_replace(source, destination, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", spy)
    store.for_session("acme", "chat-1").write(key="k.txt", content="x")
    assert len(seen) == 1
    named = re.fullmatch(r"\.tmp-(?P<stamp>\d{8}T\d{12})Z-[0-9a-f]{16}", seen[0])
    assert named is not None, f"{seen[0]!r} carries no time: a purge could not tell a killed writer's leftover"
    written = datetime.strptime(named["stamp"], "%Y%m%dT%H%M%S%f").replace(tzinfo=UTC)
    assert abs(datetime.now(UTC) - written) < timedelta(minutes=1)
    assert [path.name for path in (root / "acme" / "chat-1").iterdir() if path.name.startswith(".")] == []


def test_systems_without_descriptor_relative_calls_fall_back_to_checked_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from haystack_integrations.offload.stores import local_io

    monkeypatch.setattr(local_io, "_AT_CALLS", False)  # as on Windows
    store = FsspecToolResultStore(str(tmp_path / "results"))
    session = store.for_session("acme", "chat-1")
    reference = session.write(key="k.txt", content="ok")
    assert isinstance(store._handle.io(), local_io.PathCheckedLocalIO)
    assert session.read(reference) == "ok"
    assert session.read_range_and_size(reference, 0, 1) == (b"o", 2)
    session.documents("claims").create("claim.json", b"x")
    assert session.documents("claims").get("claim.json") == b"x"
    stale = _leftover(tmp_path / "results" / "acme" / "chat-1", age=timedelta(hours=2), size=10)
    assert [record.reference for record in session.list()] == [reference]
    assert end_session(session, documents=True) == 2
    assert not stale.exists()
    (tmp_path / "results" / "globex").mkdir()
    os.symlink(tmp_path / "results" / "acme", tmp_path / "results" / "globex" / "chat-1")
    with pytest.raises(InvalidReferenceError, match="symlink"):
        store.for_session("globex", "chat-1").read(reference)
