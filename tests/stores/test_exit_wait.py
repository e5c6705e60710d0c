"""
A program that used the obstore engine exits cleanly, even when one of obstore's threads is slow to leave Python.

obstore hands a result to the event loop from its own thread (``call_soon_threadsafe``); the program may finish before
that thread takes the GIL back. Taking it once the interpreter is finalizing aborted the process (SIGABRT), about one
exit in ten under load. The script below makes that thread slow on purpose: it holds the handing thread, GIL
released, until exit has begun and then ``HOLD_SECONDS`` more, or until the interpreter finalizes, whichever is first.
Before `stores.exit_wait`, finalization always came first (and the process aborted); now exit waits for the thread.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

SCRIPT = textwrap.dedent(
    """
    import asyncio, atexit, ctypes, json, os, sys, threading, time

    HOLD_SECONDS = 0.3
    # Called through CDLL, not PyDLL: the GIL is released during each call, as in the socket send it stands for.
    libc_and_python = ctypes.CDLL(None)
    is_finalizing = libc_and_python["Py_IsFinalizing" if sys.version_info >= (3, 13) else "_Py_IsFinalizing"]
    held = {"deliveries": 0, "released": False}
    exit_began: list[float] = []


    class SlowHandOver(asyncio.SelectorEventLoop):
        def call_soon_threadsafe(self, callback, *args, context=None):
            from_obstore = threading.get_ident() not in {thread.ident for thread in threading.enumerate()}
            holding = from_obstore and hold.is_set() and not held["released"]
            if holding:
                # Counted before the hand-over: once it is made, the program may print the count and exit before
                # this thread has the GIL back.
                held["deliveries"] += 1
            handle = super().call_soon_threadsafe(callback, *args, context=context)
            if holding:
                while not is_finalizing() and not (exit_began and time.monotonic() > exit_began[0] + HOLD_SECONDS):
                    libc_and_python.usleep(1000)
                held["released"] = True
            return handle


    class Policy(asyncio.DefaultEventLoopPolicy):
        def new_event_loop(self):
            return SlowHandOver()


    asyncio.set_event_loop_policy(Policy())
    hold = threading.Event()

    from haystack_integrations.offload import FsspecToolResultStore

    url, options = sys.argv[1], json.loads(sys.argv[2])
    store = FsspecToolResultStore(url, storage_options=options, engine="obstore").for_session("acme", sys.argv[3])
    reference = store.write(key="a.txt", content="hello")
    # Registered after the store's own exit handler, so it runs first: exit has begun.
    atexit.register(lambda: exit_began.append(time.monotonic()))
    hold.set()
    assert store.read(reference) == "hello"
    print(json.dumps({"held": held["deliveries"]}), flush=True)
    """
)


def test_exit_waits_for_an_obstore_thread_handing_over_a_result(s3_endpoint: Any, tmp_path: Any) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    options = json.dumps(s3_endpoint.storage_options())
    session = f"exit-{os.getpid()}"
    done = subprocess.run(
        [sys.executable, str(script), s3_endpoint.bucket_url, options, session],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != -signal.SIGABRT, f"aborted at exit: {done.stderr[-2000:]}"
    assert done.returncode == 0, done.stderr[-2000:]
    # The injector really held a hand-over (the read's result), so the case above was the one meant.
    assert json.loads(done.stdout.splitlines()[-1])["held"] >= 1
