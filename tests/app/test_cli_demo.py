"""
The README's main-job command: ``offload-haystack demo``, with no arguments on a fresh directory, and its options.

The demo drives the reference server's own `ChatService` (offload, compaction and approval hooks on one shared Agent)
for several tenants and sessions at once, then checks contents, approvals and isolation; it exits 1 when a check
fails and 2 on bad input.
"""

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.testing.local_s3 import LocalS3Server
from offload_haystack_app.demo import SessionOutcome, runner, session_marker


@pytest.mark.slow
def test_demo_with_no_arguments_as_a_real_process(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "haystack_integrations.offload.cli", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "All checks passed" in completed.stdout
    assert "scripted model" in completed.stdout
    for tenant in ("acme", "globex", "initech"):
        assert f"offload-demo-results/{tenant}/" in completed.stdout
    # The results really are on disk, where the demo said, one directory per tenant and session.
    store = FsspecToolResultStore(str(tmp_path / "offload-demo-results"))
    tree = {record.reference.rsplit("/", 1)[0] for record in store.list()}
    assert len(tree) == 12
    assert {path.split("/")[0] for path in tree} == {"acme", "globex", "initech"}
    # Each session kept its conversation and its approval record beside its results.
    session = store.for_session(*sorted(tree)[0].split("/"))
    assert session.documents("history").list() and session.documents("audit").list()


def test_demo_reports_per_tenant_figures_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--store", str(tmp_path / "r"), "--tenants", "a,b", "--sessions", "3", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and "scripted" in report["model"]
    assert [tenant["tenant"] for tenant in report["tenants"]] == ["a", "b"]
    for tenant in report["tenants"]:
        assert tenant["sessions"] == 3
        # Per session: search, table, chart caption and PNG offloaded, then three logs compacted after the approval.
        assert (tenant["results_offloaded"], tenant["results_compacted"]) == (21, 9)
        assert tenant["bytes_stored"] > 150_000 and tenant["context_chars_saved"] > 150_000
        # Sessions 1, 2 and 3 approve, approve with an edit, and deny.
        assert (tenant["approvals_asked"], tenant["approvals_granted"]) == (3, 2)
        assert tenant["isolation_checks_passed"] > 50 and tenant["failures"] == []
    stored = FsspecToolResultStore(str(tmp_path / "r")).list()
    assert sum(tenant["bytes_stored"] for tenant in report["tenants"]) == sum(record.size for record in stored)


def test_demo_prints_a_table_per_tenant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--store", str(tmp_path / "r"), "--tenants", "acme,globex", "--sessions", "1"]) == 0
    output = capsys.readouterr().out
    assert "approvals asked/granted" in output and "isolation checks passed" in output
    rows = [line.split() for line in output.splitlines() if line.startswith(("acme ", "globex "))]
    assert [row[0] for row in rows] == ["acme", "globex"]
    assert all(row[-1] == "ok" for row in rows)


@pytest.mark.s3
@pytest.mark.slow
def test_demo_against_s3(s3_server: LocalS3Server, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"{s3_server.bucket_url}/demo"
    options = json.dumps(s3_server.storage_options())
    assert (
        main(["demo", "--store", url, "--storage-options", options, "--tenants", "acme,globex", "--sessions", "2"]) == 0
    )
    assert "All checks passed" in capsys.readouterr().out
    assert len(FsspecToolResultStore(url, storage_options=s3_server.storage_options()).list()) == 2 * 2 * 7


def test_demo_exits_1_and_names_the_session_when_a_check_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A file where one session's directory must go: that session's writes fail for real; the others still run.
    root = tmp_path / "r"
    (root / "globex").mkdir(parents=True)
    (root / "globex" / "chat-broken-2").write_text("not a directory")
    code = main(["demo", "--store", str(root), "--tenants", "acme,globex", "--sessions", "2", "--run-id", "broken"])
    assert code == 1
    captured = capsys.readouterr()
    assert "FAILED checks" in captured.err and "globex/chat-broken-2: the session failed" in captured.err
    # Sessions checked against the broken one (same id in acme, a sibling in globex) fail; acme's first is fine.
    assert "acme/chat-broken-2: the isolation checks failed" in captured.err
    assert "acme/chat-broken-1" not in captured.err
    rows = {line.split()[0]: line.split() for line in captured.out.splitlines() if line.startswith(("acme", "globex"))}
    assert rows["globex"][-1] == "FAILED"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--store", "s3://"], "has no path"),
        (["--tenants", "acme,acme"], "once"),
        (["--tenants", "../etc"], "tenant id"),
        (["--sessions", "0"], "from 1 to 1000"),
        (["--sessions", "1001"], "from 1 to 1000"),
        (["--storage-options", "{not json"], "not valid JSON"),
        (["--run-id", "a/b"], "session id"),
    ],
)
def test_demo_bad_input_fails_clearly(
    arguments: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = [] if "--store" in arguments else ["--store", str(tmp_path / "r")]
    assert main(["demo", *store, *arguments, "--json"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_demo_with_more_sessions_than_topics_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Topics and customers repeat every six sessions, and chat-...-1 is a prefix of chat-...-12: neither is a leak.
    code = main(["demo", "--store", str(tmp_path / "r"), "--sessions", "12", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report["ok"] is True
    assert [tenant["sessions"] for tenant in report["tenants"]] == [12, 12, 12]
    assert all(tenant["failures"] == [] for tenant in report["tenants"])


def test_session_markers_are_unique_and_never_part_of_one_another() -> None:
    markers = [
        session_marker(tenant, f"chat-{run}-{number}")
        for tenant in ("a", "ab", "acme", "globex")
        for run in ("r", "r1")
        for number in range(1, 201)
    ]
    assert len(set(markers)) == len(markers)
    # Fixed length and bracketed: a marker can only be found inside text that holds exactly that marker.
    assert len({len(marker) for marker in markers}) == 1
    assert all(marker.startswith("[case ") and marker.endswith("]") for marker in markers)


# A real leak, injected once every session has finished and before the isolation checks run: the checks must fail
# for the session whose content leaked, and only for it.
VICTIM = ("acme", "chat-leak-1")
INTRUDER = ("globex", "chat-leak-1")
SIBLING = ("acme", "chat-leak-2")


async def _leak_message(
    service: Any, root: FsspecToolResultStore, outcome: SessionOutcome, into: tuple[str, str]
) -> None:
    # Another session's words in this conversation (here its marker, as a leaked message would carry it).
    await service.send_message(root.for_session(*into), f"Note this down: {outcome.marker}")


async def _leak_result_file(root_path: Path, root: FsspecToolResultStore, into: tuple[str, str]) -> None:
    # The victim's search result, copied object for object into the other session's prefix.
    [search] = [r for r in await root.for_session(*VICTIM).list_async() if r.tool_name == "web_search"]
    target = root_path.joinpath(*into)
    await asyncio.to_thread(target.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread(shutil.copy, root_path.joinpath(*VICTIM, search.reference), target / search.reference)


async def _leak_content(root: FsspecToolResultStore, into: tuple[str, str]) -> None:
    # The victim's search result written again, under a new name, into the other session.
    [search] = [r for r in await root.for_session(*VICTIM).list_async() if r.tool_name == "web_search"]
    content = await root.for_session(*VICTIM).read_async(search.reference)
    await root.for_session(*into).write_async(key="copied.txt", content=content, tool_name="web_search")


async def _leak_approvals(root_path: Path, into: tuple[str, str]) -> None:
    # The victim's approval requests and audit trail, copied into the other session.
    for directory in (".approvals", ".audit"):
        source, target = root_path.joinpath(*VICTIM, directory), root_path.joinpath(*into, directory)
        await asyncio.to_thread(shutil.copytree, source, target, dirs_exist_ok=True)


@pytest.mark.parametrize(
    ("leak", "into", "expected"),
    [
        ("message", INTRUDER, ["globex/chat-leak-1's conversation contains acme/chat-leak-1's messages"]),
        ("message", SIBLING, ["acme/chat-leak-2's conversation contains acme/chat-leak-1's messages"]),
        (
            "result file",
            INTRUDER,
            [
                "globex/chat-leak-1 could read acme/chat-leak-1's",
                "globex/chat-leak-1 lists acme/chat-leak-1's results",
                "holds acme/chat-leak-1's content",
            ],
        ),
        ("content", INTRUDER, ["globex/chat-leak-1's result", "holds acme/chat-leak-1's content"]),
        (
            "approvals",
            INTRUDER,
            ["globex/chat-leak-1 could decide acme/chat-leak-1's approval", "globex/chat-leak-1's audit shows"],
        ),
    ],
)
def test_a_real_leak_fails_the_isolation_checks(
    leak: str,
    into: tuple[str, str],
    expected: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root_path = tmp_path / "r"
    check_isolation = runner._check_isolation
    leaked: list[str] = []

    async def leak_then_check(
        service: Any, root: FsspecToolResultStore, outcome: SessionOutcome, intruders: list[tuple[str, str]], gone: str
    ) -> None:
        if not leaked:
            assert (outcome.tenant, outcome.session) == VICTIM and into in intruders
            if leak == "message":
                await _leak_message(service, root, outcome, into)
            elif leak == "result file":
                await _leak_result_file(root_path, root, into)
            elif leak == "content":
                await _leak_content(root, into)
            else:
                await _leak_approvals(root_path, into)
            leaked.append(leak)
        await check_isolation(service, root, outcome, intruders, gone)

    monkeypatch.setattr(runner, "_check_isolation", leak_then_check)
    arguments = ["--store", str(root_path), "--tenants", "acme,globex", "--sessions", "2", "--run-id", "leak"]
    code = main(["demo", *arguments])
    captured = capsys.readouterr()
    assert leaked == [leak]
    assert code == 1, captured.err
    failures = [line.strip() for line in captured.err.split("FAILED checks:", 1)[-1].splitlines() if line.strip()]
    for text in expected:
        assert any(text in failure for failure in failures), (text, failures)
    # Only the session whose content leaked fails: the checks found the leak, and nothing that was not one.
    assert failures and all(failure.startswith("acme/chat-leak-1: ") for failure in failures), failures
    rows = {line.split()[0]: line.split() for line in captured.out.splitlines() if line.startswith(("acme", "globex"))}
    assert (rows["acme"][-1], rows["globex"][-1]) == ("FAILED", "ok")
