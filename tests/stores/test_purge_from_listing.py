"""
Purges decide from the listing: each LIST page carries every object's LastModified (the storage's clock, which
settles a result whose name says it is old), so a purge sends LIST pages and batched deletes, and no request per
object, whatever it deletes. Listings carry times on every engine; a filesystem whose listing has none is asked per
object, and only it.
"""

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from haystack_integrations.offload import FsspecToolResultStore, Retention
from haystack_integrations.offload.stores.names import new_object_name
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

# Ages a test waits out. moto keeps whole seconds (a time may read up to a second older than it is), and a loaded
# machine may take a second or two between a fresh write and the purge: AGE leaves room for both.
AGE = timedelta(seconds=4)
# The trial tenant's results expire AGE (time to live plus skew) after the storage says they were written.
BRIEF = Retention(ttl=timedelta(days=7), tenants={"trial": AGE - timedelta(seconds=1)}, clock_skew=timedelta(seconds=1))


def _outlive() -> None:
    time.sleep(AGE.total_seconds() + 0.2)


def _summary(log: RequestLog) -> list[tuple[str, str]]:
    """(method, what) per request: a bucket listing, a batch delete, or a request about one object."""
    return [
        (
            request.method,
            "list"
            if "list-type" in request.query
            else "batch delete"
            if request.method == "POST" and "delete" in request.query
            else "object",
        )
        for request in log
    ]


def _aged(store: FsspecToolResultStore, age: timedelta) -> str:
    """A result whose name says `age` ago (its writer's clock was off), which the storage says was written now."""
    name = new_object_name(key="skewed.txt", kind="text", tool_name="fetch", now=datetime.now(UTC) - age)
    store._handle.io().fs.pipe_file(f"{store._scope_path()}/{name}", b"fresh, by the storage's clock")
    return name


def _written(store: FsspecToolResultStore, count: int) -> list[str]:
    return [store.write(key=f"{number}.txt", content=str(number)) for number in range(count)]


@pytest.mark.s3
@pytest.mark.slow  # waits out an age
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
@pytest.mark.parametrize("count", [20, 200])
def test_an_age_purge_sends_only_list_pages_and_batched_deletes(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str, count: int
) -> None:
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options(), engine=engine
    )
    session = root.for_session("acme", "chat-1")
    _written(session, count)
    _outlive()
    # Kept: written just now; and one whose name says 40 days while the storage says now (its writer's clock was
    # behind), and one stamped 50 years ahead: the storage's clock, from the listing, keeps both.
    kept = {session.write(key="fresh.txt", content="fresh"), _aged(session, timedelta(days=40))}
    kept.add(_aged(session, -timedelta(days=50 * 365)))
    s3_requests.clear()

    assert root.purge(older_than=AGE) == count

    assert _summary(s3_requests) == [("GET", "list"), ("POST", "batch delete")]
    assert {record.reference for record in session.list()} == kept


@pytest.mark.s3
@pytest.mark.slow  # waits out a time to live
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
@pytest.mark.parametrize("count", [20, 200])
async def test_an_expiry_purge_sends_only_list_pages_and_batched_deletes(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str, count: int
) -> None:
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}",
        storage_options=s3_server.storage_options(),
        engine=engine,
        retention=BRIEF,
    )
    trial, acme = root.for_session("trial", "chat-1"), root.for_session("acme", "chat-1")
    _written(trial, count)
    acme_kept = set(_written(acme, 3))
    await asyncio.sleep(AGE.total_seconds() + 0.2)
    # Kept: a fresh trial result; one whose name says it expired but the storage says it was written now; acme's
    # results, a week to live.
    kept = {trial.write(key="fresh.txt", content="fresh"), _aged(trial, timedelta(hours=1))}
    s3_requests.clear()

    assert await root.purge_async(expired=True) == count

    assert _summary(s3_requests) == [("GET", "list"), ("POST", "batch delete")]
    assert set(trial.find_objects()) == kept  # `list` hides the skewed one: it goes by names
    assert {record.reference for record in acme.list()} == acme_kept


class _MuteListing(MemoryFileSystem):
    """A memory filesystem whose listings and infos carry no time (as some fsspec backends), counting time asks."""

    protocol = ("mutelisting",)
    asked: list[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked = []

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, **kwargs: Any) -> Any:
        found = super().find(path, maxdepth=maxdepth, withdirs=withdirs, **kwargs)
        if kwargs.get("detail"):
            return {
                name: {key: value for key, value in info.items() if key != "created"} for name, info in found.items()
            }
        return found

    def modified(self, path: str) -> datetime:
        self.asked.append(path)
        return super().modified(path)  # type: ignore[no-any-return]


def test_a_listing_without_times_falls_back_to_asking_each_candidate() -> None:
    fs = _MuteListing(skip_instance_cache=True)
    root = FsspecToolResultStore(f"mutelisting://{uuid.uuid4().hex}", filesystem=fs)
    session = root.for_session("acme", "chat-1")
    old = _written(session, 3)
    time.sleep(1.2)
    kept = {session.write(key="fresh.txt", content="fresh"), _aged(session, timedelta(days=40))}

    assert root.purge(older_than=timedelta(seconds=1)) == len(old)

    # Asked of the candidates only (the names saying old), never of the fresh result.
    assert len(fs.asked) == len(old) + 1
    assert {record.reference for record in session.list()} == kept


@pytest.mark.real_s3  # also on the real S3 server's lane, both engines (tests/conftest.py)
async def test_every_engine_lists_each_objects_time(backend: tuple[str, dict[str, Any]]) -> None:
    url, storage_options = backend
    store = FsspecToolResultStore(url, storage_options=storage_options, **getattr(backend, "store_kwargs", {}))
    session = store.for_session("acme", "chat-1")
    before = datetime.now(UTC) - timedelta(seconds=2)  # some answers keep whole seconds
    reference = await session.write_async(key="k.txt", content="k")

    found = await session._handle.io().find_detailed_async(session._scope_path())

    (entry,) = (entry for path, entry in found.items() if path.endswith("/" + reference))
    assert entry.size == 1
    assert entry.modified is not None and before <= entry.modified <= datetime.now(UTC) + timedelta(seconds=2)
