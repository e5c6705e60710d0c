"""Start a command as a non-interactive shell starts a job with `&` (SIGINT ignored), and stop it with SIGINT."""

import signal
import subprocess


def ignore_sigint() -> None:
    """A `preexec_fn`: the ignored disposition survives exec, as it does for a shell's background job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def interrupted(process: subprocess.Popen[str], timeout: float = 30) -> int | None:
    """
    Send SIGINT, wait for the exit code; kill the process if it outlives `timeout`, and close its output.

    :param process: A running process.
    :param timeout: Seconds to wait for it to stop.
    :returns: Its exit code, or None if it had to be killed.
    """
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None
    finally:
        if process.stdout is not None:
            process.stdout.close()
