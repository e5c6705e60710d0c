"""
The README's main-job command: ``offload-haystack demo``, with no arguments on a fresh directory, and its options.

The demo drives the reference server's own `ChatService` (offload, compaction and approval hooks on one shared Agent)
for several tenants and sessions at once, then checks contents, approvals and isolation; it exits 1 when a check
fails and 2 on bad input.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.local_s3 import LocalS3Server


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
        (["--sessions", "0"], "at least one"),
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
