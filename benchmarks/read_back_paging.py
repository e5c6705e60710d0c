"""
Reading a large offloaded result back on S3: `read_tool_result`'s ranged pages against reading the whole object.

One text result (default 200 MB of mixed ASCII and multi-byte UTF-8) is stored in an `FsspecToolResultStore` on moto's
S3 server (real HTTP on loopback). Then:

- ranged: `read_tool_result` pages through it (10,000-character pages at offsets spread over the object) and searches
  it, as the model would, sync (`invoke`) and async (`invoke_async`), with its read-ahead (the first MiB alone, then
  ranges of 2, 4 and 8 MiB, up to 4 at once) and, for comparison, without it (1 MiB ranges one after another, as
  before read-ahead);
- baseline: what a read-back tool built on Haystack's `ToolResultStore.read(reference)` does (the tool in Haystack's
  offloading docs): read the whole object, then slice the page (or search the text) in memory.

A search's throughput is the bytes it scanned (to the needle, at 90%) over its time, against the size over one whole
read's time, in the same run: the ratio is what read-ahead is measured by (the goal is at least 0.5x).

The client runs in a child process, the S3 server in this one, so the client's peak memory (tracemalloc) and times are
its own. Bytes are the response bodies the server sent (its request log): transfer figures, not estimates.

Caveat on times: moto reads and copies the *whole* stored object for every request, ranged or not, under a per-object
lock, then slices it (`FakeKey.value`), so on moto a ranged GET of a 200 MB object costs about as much server time as a
whole read, and ranged GETs of one object do not overlap on the server. Real S3 serves a range without that. Time
ratios here therefore understate the ranged reads' advantage (most for the search without read-ahead, which makes
~170 requests); the byte and memory figures do not depend on it.

Run from the repository root::

    PYTHONPATH=src python benchmarks/read_back_paging.py                  # 200 MB, a few minutes
    PYTHONPATH=src python benchmarks/read_back_paging.py --size-mb 20     # quicker
    PYTHONPATH=src python benchmarks/read_back_paging.py --backend local  # times without moto's per-request copy

Prints the Markdown table kept in benchmarks/README.md.
"""

import argparse
import asyncio
import contextlib
import functools
import multiprocessing
import statistics
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from haystack.components.agents.state.state import State

from haystack_integrations.offload import FsspecToolResultStore, ReadToolResult, offload_context
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from haystack_integrations.offload.tools import readahead

PAGE_CHARS = 10_000
NEEDLE = "the needle near the end"
FIRST = "plain ascii text"


class Measurement(NamedTuple):
    """One operation run by the client: its time, peak memory and result, and what the server sent for it."""

    seconds: float
    peak: int
    result: Any
    moved: int | None
    requests: int | None


def check(condition: bool, message: str) -> None:
    """Stop the benchmark if a result is not what was measured for (asserts vanish under ``python -O``)."""
    if not condition:
        raise RuntimeError(message)


def make_text(size_bytes: int) -> str:
    """Mixed-width UTF-8 text of about `size_bytes` bytes, with `NEEDLE` at 90% of the way through."""
    block = "plain ascii text 0123456789, café e\u0301, 日本語のテキスト, emoji 🎉🚀\n"
    repeats = size_bytes // len(block.encode()) + 1
    text = block * repeats
    cut = int(len(text) * 0.9)
    return text[:cut] + NEEDLE + text[cut:]


def measured(function: Callable[[], Any], *, memory: bool) -> tuple[float, int, Any]:
    """Run `function` once: seconds, peak Python allocation (when `memory`; tracemalloc slows it) and its result."""
    if memory:
        tracemalloc.start()
    started = time.perf_counter()
    try:
        result = function()
        return time.perf_counter() - started, tracemalloc.get_traced_memory()[1] if memory else 0, result
    finally:
        if memory:
            tracemalloc.stop()


