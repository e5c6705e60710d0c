"""
The operator commands' edges an ``aws s3`` user meets first (issue 43): a scoped ``ls`` does not list its own scope
again below itself, sizes say which unit they are in, ``audit`` takes the ``tenant/session`` path ``ls`` prints,
``purge --dry-run`` lists what would go, and a store that never answers ends ``ls`` after one attempt, saying so.
"""

import json
import re
from typing import Any

import pytest
from cli_stores import FilledStore

from haystack_integrations.offload.cli import main
from support.silent_endpoint import SilentEndpoint


def _run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str, str]:
    code = main(list(arguments))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _json(capsys: pytest.CaptureFixture[str], *arguments: str) -> Any:
    code, out, err = _run(capsys, *arguments, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("scope", ["url", "flag"])
def test_a_tenants_listing_shows_its_sessions_below_it_not_the_tenant_again(
    filled: FilledStore, capsys: pytest.CaptureFixture[str], scope: str
) -> None:
    options = ["--storage-options", json.dumps(filled.storage_options)]
    arguments = (
        [f"{filled.url.rstrip('/')}/acme", *options] if scope == "url" else [*filled.arguments(), "--tenant", "acme"]
    )
    code, out, err = _run(capsys, "ls", *arguments)
    lines = [line for line in out.splitlines() if not line.startswith("listing ")]
    assert code == 0, err
    assert lines[0].split("  ")[0].endswith("/acme/"), lines
    # Below the tenant's own line come its sessions, one level in; "acme/" is not a child of "acme/".
    assert [line.split("/")[0] for line in lines[1:]] == ["  chat-1", "  chat-2"], out
    assert "tenant(s)" not in lines[0] and "2 session(s)" in lines[0]


def test_a_sessions_listing_lists_its_objects_below_it_not_the_session_again(
    filled: FilledStore, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "ls", *filled.arguments(), "--tenant", "acme", "--session", "chat-1")
    header, *rest = out.splitlines()
    assert code == 0 and header.split("  ")[0].endswith("/acme/chat-1/")
    assert rest and all(line.startswith("  acme/chat-1/") for line in rest), out  # paths as `cat` takes them


def test_sizes_are_labelled_in_the_binary_units_they_are_counted_in(
    filled: FilledStore, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = _json(capsys, "ls", *filled.arguments())
    code, out, _ = _run(capsys, "ls", *filled.arguments())
    units = set(re.findall(r"\d (B|KB|MB|GB|KiB|MiB|GiB)\b", out))
    assert code == 0 and units <= {"B", "KiB", "MiB", "GiB"} and "KiB" in units, out
    # The total, in KiB: bytes / 1024, one decimal.
    total = next(line for line in out.splitlines() if "in all" in line and "tenant(s)" in line)
    assert f"{listed['total_bytes'] / 1024:.1f} KiB in all" in total, (total, listed["total_bytes"])


@pytest.mark.parametrize("path", ["acme/chat-1", "acme/chat-1/"])
def test_audit_takes_the_tenant_and_session_as_one_path(
    filled: FilledStore, capsys: pytest.CaptureFixture[str], path: str
) -> None:
    by_flags = _json(capsys, "audit", *filled.arguments(), "--tenant", "acme", "--session", "chat-1")
    by_path = _json(capsys, "audit", *filled.arguments(), path)
    assert by_path == by_flags and len(by_path) == 4


@pytest.mark.parametrize(
    ("arguments", "said"),
    [
        (["acme"], "is not a session: give tenant/session"),
        (["acme/chat-1/extra"], "is not a session: give tenant/session"),
        (["acme/chat-1", "--tenant", "acme"], "Give the session once"),
        ([], "Say whose audit record"),
        (["--tenant", "acme"], "Say whose audit record"),
    ],
)
def test_audit_refuses_a_path_that_names_no_one_session(
    filled: FilledStore, capsys: pytest.CaptureFixture[str], arguments: list[str], said: str
) -> None:
    code, _, err = _run(capsys, "audit", *filled.arguments(), *arguments)
    assert code == 2 and said in err and len(err.splitlines()) == 1, err


def test_purge_dry_run_lists_each_object_it_would_delete(
    filled: FilledStore, capsys: pytest.CaptureFixture[str]
) -> None:
    session = filled.root.for_session("acme", "chat-1")
    stored = {f"acme/chat-1/{record.reference}" for record in session.list()}
    code, out, _ = _run(capsys, "purge", *filled.arguments(), "--tenant", "acme", "--session", "chat-1", "--dry-run")
    listed = [line.split("  ")[0].removeprefix("(dry run) delete: ") for line in out.splitlines() if "delete: " in line]
    preview = _json(capsys, "purge", *filled.arguments(), "--tenant", "acme", "--session", "chat-1", "--dry-run")

    assert code == 0 and len(listed) == preview["results"] + preview["documents"], out
    assert stored <= set(listed) and all(path.startswith("acme/chat-1/") for path in listed)
    assert "acme/chat-1/.history/turn.00000001.start.json" in listed  # documents too
    assert sorted(item["path"] for item in preview["objects"]) == sorted(listed)
    assert {f"acme/chat-1/{record.reference}" for record in session.list()} == stored  # nothing deleted


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_ls_on_a_store_that_never_answers_gives_up_after_one_attempt_and_says_so(
    capsys: pytest.CaptureFixture[str], engine: str
) -> None:
    # The default timeouts (5 s connect, 15 s read): one attempt waits out the read timeout, and the operator
    # commands start no second one after 10 s (the store's default policy, 30 s, made two: 34 s in all).
    with SilentEndpoint() as silent:
        options = {"endpoint_url": silent.url, "key": "k", "secret": "s", "client_kwargs": {"region_name": "us-east-1"}}
        code, _, err = _run(
            capsys, "ls", "s3://bucket/prod", "--storage-options", json.dumps(options), "--engine", engine
        )
        connections = silent.wait_for_connections(1)
    assert code == 2 and connections == 1, (connections, err)
    line = err.strip().splitlines()[-1]
    assert line.startswith("offload-haystack: error: The store did not answer (timeout): "), line
    assert "1 attempt(s)" in line and silent.url in line
