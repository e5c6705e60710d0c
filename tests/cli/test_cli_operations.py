"""
The operator commands (``ls``, ``cat``, ``du``, ``purge``, ``audit``) on memory, local and S3 stores.

They run in this process (``main([...])``), so the memory backend is the store the fixture filled; each test reads the
store back through the library to check what the command printed or deleted.
"""

import base64
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fsspec
import pytest
from cli_stores import FilledStore, IamEndpoint

from haystack_integrations.offload.cli import main
from haystack_integrations.offload.stores.compact_documents import decompress_document
from haystack_integrations.offload.stores.names import new_object_name
from haystack_integrations.offload.testing.local_s3 import LocalS3Server
from offload_haystack_app.demo.tools import chart_png, search_results

RESEARCH = "Research solar panels, dump the invoices table and chart revenue"
# An age a test waits out: moto keeps whole seconds, and a loaded machine may take a second between writes and purge.
AGE = timedelta(seconds=3)


def _run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    code = main(list(arguments))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _json(capsys: pytest.CaptureFixture[str], *arguments: str) -> Any:
    code, out, err = _run(capsys, *arguments, "--json")
    assert code == 0, err
    return json.loads(out)


def test_ls_shows_the_tenant_and_session_tree_with_sizes(
    filled: FilledStore, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = _json(capsys, "ls", *filled.arguments())
    acme = next(tenant for tenant in tree["tenants"] if tenant["tenant"] == "acme")
    assert [tenant["tenant"] for tenant in tree["tenants"]] == ["acme", "globex"]
    assert sorted(acme["sessions"]) == ["chat-1", "chat-2"]
    assert acme["results"] == len(filled.root.for_tenant("acme").list()) == 6
    assert acme["result_bytes"] == sum(record.size for record in filled.root.for_tenant("acme").list())
    assert acme["sessions"]["chat-1"]["documents"] > 5  # history turns, approval records, audit events

    code, out, _ = _run(capsys, "ls", *filled.arguments(), "--tenant", "acme", "--session", "chat-1")
    assert code == 0
    for record in filled.root.for_session("acme", "chat-1").list():
        assert record.reference in out
    assert ".history/turn.00000001.start.json" in out and ".approvals/" in out and "globex" not in out

    listed = _json(capsys, "ls", *filled.arguments(), "--tenant", "globex", "--session", "chat-1")
    assert {item["path"].split("/")[0] for item in listed["objects"]} == {"globex"}


def test_ls_text_counts_documents_apart_from_results(filled: FilledStore, capsys: pytest.CaptureFixture[str]) -> None:
    tree = _json(capsys, "ls", *filled.arguments())
    acme = next(tenant for tenant in tree["tenants"] if tenant["tenant"] == "acme")
    documents = sum(session["documents"] for session in acme["sessions"].values())
    code, out, _ = _run(capsys, "ls", *filled.arguments())
    line = next(line for line in out.splitlines() if line.startswith("  acme/"))
    assert code == 0 and f"{acme['results']} result(s) (" in line and f"{documents} document(s) (" in line, line


def test_du_adds_up_usage_per_tenant_and_session(filled: FilledStore, capsys: pytest.CaptureFixture[str]) -> None:
    usage = _json(capsys, "du", *filled.arguments())
    assert usage["results"] == len(filled.root.list()) == 7
    assert usage["result_bytes"] == sum(record.size for record in filled.root.list())
    assert usage["total_bytes"] == usage["result_bytes"] + usage["document_bytes"]
    per_session = {
        (tenant["tenant"], name): figures["results"]
        for tenant in usage["tenants"]
        for name, figures in tenant["sessions"].items()
    }
    assert per_session == {("acme", "chat-1"): 4, ("acme", "chat-2"): 2, ("globex", "chat-1"): 1}
    code, out, _ = _run(capsys, "du", *filled.arguments())
    assert code == 0 and out.splitlines()[-1].startswith("total")


def test_cat_prints_a_result_byte_for_byte(
    filled: FilledStore, capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path
) -> None:
    records = filled.root.for_session("acme", "chat-1").list()
    search = next(record for record in records if record.tool_name == "web_search")
    image = next(record for record in records if record.kind == "bytes")
    assert main(["cat", *filled.arguments(), f"acme/chat-1/{search.reference}"]) == 0
    assert capsysbinary.readouterr().out == search_results(RESEARCH).encode()
    arguments = ["cat", *filled.arguments(), image.reference, "--tenant", "acme", "--session", "chat-1"]
    assert main([*arguments, "--offset", "8", "--length", "100"]) == 0
    assert capsysbinary.readouterr().out == chart_png("revenue")[8:108]
    assert main([*arguments, "-o", str(tmp_path / "chart.png")]) == 0
    assert (tmp_path / "chart.png").read_bytes() == chart_png("revenue")
    # Another tenant's path through a crafted reference is refused, like a missing one.
    for reference in (f"globex/chat-1/{search.reference}", f"acme/chat-1/../../globex/chat-1/{search.reference}"):
        assert main(["cat", *filled.arguments(), reference]) == 2
        assert b"No result" in capsysbinary.readouterr().err


def test_ls_above_several_roots_names_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from haystack_integrations.offload import FsspecToolResultStore

    for root, results in (("prod", 3), ("staging", 1), ("teams/blue", 2)):
        session = FsspecToolResultStore(str(tmp_path / root)).for_session("acme", "chat-1")
        for number in range(results):
            session.write(key=f"r{number}", content="x" * 10)
    (tmp_path / "notes.txt").write_text("not ours, and no root")
    code, out, _ = _run(capsys, "ls", str(tmp_path))
    hint = out.splitlines()[-1]
    assert code == 0 and "0 tenant(s)" in out and "not written by this library" in out
    named = hint.partition("list one of them: ")[2].split(", ")
    # The roots, the one holding the most first; a stray file names none.
    assert named == [f"{tmp_path}/{root}/" for root in ("prod", "teams/blue", "staging")], hint


def test_audit_prints_a_sessions_approval_record(filled: FilledStore, capsys: pytest.CaptureFixture[str]) -> None:
    events = _json(capsys, "audit", *filled.arguments(), "--tenant", "acme", "--session", "chat-1")
    assert [event["event"] for event in events] == [
        "approval.requested",
        "approval.decided",
        "approval.resumed",
        "approval.executed",
    ]
    assert events[1]["actor"] == "acme/alice"
    code, out, _ = _run(capsys, "audit", *filled.arguments(), "--tenant", "globex", "--session", "chat-1")
    assert code == 0 and "No approval events" in out


def test_audit_repair_appends_the_executed_event_of_a_call_that_ran_once(
    filled: FilledStore, capsys: pytest.CaptureFixture[str]
) -> None:
    # The state a failed append leaves: the call ran and its record holds the result, its audit event is missing.
    documents = filled.root.for_session("acme", "chat-1").documents("audit")
    [executed] = [name for name in documents.list() if name.endswith(".executed.json")]
    written = json.loads(documents.get(executed))
    documents.delete(executed)
    session = ["--tenant", "acme", "--session", "chat-1"]
    assert "approval.executed" not in [
        event["event"] for event in _json(capsys, "audit", *filled.arguments(), *session)
    ]

    code, out, err = _run(capsys, "audit", *filled.arguments(), *session, "--repair", "--json")
    assert code == 0 and "appended 1 audit event(s)" in err, err
    assert [event["event"] for event in json.loads(out)].count("approval.executed") == 1
    assert json.loads(documents.get(executed)) == written  # the same document, restated from the call's record
    code, out, err = _run(capsys, "audit", *filled.arguments(), *session, "--repair", "--json")
    assert code == 0 and "appended 0 audit event(s)" in err, err
    assert [event["event"] for event in json.loads(out)].count("approval.executed") == 1


def test_audit_text_lines_its_rows_up_under_its_header_and_marks_what_it_cut(
    filled: FilledStore, capsys: pytest.CaptureFixture[str]
) -> None:
    events = _json(capsys, "audit", *filled.arguments(), "--tenant", "acme", "--session", "chat-1")
    code, out, _ = _run(capsys, "audit", *filled.arguments(), "--tenant", "acme", "--session", "chat-1")
    header, rule, *rows = out.splitlines()
    assert code == 0 and set(rule) == {"-"} and len(rows) == len(events) == 4
    starts = [header.index(title) for title in ("event", "actor", "tool", "detail")]
    for row, event in zip(rows, events, strict=True):
        # Each column's text starts where its title does: a space before it, and text from it on.
        assert all(row[start - 1] == " " and row[start] != " " for start in starts), (header, row)
        shown = row[starts[-1] :]
        whole = ", ".join(f"{key}={value}" for key, value in event["detail"].items() if value not in (None, "", {}, []))
        whole = whole or "-"
        # Shown whole, or cut to 80 characters with an ellipsis that says so.
        assert shown == whole or (len(shown) == 80 and shown.endswith("...") and whole.startswith(shown[:-3]))


def test_purge_a_session_removes_its_results_and_documents_and_nothing_else(
    filled: FilledStore, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {record.reference for record in filled.root.list()}
    preview = _json(capsys, "purge", *filled.arguments(), "--tenant", "acme", "--session", "chat-1", "--dry-run")
    assert (preview["results"], preview["deleted"], preview["sessions"]) == (4, 0, ["acme/chat-1"])
    assert {record.reference for record in filled.root.list()} == before

    done = _json(capsys, "purge", *filled.arguments(), "--tenant", "acme", "--session", "chat-1", "--yes")
    assert done["deleted"] == preview["results"] + preview["documents"]
    session = filled.root.for_session("acme", "chat-1")
    assert session.list() == []
    for namespace in ("history", "approvals", "audit"):
        assert session.documents(namespace).list() == []
    assert {record.reference for record in filled.root.list()} == {
        r for r in before if not r.startswith("acme/chat-1/")
    }
    assert filled.root.for_session("acme", "chat-2").documents("history").list()


def test_purge_a_tenant_keeps_the_other_tenants(filled: FilledStore, capsys: pytest.CaptureFixture[str]) -> None:
    globex = {record.reference for record in filled.root.for_tenant("globex").list()}
    _json(capsys, "purge", *filled.arguments(), "--tenant", "acme", "--yes")
    assert filled.root.for_tenant("acme").list() == []
    assert _json(capsys, "ls", *filled.arguments())["tenants"][0]["tenant"] == "globex"
    assert {record.reference for record in filled.root.for_tenant("globex").list()} == globex


@pytest.mark.slow  # waits out an age
def test_purge_older_than_an_age_removes_only_old_results(
    filled: FilledStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Old by the storage's clock: written, then an age waited out (moto dates to the second: AGE leaves room).
    session = filled.root.for_session("initech", "chat-1")
    old = {session.write(key=f"{number}.txt", content="old", tool_name="web_search") for number in range(3)}
    time.sleep(AGE.total_seconds() + 0.2)
    # Kept: written just now; and one whose name says 40 days while the storage says now (its writer's clock was
    # behind): the storage's clock decides, as in the store's own purge.
    fresh = session.write(key="fresh.txt", content="fresh")
    # The purge's "now" is the moment after that write, however long the commands below take on a loaded machine
    # (with the real clock, a purge that started more than AGE later took the fresh result too).
    _freeze_purge_clock(monkeypatch, datetime.now(UTC))
    old_name = new_object_name(
        key="old.txt", kind="text", tool_name="web_search", now=datetime.now(UTC) - timedelta(40)
    )
    filesystem, root_path = fsspec.core.url_to_fs(filled.url, **filled.storage_options)
    filesystem.pipe_file(f"{root_path.rstrip('/')}/initech/chat-1/{old_name}", b"forty days old by its name")
    assert len(filled.root.list()) == 7 + 5
    age = f"{int(AGE.total_seconds())}s"

    preview = _json(capsys, "purge", *filled.arguments(), "--tenant", "initech", "--older-than", age, "--dry-run")
    assert (preview["results"], preview["documents"]) == (3, 0)
    assert {item["path"] for item in preview["objects"]} == {f"initech/chat-1/{name}" for name in old}
    done = _json(capsys, "purge", *filled.arguments(), "--tenant", "initech", "--older-than", age, "--yes")
    assert done["deleted"] == 3
    assert {record.reference for record in session.list()} == {fresh, old_name}
    assert len(filled.root.list()) == 7 + 2
    assert filled.root.for_session("globex", "chat-1").documents("history").list()


def _freeze_purge_clock(monkeypatch: pytest.MonkeyPatch, frozen: datetime) -> None:
    from haystack_integrations.offload.stores import purging

    class FrozenClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> "FrozenClock":
            return cls.fromtimestamp(frozen.timestamp(), tz)

    monkeypatch.setattr(purging, "datetime", FrozenClock)


def test_purge_asks_before_deleting_and_needs_a_scope(filled: FilledStore, capsys: pytest.CaptureFixture[str]) -> None:
    count = len(filled.root.list())
    code, _, err = _run(capsys, "purge", *filled.arguments(), "--tenant", "acme")
    assert code == 2 and "--yes" in err  # no terminal to ask on: nothing is deleted without --yes
    code, _, err = _run(capsys, "purge", *filled.arguments())
    assert code == 2 and "Say what to purge" in err
    code, _, err = _run(capsys, "purge", *filled.arguments(), "--older-than", "soon", "--yes")
    assert code == 2 and "Invalid age" in err
    code, _, err = _run(capsys, "purge", *filled.arguments(), "--session", "chat-1", "--yes")
    assert code == 2 and "--session needs --tenant" in err
    assert len(filled.root.list()) == count


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3://", "has no path"),
        ("nosuchprotocol://x/y", "Protocol not known"),
        ("/definitely/not/a/store", "directory does not exist"),
    ],
)
@pytest.mark.parametrize("command", ["ls", "du", "purge"])
def test_bad_urls_fail_clearly(command: str, url: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--tenant", "acme", "--yes"] if command == "purge" else []
    code, out, err = _run(capsys, command, url, *extra)
    assert code == 2 and message in err and out == ""
    assert "Traceback" not in err


@pytest.mark.s3
def test_a_missing_bucket_and_a_bad_id_fail_clearly(
    s3_server: LocalS3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    options = json.dumps(s3_server.storage_options())
    code, _, err = _run(capsys, "ls", "s3://no-such-bucket-here/x", "--storage-options", options)
    assert code == 2 and "does not exist" in err
    code, _, err = _run(capsys, "ls", f"{s3_server.bucket_url}/x", "--storage-options", options, "--tenant", "../a")
    assert code == 2 and "tenant id" in err
    code, _, err = _run(capsys, "ls", f"{s3_server.bucket_url}/x", "--storage-options", "[1]")
    assert code == 2 and "JSON object" in err


@pytest.mark.s3
def test_bad_credentials_fail_clearly(iam_endpoint: IamEndpoint, capsys: pytest.CaptureFixture[str]) -> None:
    good = iam_endpoint.storage_options
    assert main(["ls", f"{iam_endpoint.bucket_url}/x", "--storage-options", json.dumps(good)]) == 0
    capsys.readouterr()
    wrong = {**good, "key": "AKIAWRONGWRONGWRONG0", "secret": "not-the-secret"}
    code, out, err = _run(capsys, "ls", f"{iam_endpoint.bucket_url}/x", "--storage-options", json.dumps(wrong))
    assert code == 2 and out == ""
    assert "permission denied" in err and "Check the credentials" in err


@pytest.mark.s3
def test_doctor_with_refused_credentials_exits_as_its_help_says(
    iam_endpoint: IamEndpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--help"]) == 0
    statuses = " ".join(capsys.readouterr().out.split()).partition("Exit status: ")[2]
    meaning = {status[:1]: status[2:] for status in statuses.split("; ")}
    wrong = {**iam_endpoint.storage_options, "key": "AKIAWRONGWRONGWRONG0", "secret": "not-the-secret"}
    code, out, _ = _run(
        capsys, "doctor", "--store", f"{iam_endpoint.bucket_url}/x", "--storage-options", json.dumps(wrong)
    )
    assert "refused credentials" in meaning[str(code)], (code, meaning)
    assert code == 1 and "FAIL" in out


def test_ls_prints_paths_that_cat_takes_as_they_are(
    filled: FilledStore, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    assert main(["ls", *filled.arguments(), "-R"]) == 0
    listed = [
        line.split()[0] for line in capsysbinary.readouterr().out.decode().splitlines() if line.startswith(" " * 6)
    ]
    results = [path for path in listed if path.count("/") == 2]
    documents = [path for path in listed if path.count("/") == 3]
    assert len(results) == len(filled.root.list()) == 7 and len(documents) > 10
    for path in listed:
        assert main(["cat", *filled.arguments(), path]) == 0, capsysbinary.readouterr().err
        tenant, session, *rest = path.split("/")
        scope = filled.root.for_session(tenant, session)
        if len(rest) == 1:
            stored = scope.read(rest[0])
            expected = stored.encode() if isinstance(stored, str) else stored
        else:
            expected = decompress_document(scope.documents(rest[0].removeprefix(".")).get(rest[1]))
        assert capsysbinary.readouterr().out == expected, path


def test_cat_json_describes_the_result_and_carries_its_content(
    filled: FilledStore, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    records = filled.root.for_session("acme", "chat-1").list()
    search = next(record for record in records if record.tool_name == "web_search")
    image = next(record for record in records if record.kind == "bytes")

    text = _json(capsys, "cat", *filled.arguments(), f"acme/chat-1/{search.reference}")
    assert text["path"] == f"acme/chat-1/{search.reference}" and text["kind"] == "result"
    assert (text["encoding"], text["content"]) == ("utf-8", search_results(RESEARCH))
    assert text["size"] == text["length"] == search.size and text["offset"] == 0
    assert (text["tool_name"], text["content_kind"]) == ("web_search", "text")
    assert datetime.fromisoformat(text["created"]) == search.created

    png = _json(
        capsys, "cat", *filled.arguments(), f"acme/chat-1/{image.reference}", "--offset", "8", "--length", "100"
    )
    assert png["encoding"] == "base64" and base64.b64decode(png["content"]) == chart_png("revenue")[8:108]
    assert (png["offset"], png["length"], png["size"]) == (8, 100, len(chart_png("revenue")))

    saved = _json(capsys, "cat", *filled.arguments(), f"acme/chat-1/{image.reference}", "-o", str(tmp_path / "c.png"))
    assert saved["output"] == str(tmp_path / "c.png") and "content" not in saved
    assert (tmp_path / "c.png").read_bytes() == chart_png("revenue")

    history = filled.root.for_session("acme", "chat-1").documents("history")
    first = history.list()[0]
    document = _json(capsys, "cat", *filled.arguments(), f"acme/chat-1/.history/{first}")
    assert document["kind"] == "document" and "tool_name" not in document
    # The first is a turn's end, stored gzipped where that is smaller: cat shows the JSON it holds.
    assert first.endswith(".end.json") and history.get(first) != decompress_document(history.get(first))
    assert document["content"].encode() == decompress_document(history.get(first))
    assert json.loads(document["content"])["turn"] == 1


def test_cat_does_not_touch_the_output_file_when_the_path_is_wrong(
    filled: FilledStore, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_text("still here")
    code, _, err = _run(capsys, "cat", *filled.arguments(), "acme/chat-1/no-such-result.txt", "-o", str(kept))
    assert code == 2 and "No result or document" in err
    assert kept.read_text() == "still here"
