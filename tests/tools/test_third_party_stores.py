"""
The read-back tools on third parties' stores, through the Protocols in `haystack_integrations.offload.types` alone.

A store that is none of ours (not a subclass of anything in this library or of Haystack's file store) gets ranged
paging and read-ahead search by implementing `read_range_and_size` and its async twin (`RangedResults`), and listing by
implementing `list` and `list_async` (`ListableResults`). The stores here are the tests' own classes, so they count
and time their calls: that is how the suite sees which ranges a search reads, how many at once, and where it stops.
Our own store reads ahead the same way, on every backend.
"""

import ast
import asyncio
import builtins
import dataclasses
import itertools
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from read_back_helpers import multilingual, read_all_pages, read_all_pages_async, state_for, tiny_png

from haystack_integrations.offload import (
    FsspecToolResultStore,
    ListToolResults,
    ReadToolResult,
    list_tool_results,
    read_tool_result,
)
from haystack_integrations.offload.tools.readahead import FIRST_AHEAD_BYTES, MAX_IN_FLIGHT, MAX_RANGE_BYTES
from haystack_integrations.offload.types import ListableResults, RangedResults

MiB = 1 << 20
NEEDLE = "日本⚑needle⚑"


class WholeStore:
    """A plain Haystack `ToolResultStore` (write and read only): the tools read it whole and slice it in memory."""

    supports_binary_content = True

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.kinds: dict[str, str] = {}

    def write(self, *, key: str, content: str | bytes) -> str:
        """Keep the content under its key."""
        text = isinstance(content, str)
        self.data[key] = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
        self.kinds[key] = "text" if text else "bytes"
        return key

    def read(self, reference: str) -> str | bytes:
        """The whole content."""
        data = self.data[reference]
        return data.decode("utf-8", "surrogatepass") if self.kinds[reference] == "text" else data


class RangedStore(WholeStore):
    """
    A third party's store with ranged reads (a `WholeStore`, not a subclass of any store of ours or Haystack's).

    It records every range asked for, counts whole reads, tracks how many ranged reads run at once (each takes
    `delay` seconds, sync or async), and can fail the reads of ranges that reach past `fail_from`.
    """

    def __init__(self, *, delay: float = 0.0, fail_from: int | None = None) -> None:
        super().__init__()
        self.delay = delay
        self.fail_from = fail_from
        self.ranges: list[tuple[int, int]] = []
        self.whole_reads = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()

    def read(self, reference: str) -> str | bytes:
        """The whole content, counted."""
        self.whole_reads += 1
        return super().read(reference)

    def _begin(self, start: int, end: int) -> None:
        with self._lock:
            self.ranges.append((start, end))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _finish(self, reference: str, start: int, end: int) -> tuple[bytes, int]:
        with self._lock:
            self.in_flight -= 1
        if self.fail_from is not None and end > self.fail_from:
            raise ConnectionError("the storage service is unavailable")
        data = self.data[reference]
        return data[start:end], len(data)

    def read_range_and_size(self, reference: str, start: int, end: int) -> tuple[bytes, int]:
        """Bytes `start` to `end` and the total size."""
        self._begin(start, end)
        time.sleep(self.delay)
        return self._finish(reference, start, end)

    async def read_range_and_size_async(self, reference: str, start: int, end: int) -> tuple[bytes, int]:
        """Async `read_range_and_size`."""
        self._begin(start, end)
        await asyncio.sleep(self.delay)
        return self._finish(reference, start, end)


@dataclasses.dataclass(frozen=True)
class Record:
    """What a third party's store lists: the attributes `StoredResult` has."""

    reference: str
    key: str
    tool_name: str | None
    kind: str
    size: int
    created: datetime


