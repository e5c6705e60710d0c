"""
Progress of ``ls``, ``du`` and ``purge`` on memory, local and S3 stores: on standard error only, never on standard
output (scripts parse it), on a terminal by default, everywhere with ``--progress``, nowhere with ``--no-progress``.

A terminal is simulated by making the captured standard error say it is one; a listing is made "long" by holding the
scan until the progress line has been written, so no test depends on timing.
"""

import json
import threading
from typing import Any

import pytest
from cli_stores import FilledStore

from haystack_integrations.offload import operations
from haystack_integrations.offload.cli import main, toolkit
from haystack_integrations.offload.operations import scan
from haystack_integrations.offload.operations.purge import plan_purge

COMMANDS = {
    "ls": ["ls"],
    "ls -R": ["ls", "-R"],
    "du": ["du"],
    "purge --dry-run": ["purge", "--tenant", "acme", "--dry-run"],
}


def _run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    code = main(list(arguments))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Standard error is a terminal: whatever object it is when the command runs (capsys installs its own only once
    the test has started) says so."""
    isatty = toolkit._stderr_is_a_terminal
    monkeypatch.setattr(toolkit, "_stderr_is_a_terminal", lambda: True)
    assert isatty() is False  # and without the patch, captured standard error is not one


class LongListing:
    """Scans held until a progress line is written, for at most `hold` seconds."""

    def __init__(self) -> None:
        self.written = threading.Event()
        self.hold = 10.0


@pytest.fixture
def long_listing(monkeypatch: pytest.MonkeyPatch) -> LongListing:
    """Every scan waits until a progress line has been written, as a listing of millions would."""
    listing = LongListing()
    write = toolkit.ListingProgress._write

    def recording(self: Any, text: str, *, end: bool) -> None:
        write(self, text, end=end)
        listing.written.set()

    def slow_scan(*args: Any, **kwargs: Any) -> Any:
        listing.written.wait(listing.hold)
        return scan(*args, **kwargs)

    def slow_plan(*args: Any, **kwargs: Any) -> Any:  # purge lists through the store's own purge
        listing.written.wait(listing.hold)
        return plan_purge(*args, **kwargs)

    monkeypatch.setattr(toolkit.ListingProgress, "_write", recording)
    monkeypatch.setattr(operations, "scan", slow_scan)
    monkeypatch.setattr("haystack_integrations.offload.operations.purge.plan_purge", slow_plan)
    monkeypatch.setattr(toolkit, "PROGRESS_DELAY", 0.01)
    monkeypatch.setattr(toolkit, "PROGRESS_INTERVAL", 0.01)
    return listing


@pytest.mark.parametrize("command", COMMANDS)
def test_progress_forced_goes_to_standard_error_and_leaves_standard_output_alone(
    command: str, filled: FilledStore, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = [*COMMANDS[command][:1], *filled.arguments(), *COMMANDS[command][1:]]
    for output in ([], ["--json"]):
        code, plain, quiet = _run(capsys, *arguments, *output)
        assert code == 0 and quiet == ""  # standard error is not a terminal here: no progress unless asked
        code, out, err = _run(capsys, *arguments, *output, "--progress")
        assert code == 0
        assert out == plain  # standard output is exactly what it is without --progress
        if output:
            json.loads(out)
        scope = "acme/" if command.startswith("purge") else ""
        listed = len(scan(filled.root, tenant="acme" if scope else None))
        label = f"{toolkit.shown_url(filled.url).rstrip('/')}/{scope}"
        # Not a terminal: plain lines, no carriage returns or escape sequences in a log file.
        assert err.splitlines()[0] == f"listing {label} ..."
        assert err.splitlines()[1].startswith(f"listed {listed:,} object(s) of {label} in ")
        assert "\r" not in err and "\x1b" not in err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_long_listing_shows_a_progress_line_on_a_terminal(
    command: str,
    filled: FilledStore,
    capsys: pytest.CaptureFixture[str],
    terminal: None,
    long_listing: LongListing,
) -> None:
    arguments = [*COMMANDS[command][:1], *filled.arguments(), *COMMANDS[command][1:]]
    code, out, err = _run(capsys, *arguments)
    assert code == 0 and out and "\r" not in out and "\x1b" not in out and "object(s) of" not in out
    assert err.startswith("\r\x1b[Klisting ") and err.endswith("\n")  # rewritten in place, then ended
    last = err.rsplit("\r\x1b[K", 1)[-1]
    assert last.startswith("listed ") and " object(s) of " in last and last.count("\n") == 1


@pytest.mark.slow
def test_no_progress_on_a_terminal_with_json_or_no_progress(
    filled: FilledStore, capsys: pytest.CaptureFixture[str], terminal: None, long_listing: LongListing
) -> None:
    long_listing.hold = 0.2  # twenty times the delay after which a progress line would show
    for flags in (["--json"], ["--no-progress"], ["--json", "--no-progress"]):
        for command in COMMANDS.values():
            code, _, err = _run(capsys, command[0], *filled.arguments(), *command[1:], *flags)
            assert code == 0 and err == "", (command, flags)
    assert not long_listing.written.is_set()


def test_a_short_listing_shows_nothing_on_a_terminal(
    filled: FilledStore, capsys: pytest.CaptureFixture[str], terminal: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(toolkit, "PROGRESS_DELAY", 60.0)  # a listing shorter than that leaves standard error empty
    for command in COMMANDS.values():
        code, out, err = _run(capsys, command[0], *filled.arguments(), *command[1:])
        assert code == 0 and out and err == ""


def test_progress_with_json_on_a_terminal_when_asked(
    filled: FilledStore, capsys: pytest.CaptureFixture[str], terminal: None
) -> None:
    code, out, err = _run(capsys, "du", *filled.arguments(), "--json", "--progress")
    assert code == 0 and json.loads(out)["results"] == len(filled.root.list())
    assert err.startswith("\r\x1b[Klisting ") and "listed " in err and err.endswith("\n")


def test_a_failed_listing_clears_its_progress_line(
    capsys: pytest.CaptureFixture[str], terminal: None, long_listing: LongListing, tmp_path: Any
) -> None:
    (tmp_path / "store").mkdir()

    def failing(*args: Any, **kwargs: Any) -> Any:
        long_listing.written.wait(10)
        raise OSError("the listing broke")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(operations, "scan", failing)
        code, out, err = _run(capsys, "du", str(tmp_path / "store"))
    assert code == 2 and out == ""
    # What is left on the terminal is the error line alone: the progress line was cleared before it.
    assert err.endswith("\r\x1b[Koffload-haystack: error: the listing broke\n")
