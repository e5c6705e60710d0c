"""
At exit, wait until no thread that Python did not start is inside Python code (obstore's runtime threads).

Such a thread that takes the GIL once the interpreter is finalizing is ended with ``pthread_exit``, and unwinding
through Rust frames aborts the process; see docs/design.md, "Exiting with obstore's threads".
"""

import atexit
import sys
import threading
import time
from types import FrameType

# How long exit may wait for them. A thread handing over a result needs the GIL for microseconds; the bound is for
# a thread that never leaves (a foreign thread running Python for good), which must not hold the exit up for long.
EXIT_WAIT_SECONDS = 2.0

_BOOTSTRAP = threading.Thread._bootstrap.__code__  # type: ignore[attr-defined]  # every threading.Thread starts here
_registering = threading.Lock()
_registered = False


def wait_at_exit() -> None:
    """Have `wait_for_foreign_threads` run at exit, once per process (after exit handlers registered later)."""
    global _registered
    with _registering:
        if not _registered:
            atexit.register(wait_for_foreign_threads)
            _registered = True


def foreign_threads_in_python() -> list[int]:
    """
    The threads running Python code that neither `threading` nor the interpreter started (the main thread).

    :returns: Their thread identifiers.
    """
    own = {threading.main_thread().ident, threading.get_ident()}
    frames = sys._current_frames().items()
    return [ident for ident, frame in frames if ident not in own and not _started_by_python(frame)]


def wait_for_foreign_threads(timeout: float = EXIT_WAIT_SECONDS) -> bool:
    """
    Wait, releasing the GIL, until no foreign thread is inside Python code.

    :param timeout: The most seconds to wait.
    :returns: True if none is left, False if some still were when the time ran out.
    """
    deadline = time.monotonic() + timeout
    while foreign_threads_in_python():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def _started_by_python(frame: FrameType) -> bool:
    while frame.f_back is not None:
        frame = frame.f_back
    return frame.f_code is _BOOTSTRAP