class ListingStore(WholeStore):
    """A third party's store that can list what it holds, newest first."""

    def list(self, *, limit: int | None = None) -> builtins.list[Record]:
        """The records, newest first."""
        start = datetime(2026, 1, 1, tzinfo=UTC)
        records = [
            Record(key, key, key.split("_")[1], self.kinds[key], len(data), start + timedelta(minutes=index))
            for index, (key, data) in enumerate(self.data.items())
        ]
        return records[::-1][:limit]

    async def list_async(self, *, limit: int | None = None) -> builtins.list[Record]:
        """Async `list`."""
        return self.list(limit=limit)


def test_the_protocols_tell_the_stores_apart() -> None:
    assert isinstance(RangedStore(), RangedResults)
    assert not isinstance(RangedStore(), ListableResults)
    assert isinstance(ListingStore(), ListableResults)
    assert not isinstance(ListingStore(), RangedResults)
    assert not isinstance(WholeStore(), RangedResults | ListableResults)


TEXT = multilingual(60_000, seed=4)


def test_a_third_party_ranged_store_pages_one_range_per_page() -> None:
    store = RangedStore()
    reference = store.write(key="1_fetch_call_1.txt", content=TEXT)
    pages = read_all_pages(read_tool_result, state_for(store), reference, max_chars=5_000)
    assert "".join(pages) == TEXT
    assert store.whole_reads == 0
    assert len(store.ranges) == len(pages)
    assert all(end - start == 5_000 for start, end in store.ranges)
    # Contiguous pages: each starts where the last one's whole characters ended, within 3 bytes of its range's end.
    assert all(0 <= end - following <= 3 for (_, end), (following, _) in itertools.pairwise(store.ranges))


async def test_a_third_party_ranged_store_pages_async() -> None:
    store = RangedStore()
    reference = store.write(key="1_fetch_call_1.txt", content=TEXT)
    pages = await read_all_pages_async(read_tool_result, state_for(store), reference, max_chars=7_001)
    assert "".join(pages) == TEXT
    assert store.whole_reads == 0
    assert len(store.ranges) == len(pages)


def test_a_third_party_ranged_store_returns_an_image_by_its_extension() -> None:
    store = RangedStore()
    png = tiny_png(8, 8)
    reference = store.write(key="chart.png", content=png)
    result = read_tool_result.invoke(state=state_for(store), reference=reference)
    assert isinstance(result, list) and result[0].text.startswith("[image result (image/png)")
    assert (store.whole_reads, len(store.ranges)) == (0, 1)