def client(connection: Connection, url: str, storage_options: dict[str, Any], size_mb: int) -> None:
    """The child process: store the result, then run the operations the parent asks for and report on each."""
    root = FsspecToolResultStore(url, storage_options=storage_options)
    root.warm_up()
    session = root.for_session("bench", "chat-1")
    text = make_text(size_mb * 1_000_000)
    reference = session.write(key="1_fetch_call_1.txt", content=text, tool_name="fetch")
    size = len(text.encode())
    del text
    state = State(schema={"hook_context": {"type": dict}}, data={"hook_context": offload_context(session)})
    tool = ReadToolResult(max_scan_bytes=size + 1)

    def whole() -> str:
        content = session.read(reference)
        check(isinstance(content, str), "the result was stored as text")
        return str(content)

    loop = asyncio.new_event_loop()  # one loop for every async call, as a server has: its clients are made once

    def search(needle: str) -> Any:
        return tool.invoke(state=state, reference=reference, search=needle, max_matches=1)

    def search_async(needle: str) -> Any:
        return loop.run_until_complete(
            tool.invoke_async(state=state, reference=reference, search=needle, max_matches=1)
        )

    def without_read_ahead(needle: str) -> Any:
        # No range is read ahead (none may be held): each 1 MiB chunk is fetched when the search asks for it.
        held, readahead.MAX_IN_FLIGHT = readahead.MAX_IN_FLIGHT, 0
        try:
            return search(needle)
        finally:
            readahead.MAX_IN_FLIGHT = held

    operations: dict[str, Callable[..., Any]] = {
        "page": lambda offset: tool.invoke(state=state, reference=reference, offset=offset),
        "whole_page": lambda: whole()[:PAGE_CHARS],
        "search": search,
        "search_async": search_async,
        "search_sequential": without_read_ahead,
        "whole_search": lambda needle: whole().find(needle),
    }
    connection.send(size)
    while True:
        command, memory, arguments = connection.recv()
        if command == "stop":
            loop.run_until_complete(loop.shutdown_asyncgens())  # closes the loop's S3 client (stores/loop_local.py)
            loop.close()
            return
        connection.send(measured(functools.partial(operations[command], *arguments), memory=memory))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=200, help="size of the stored result in MB (default 200)")
    parser.add_argument("--pages", type=int, default=20, help="ranged pages to read (default 20)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of the whole-object read (default 3)")
    parser.add_argument(
        "--backend",
        choices=["s3", "local"],
        default="s3",
        help="s3: moto's server, with transfer figures (default); local: a directory, for times without moto's "
        "whole-object copy per request",
    )
    options = parser.parse_args()

    with contextlib.ExitStack() as stack:
        if options.backend == "s3":
            server = stack.enter_context(LocalS3Server())
            url, storage_options = f"{server.bucket_url}/{uuid.uuid4().hex}", server.storage_options()
            log: RequestLog | None = server.requests
        else:
            url, storage_options, log = stack.enter_context(tempfile.TemporaryDirectory()), {}, None
        parent, child = multiprocessing.Pipe()
        process = multiprocessing.get_context("spawn").Process(
            target=client, args=(child, url, storage_options, options.size_mb)
        )
        process.start()
        size: int = parent.recv()

        def run(command: str, *arguments: Any, memory: bool = False) -> Measurement:
            """Ask the client for one operation; read what it moved from the server's log (S3 only)."""
            if log is not None:
                log.clear()
            parent.send((command, memory, arguments))
            seconds, peak, result = parent.recv()
            if log is None:
                return Measurement(seconds, peak, result, None, None)
            return Measurement(seconds, peak, result, sum(request.bytes_sent for request in log), len(log))

        pages = [run("page", size * index // options.pages) for index in range(options.pages)]
        for page in pages:
            check(isinstance(page.result, str) and page.result.startswith("[text result"), str(page.result)[:200])
        wholes = [run("whole_page") for _ in range(options.repeat)]
        searches = {
            name: [run(name, NEEDLE) for _ in range(options.repeat)]
            for name in ("search", "search_async", "search_sequential")
        }
        for runs in searches.values():
            check(all("1 match" in run.result.splitlines()[0] for run in runs), runs[0].result[:300])
        peaks = {name: run(name, NEEDLE, memory=True).peak for name in searches}
        whole_search = run("whole_search", NEEDLE)
        check(whole_search.result > 0, "the needle is in the text")
        whole_search_peak = run("whole_search", NEEDLE, memory=True).peak
        early = [run("search", FIRST) for _ in range(options.repeat)]
        parent.send(("stop", False, ()))
        process.join()

    where = "moto's S3 server (HTTP on loopback)" if log is not None else "local disk"
    print(f"Stored result: {size:,} bytes of UTF-8 text on {where}.\n")
    print("| Operation | read_tool_result (ranged) | whole-object read (baseline) | ratio |")
    print("|---|---|---|---|")
    page_time = statistics.median(page.seconds for page in pages)
    whole_time = statistics.median(whole.seconds for whole in wholes)
    early_time = statistics.median(run.seconds for run in early)
    if log is not None:
        page_bytes = [page.moved or 0 for page in pages]
        mean_bytes = statistics.mean(page_bytes)
        print(
            f"| bytes moved per {PAGE_CHARS:,}-character page | {mean_bytes:,.0f} (max {max(page_bytes):,}) "
            f"| {wholes[0].moved:,} | {(wholes[0].moved or 0) / mean_bytes:,.0f}x less |"
        )
        print(
            f"| requests per page | {statistics.mean(page.requests or 0 for page in pages):g} ranged GET "
            f"| {wholes[0].requests} GET | - |"
        )
    print(
        f"| time per page (median) | {page_time * 1000:,.1f} ms | {whole_time * 1000:,.0f} ms "
        f"| {whole_time / page_time:,.1f}x faster |"
    )
    # How far the search scanned: to the needle (its match offset, from the header's "scanned offset 0 to N").
    scanned = int(searches["search"][0].result.splitlines()[0].split("scanned offset 0 to ")[1].split(" ")[0])
    whole_rate = size / whole_time
    labels = {
        "search": "search, sync, read-ahead",
        "search_async": "search, async, read-ahead",
        "search_sequential": "search, sync, no read-ahead (before)",
    }
    for name, runs in searches.items():
        seconds = statistics.median(run.seconds for run in runs)
        rate = scanned / seconds
        moved = f"{runs[0].moved / 1e6:,.0f} MB in {runs[0].requests} GETs, " if log is not None else ""
        print(
            f"| {labels[name]}: needle at 90% | {moved}{seconds * 1000:,.0f} ms = {rate / 1e6:,.0f} MB/s, "
            f"peak {peaks[name] / 1e6:,.1f} MB | read {whole_time * 1000:,.0f} ms = {whole_rate / 1e6:,.0f} MB/s "
            f"| {rate / whole_rate:.2f}x throughput |"
        )
    print(
        f"| search, needle at 90%: client peak memory | {peaks['search'] / 1e6:,.1f} MB (sync), "
        f"{peaks['search_async'] / 1e6:,.1f} MB (async) | {whole_search_peak / 1e6:,.0f} MB (read and find) "
        f"| {whole_search_peak / max(peaks.values()):,.0f}x less |"
    )
    moved = f"{early[0].moved:,} bytes in {early[0].requests} GET, " if log is not None else ""
    whole_moved = f"{whole_search.moved:,} bytes, " if log is not None else ""
    print(
        f"| search, needle on page 1 | {moved}{early_time * 1000:,.0f} ms "
        f"| {whole_moved}{whole_search.seconds * 1000:,.0f} ms (read and find) "
        f"| {whole_search.seconds / early_time:,.1f}x faster |"
    )


if __name__ == "__main__":
    main()
