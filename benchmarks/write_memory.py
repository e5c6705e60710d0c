"""
Peak memory writing one large text result: the whole encoded content (today's write path) against chunks.

The store writes a `str` result by encoding it whole (``content.encode(...)``) and handing the bytes to the I/O's
``put``: while the write runs, the process holds the string and its encoding, about twice the content. Written from
`ContentChunks` through ``put_chunks_async``, it holds the string plus what is in flight: one encoded chunk, and on S3
the multipart parts being uploaded (`stores.io.MULTIPART_PARTS_IN_FLIGHT` x `MULTIPART_PART_BYTES`, or obstore's
buffer of the same size).

Each case runs in a fresh process, which builds the content (ASCII text, `--mb` MB), then writes it once through the
I/O's async method, called directly (the store's write path is not changed here) and without the store's retries:

- whole: ``await io.put_async(path, content.encode("utf-8", "surrogatepass"))``;
- chunks: ``await io.put_chunks_async(path, ContentChunks(content))``;
- store: ``await session.write_async(key=..., content=content)``, the store's whole write path (quota size, retry
  layer and all), which sends results over `STREAMED_WRITE_BYTES` as chunks.

Reported, as multiples of the content's size: the peak of Python's allocations during the write, content included
(`tracemalloc`; obstore's buffers are Rust's and not seen there), and the peak resident set size over what the process
held before the content was built (`ru_maxrss`, everything: Python, Rust, the HTTP clients' buffers). 1.0x is the
content alone. Backends: local disk, and moto's S3 server (in a process of its own, so its memory is not counted)
through the s3fs and obstore engines.

Run from the repository root (a minute or two; moto keeps every object in memory)::

    PYTHONPATH=src python benchmarks/write_memory.py
    PYTHONPATH=src python benchmarks/write_memory.py --mb 100 --backends local s3fs
"""

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from typing import Any

BACKENDS = ("local", "s3fs", "obstore")
MODES = ("whole", "chunks", "store")


def _rss_bytes() -> int:
    # Current resident set size, from /proc (Linux); ru_maxrss gives only the peak.
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_case(backend: str, mode: str, megabytes: int, target: dict[str, Any], chunk_chars: int) -> dict[str, float]:
    """One write in this process; returns the measurements."""
    from haystack_integrations.offload import FsspecToolResultStore
    from haystack_integrations.offload.stores.chunks import ContentChunks
    from haystack_integrations.offload.stores.fsspec_store import DEFAULT_RETRY

    if backend == "local":
        store = FsspecToolResultStore(target["directory"])
    else:
        engine = "obstore" if backend == "obstore" else "fsspec"
        store = FsspecToolResultStore(
            f"{target['bucket_url']}/memory-{uuid.uuid4().hex[:8]}",
            storage_options=target["storage_options"],
            engine=engine,
            retry=None if mode != "store" else DEFAULT_RETRY,
        )
    io = store._handle.io()
    path = f"{store._handle.root_path()}/bench/session/large.txt"

    async def warm() -> None:
        # The loop's client and a first small write, so the measured peak is the write's own.
        await io.put_async(f"{store._handle.root_path()}/bench/session/warm.txt", b"warm")

    session = store.for_session("bench", "session")
    stored: list[str] = []

    async def write(content: str) -> None:
        if mode == "store":  # the store's own write path, retry layer included
            stored.append(await session.write_async(key="large.txt", content=content))
        elif mode == "whole":
            await io.put_async(path, content.encode("utf-8", "surrogatepass"))
        else:
            await io.put_chunks_async(path, ContentChunks(content, chunk_chars=chunk_chars))

    async def main() -> dict[str, float]:
        await warm()
        rss_before = _rss_bytes()
        tracemalloc.start()
        # One allocation (no slicing of a longer string), so building the content does not set the peak itself.
        content = "lorem ipsum dolor sit amet " * (megabytes * 10**6 // 27)
        size = len(content)
        start = time.perf_counter()
        await write(content)
        seconds = time.perf_counter() - start
        _, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        written = (await session.info_async(stored[0])).size if stored else await io.size_async(path)
        if written != size:
            raise RuntimeError(f"{backend}/{mode}: wrote {written} bytes, not {size}")
        return {
            "traced_peak_x": traced_peak / size,
            "rss_peak_x": (peak_rss - rss_before) / size,
            "seconds": seconds,
        }

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--mb", type=int, default=300, help="content size in MB (default: %(default)s)")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument(
        "--chunk-mib", type=float, default=None, help="Mi characters per chunk (default: the library's)"
    )
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print JSON
    args = parser.parse_args()
    if args.case:
        backend, mode, target = json.loads(args.case)
        from haystack_integrations.offload.stores.chunks import DEFAULT_CHUNK_CHARS

        chunk_chars = int(args.chunk_mib * 2**20) if args.chunk_mib else DEFAULT_CHUNK_CHARS
        print(json.dumps(run_case(backend, mode, args.mb, target, chunk_chars)))
        return

    from haystack_integrations.offload.testing.local_s3 import local_s3_process

    results: dict[tuple[str, str], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as directory, local_s3_process() as s3:
        for backend in args.backends:
            target = {
                "directory": os.path.join(directory, "results"),
                "bucket_url": s3.bucket_url,
                "storage_options": s3.storage_options,
            }
            for mode in MODES:
                case = json.dumps([backend, mode, target])
                output = subprocess.run(  # noqa: S603 - this script again, with arguments built here
                    [sys.executable, __file__, "--mb", str(args.mb), "--case", case]
                    + (["--chunk-mib", str(args.chunk_mib)] if args.chunk_mib else []),
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                results[backend, mode] = json.loads(output.strip().splitlines()[-1])
                print(f"# {backend} {mode}: {results[backend, mode]}", file=sys.stderr, flush=True)
    print(
        f"One {args.mb} MB text result (ASCII), written once through the I/O's async method or the store; peaks as "
        "multiples of "
        "the content's size (1.0x: the content alone).\n"
    )
    print("| backend | write | Python peak (tracemalloc) | RSS peak over start | time |")
    print("|---|---|---:|---:|---:|")
    for (backend, mode), row in results.items():
        call = {
            "whole": "`put_async(encoded)`",
            "chunks": "`put_chunks_async(ContentChunks)`",
            "store": "store `write_async`",
        }[mode]
        print(
            f"| {backend} | {call} | {row['traced_peak_x']:.2f}x | {row['rss_peak_x']:.2f}x | {row['seconds']:.1f} s |"
        )


if __name__ == "__main__":
    main()
