"""
``offload-haystack purge`` is the store's own purge: the same choice (one listing, the storage's clock for results whose
names say old, probe keys by their own grace), the same batched deletes, so a preview shows what either would delete.

Before, the command chose for itself from a scan: by names alone, and with the local writes' grace for every
temporary file, so it deleted a fresh result whose writer's clock was behind, and kept a dead prober's key.
"""

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cli_stores import FilledStore

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.operations.purge import carry_out, plan_purge, select_scope
from haystack_integrations.offload.stores.names import new_object_name, new_temporary_name
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog


def _json(capsys: pytest.CaptureFixture[str], *arguments: str) -> Any:
    code = main([*arguments, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def _aged(store: FsspecToolResultStore, age: timedelta) -> str:
    """A result whose name says `age` ago (its writer's clock was off), which the storage says was written now."""
    name = new_object_name(key="skewed.txt", kind="text", tool_name="fetch", now=datetime.now(UTC) - age)
    filesystem = store._handle.io().fs
    filesystem.makedirs(store._scope_path(), exist_ok=True)  # local disk needs the directory
    filesystem.pipe_file(f"{store._scope_path()}/{name}", b"fresh, by the storage's clock")
    return name


def test_a_fresh_result_named_old_is_kept_by_the_command_as_by_the_store(
    filled: FilledStore, capsys: pytest.CaptureFixture[str]
) -> None:
    session = filled.root.for_session("globex", "chat-1")
    skewed = _aged(session, timedelta(days=40))
    before = {record.reference for record in filled.root.list()}

    preview = _json(capsys, "purge", *filled.arguments(), "--older-than", "30d", "--dry-run")
    assert (preview["results"], preview["documents"], preview["objects"]) == (0, 0, [])
    done = _json(capsys, "purge", *filled.arguments(), "--older-than", "30d", "--yes")
    assert done["deleted"] == 0
    assert skewed in {record.reference for record in session.list()}
    # The store's own purge agrees: nothing is 30 days old by the storage's clock.
    assert filled.root.purge(older_than=timedelta(days=30)) == 0
    assert {record.reference for record in filled.root.list()} == before


def test_a_scope_purge_plans_what_a_scan_selects_and_deletes_it(filled: FilledStore) -> None:
    # The whole-scope plan is every result and document: what `select_scope` picks from a scan of the same scope.
    from haystack_integrations.offload.operations import scan

    plan = plan_purge(filled.root, tenant="acme")
    assert plan.objects == select_scope(scan(filled.root, tenant="acme")).objects
    assert plan.sessions() == ["acme/chat-1", "acme/chat-2"] and plan.documents > 0
    assert carry_out(plan) == len(plan.objects)
    assert scan(filled.root, tenant="acme") == []
    with pytest.raises(ValueError, match="made from a scan"):
        carry_out(select_scope(scan(filled.root, tenant="globex")))
    with pytest.raises(ValueError, match="takes an age"):
        plan_purge(filled.root)


@pytest.mark.s3
def test_a_dead_probers_key_goes_after_its_own_grace_on_an_object_store(
    s3_server: LocalS3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    # A killed exclusive-create check leaves its probe key (a temporary name): on an object store, where no write
    # leaves temporary files, the store's purge takes one 20 minutes old (PROBE_GRACE), and so does the command.
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    root = FsspecToolResultStore(url, storage_options=s3_server.storage_options())
    session = root.for_session("acme", "chat-1")
    session.write(key="a.txt", content="a")
    probe = new_temporary_name(now=datetime.now(UTC) - timedelta(minutes=20))
    session._handle.io().fs.pipe_file(f"{session._scope_path()}/{probe}", b"")
    arguments = ["purge", url, "--storage-options", json.dumps(s3_server.storage_options())]

    preview = _json(capsys, *arguments, "--tenant", "acme", "--session", "chat-1", "--dry-run")
    assert (preview["results"], preview["temporary_files"]) == (1, 1)
    assert f"acme/chat-1/{probe}" in {item["path"] for item in preview["objects"]}
    assert _json(capsys, *arguments, "--tenant", "acme", "--session", "chat-1", "--yes")["deleted"] == 2
    assert root.find_objects() == {}


@pytest.mark.s3
@pytest.mark.parametrize("count", [20, 200])
def test_the_command_sends_one_listing_and_batched_deletes_whatever_it_deletes(
    s3_server: LocalS3Server, s3_requests: RequestLog, capsys: pytest.CaptureFixture[str], count: int
) -> None:
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    root = FsspecToolResultStore(url, storage_options=s3_server.storage_options())
    session = root.for_session("acme", "chat-1")
    for number in range(count):
        session.write(key=f"{number}.txt", content=str(number))
    session.documents("history").put("head.json", b"{}")
    s3_requests.clear()

    arguments = ["purge", url, "--storage-options", json.dumps(s3_server.storage_options()), "--tenant", "acme"]
    assert _json(capsys, *arguments, "--yes")["deleted"] == count + 1
    methods = [
        (
            request.method,
            "list" if "list-type" in request.query else "batch delete" if "delete" in request.query else "",
        )
        for request in s3_requests
    ]
    assert methods == [("GET", "list"), ("POST", "batch delete")]
    assert root.find_objects() == {}
