"""
``purge`` removes the temporary files of local writes whose writer died, as every store purge does, and says so.

A local write goes to ``.tmp-<time>-<random>`` beside its target and is renamed into place; a writer killed mid-write
leaves the file behind. These tests leave such files in a store on local disk (the only backend that writes them): two
hours old (their writers are gone) and a second old (a write still running, which must keep its file).
"""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.stores.names import new_temporary_name


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, dict[str, Path]]:
    """A local store with results in acme/chat-1 and globex/chat-1, and temporary files beside them."""
    root = tmp_path / "results"
    results = FsspecToolResultStore(str(root))
    results.for_session("acme", "chat-1").write(key="a.txt", content="a" * 100, tool_name="web_search")
    results.for_session("acme", "chat-1").documents("history").put("turn.00000001.start.json", b"{}")
    results.for_session("globex", "chat-1").write(key="g.txt", content="g", tool_name="web_search")
    two_hours_ago = datetime.now(UTC) - timedelta(hours=2)
    files = {
        "stale": root / "acme" / "chat-1" / new_temporary_name(now=two_hours_ago),
        "stale document": root / "acme" / "chat-1" / ".history" / new_temporary_name(now=two_hours_ago),
        "running": root / "acme" / "chat-1" / new_temporary_name(),
        "other tenant": root / "globex" / "chat-1" / new_temporary_name(now=two_hours_ago),
    }
    for path in files.values():
        path.write_bytes(b"x" * 1000)
    return root, files


def _json(capsys: pytest.CaptureFixture[str], *arguments: str) -> dict[str, object]:
    code = main([*arguments, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result: dict[str, object] = json.loads(captured.out)
    return result


def test_purging_a_session_removes_its_stale_temporary_files_and_says_so(
    store: tuple[Path, dict[str, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, files = store
    arguments = ["purge", str(root), "--tenant", "acme", "--session", "chat-1"]
    preview = _json(capsys, *arguments, "--dry-run")
    assert (preview["results"], preview["documents"], preview["temporary_files"]) == (1, 1, 2)
    assert main([*arguments, "--dry-run"]) == 0
    assert "1 result(s) and 1 document(s), and 2 stale temporary file(s)" in capsys.readouterr().out
    assert all(path.exists() for path in files.values())

    assert main([*arguments, "--yes"]) == 0
    assert "deleted 4 object(s) (2 stale temporary file(s) among them)" in capsys.readouterr().out
    assert not files["stale"].exists() and not files["stale document"].exists()
    assert files["running"].exists()  # a write still running keeps its file
    assert files["other tenant"].exists()  # outside the scope purged
    usage = _json(capsys, "du", str(root), "--tenant", "acme")
    assert (usage["results"], usage["documents"], usage["temporary_files"]) == (0, 0, 1)


def test_purging_by_age_removes_stale_temporary_files_whatever_the_age(
    store: tuple[Path, dict[str, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, files = store
    # No result is 30 days old, and no session inactive that long: only the dead writers' files go.
    done = _json(capsys, "purge", str(root), "--older-than", "30d", "--yes")
    assert (done["results"], done["documents"], done["temporary_files"], done["deleted"]) == (0, 0, 3, 3)
    assert [name for name, path in files.items() if path.exists()] == ["running"]
    assert len(FsspecToolResultStore(str(root)).list()) == 2


def test_a_purge_without_temporary_files_does_not_mention_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "results"
    FsspecToolResultStore(str(root)).for_session("acme", "chat-1").write(key="a.txt", content="a")
    assert main(["purge", str(root), "--tenant", "acme", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "temporary" not in out and "deleted 1 object(s)\n" in out