def _haystack(size: int, needles: dict[int, str]) -> str:
    """ASCII lines of about `size` bytes with each needle starting exactly at its byte position."""
    line = b"the quick brown fox jumps over the lazy dog 0123456789\n"
    data = bytearray((line * (size // len(line) + 1))[:size])
    for position, needle in needles.items():
        encoded = needle.encode()
        data[position : position + len(encoded)] = encoded
    return data.decode()


def _range_edges() -> list[int]:
    """Where the ranges a search reads from offset 0 end: 1 MiB alone, then 2, 4, 8, 16, 16... MiB."""
    edges, size, position = [MiB], FIRST_AHEAD_BYTES, MiB
    while position < 40 * MiB:
        position += size
        edges.append(position)
        size = min(2 * size, MAX_RANGE_BYTES)
    return edges


def _expected_ranges(total: int, *, until: int | None = None) -> list[tuple[int, int]]:
    bound = total if until is None else min(total, until)
    ranges, start = [], 0
    for edge in _range_edges():
        ranges.append((start, min(edge, bound)))
        start = edge
        if start >= bound:
            break
    return ranges


# Needles cut by the ranges' edges, each at a different byte (inside "日", between characters, inside "⚑").
EDGES = _range_edges()[:5]
STRADDLING = {edge - 1 - index: NEEDLE for index, edge in enumerate(EDGES)}
BIG = _haystack(40 * MiB, STRADDLING)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_search_reads_ahead_in_growing_ranges_and_finds_matches_across_their_edges(mode: str) -> None:
    # Reads slow enough to overlap however busy the machine: the window keeps several in flight.
    ranged, whole = RangedStore(delay=0.05), WholeStore()
    reference = ranged.write(key="1_fetch_call_1.txt", content=BIG)
    whole.write(key=reference, content=BIG)
    arguments: dict[str, Any] = {"reference": reference, "search": NEEDLE, "max_matches": 50}
    if mode == "sync":
        result = read_tool_result.invoke(state=state_for(ranged), **arguments)
    else:
        result = await read_tool_result.invoke_async(state=state_for(ranged), **arguments)

    lines = result.splitlines()
    assert f"{len(STRADDLING)} matches" in lines[0] and "searched to the end" in lines[0]
    assert [int(line.split(":")[0].removeprefix("offset ")) for line in lines[1:-1]] == sorted(STRADDLING)
    # Exactly what the same search finds when the whole result is in memory (1 MiB chunks, no read-ahead).
    assert result == read_tool_result.invoke(state=state_for(whole), **arguments)
    total = len(BIG.encode())
    assert sorted(ranged.ranges) == _expected_ranges(total)
    assert max(end - start for start, end in ranged.ranges) == MAX_RANGE_BYTES
    assert 1 < ranged.max_in_flight <= MAX_IN_FLIGHT
    assert ranged.whole_reads == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_our_store_reads_ahead_too_with_the_same_matches(session: FsspecToolResultStore, mode: str) -> None:
    # Our own store on every backend (S3 over HTTP included): threads calling its sync reads, tasks its async ones.
    text = _haystack(24 * MiB, STRADDLING)
    reference = await session.write_async(key="1_fetch_call_1.txt", content=text)
    whole = WholeStore()
    whole.write(key=reference, content=text)
    arguments: dict[str, Any] = {"reference": reference, "search": NEEDLE, "max_matches": 50}
    if mode == "sync":
        result = read_tool_result.invoke(state=state_for(session), **arguments)
    else:
        result = await read_tool_result.invoke_async(state=state_for(session), **arguments)
    assert f"{len(STRADDLING)} matches" in result.splitlines()[0]
    assert result == read_tool_result.invoke(state=state_for(whole), **arguments)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_search_stops_reading_ahead_once_it_has_its_matches(mode: str) -> None:
    # The needle is in the fourth range ahead (15 to 23 MiB): reading stops there, give or take the ranges in flight.
    needle_at = 17 * MiB
    text = _haystack(60 * MiB, {needle_at: NEEDLE})
    store = RangedStore(delay=0.002)
    reference = store.write(key="k.txt", content=text)
    arguments: dict[str, Any] = {"reference": reference, "search": NEEDLE, "max_matches": 1}
    if mode == "sync":
        result = read_tool_result.invoke(state=state_for(store), **arguments)
    else:
        result = await read_tool_result.invoke_async(state=state_for(store), **arguments)
    assert f"offset {needle_at}:" in result
    needed = [(start, end) for start, end in _expected_ranges(len(text)) if start <= needle_at]
    assert sorted(store.ranges)[: len(needed)] == needed
    # Only ranges that were already in flight when the match was found: at most MAX_IN_FLIGHT held at once.
    assert len(store.ranges) <= len(needed) + MAX_IN_FLIGHT - 1


async def test_an_async_search_leaves_no_read_ahead_running_when_it_returns() -> None:
    # Reads ahead that the match made useless are cancelled and waited for: none outlives the tool's call (a task
    # still cancelling when its loop closes is destroyed mid-request).
    store = RangedStore(delay=0.05)
    reference = store.write(key="k.txt", content=_haystack(60 * MiB, {3 * MiB: NEEDLE}))
    result = await read_tool_result.invoke_async(
        state=state_for(store), reference=reference, search=NEEDLE, max_matches=1
    )
    assert f"offset {3 * MiB}:" in result
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def test_a_match_on_the_first_mib_costs_one_range() -> None:
    store = RangedStore()
    reference = store.write(key="k.txt", content=_haystack(20 * MiB, {100: NEEDLE}))
    result = await read_tool_result.invoke_async(
        state=state_for(store), reference=reference, search=NEEDLE, max_matches=1
    )
    assert "offset 100:" in result
    assert store.ranges == [(0, MiB)]


@pytest.mark.parametrize("offset", [0, MiB, 5 * MiB + 1])
def test_the_scan_limit_and_offsets_are_the_same_as_a_whole_read(offset: int) -> None:
    # A scan limit that falls inside a range read ahead, a start inside a character (a needle's "日").
    ranged, whole = RangedStore(), WholeStore()
    reference = ranged.write(key="k.txt", content=BIG)
    whole.write(key=reference, content=BIG)
    tool = ReadToolResult(max_scan_bytes=6 * MiB + 12_345)
    arguments: dict[str, Any] = {"reference": reference, "search": "needle", "offset": offset}
    result = tool.invoke(state=state_for(ranged), **arguments)
    assert "scan limit" in result.splitlines()[0]
    assert result == tool.invoke(state=state_for(whole), **arguments)
    # Nothing read past what the scan could need: its limit plus one chunk (and a character cut at its start).
    assert max(end for _, end in ranged.ranges) <= offset + 6 * MiB + 12_345 + MiB + 4


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_failed_range_matters_only_if_the_search_needs_it(mode: str) -> None:
    text = _haystack(40 * MiB, {2 * MiB: NEEDLE, 30 * MiB: NEEDLE})
    store = RangedStore(fail_from=5 * MiB)
    reference = store.write(key="k.txt", content=text)
    state = state_for(store)

    async def search(max_matches: int) -> str:
        arguments: dict[str, Any] = {"reference": reference, "search": NEEDLE, "max_matches": max_matches}
        if mode == "sync":
            return str(read_tool_result.invoke(state=state, **arguments))
        return str(await read_tool_result.invoke_async(state=state, **arguments))

    # The match is in the 2 MiB range; the failing 4 MiB range was read ahead but never needed.
    assert f"offset {2 * MiB}:" in await search(1)
    assert (await search(2)).startswith("Error: ")


def test_list_tool_results_lists_a_third_party_store() -> None:
    store = ListingStore()
    for step in range(1, 4):
        store.write(key=f"{step}_search_call_{step}.txt", content="x" * step)
    header, *lines = list_tool_results.invoke(state=state_for(store)).splitlines()
    assert header == "[3 stored results in this conversation, newest first]"
    assert lines[0] == "- 3_search_call_3.txt | tool: search | text, 3 bytes | stored 2026-01-01T00:02:00Z"
    assert [line.split(" | ")[0] for line in lines] == [f"- {step}_search_call_{step}.txt" for step in (3, 2, 1)]


async def test_list_tool_results_lists_a_third_party_store_async() -> None:
    store = ListingStore()
    store.write(key="1_chart_call_1.png", content=tiny_png())
    result = await ListToolResults(default_limit=5).invoke_async(state=state_for(store))
    assert re.fullmatch(
        r"\[1 stored result in this conversation, newest first\]\n"
        r"- 1_chart_call_1\.png \| tool: chart \| bytes, \d+ bytes \| stored 2026-01-01T00:00:00Z",
        result,
    )


@pytest.mark.parametrize("store", [WholeStore(), RangedStore()], ids=["whole", "ranged"])
def test_a_store_that_cannot_list_says_so(store: WholeStore) -> None:
    assert list_tool_results.invoke(state=state_for(store)).startswith("Error: This conversation's result store cannot")


def test_the_tools_import_no_concrete_store() -> None:
    import haystack_integrations.offload.tools as tools

    for path in Path(tools.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = {alias.name for alias in node.names}
                assert "FsspecToolResultStore" not in names, path.name
                assert getattr(node, "module", None) != "haystack_integrations.offload.stores.fsspec_store", path.name
