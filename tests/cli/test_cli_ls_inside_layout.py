"""
``ls`` with a URL inside the layout (a tenant's or a session's prefix, as an AWS CLI user types it): listed as that
tenant or session of the root above it, saying so; a true root still lists as a root.
"""

import json
from typing import Any

import pytest
from cli_stores import FilledStore

from haystack_integrations.offload.cli import main


def _ls(capsys: pytest.CaptureFixture[str], url: str, filled: FilledStore, *more: str) -> tuple[str, Any]:
    options = ["--storage-options", json.dumps(filled.storage_options)]
    assert main(["ls", url, *options, *more]) == 0
    text = capsys.readouterr().out
    assert main(["ls", url, *options, *more, "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


def test_a_session_url_lists_that_sessions_results(filled: FilledStore, capsys: pytest.CaptureFixture[str]) -> None:
    text, listed = _ls(capsys, f"{filled.url.rstrip('/')}/acme/chat-1", filled)
    records = filled.root.for_session("acme", "chat-1").list()
    assert listed["results"] == len(records) > 0 and listed["other_objects"] == 0
    assert listed["listed_as"] == {"root": filled.url.rstrip("/"), "tenant": "acme", "session": "chat-1"}
    assert {item["path"].split("/")[0] for item in listed["objects"]} == {"acme"}
    assert text.splitlines()[0].startswith("listing session 'chat-1' of tenant 'acme' of root ")
    for record in records:
        assert f"acme/chat-1/{record.reference}" in text  # the path `cat` takes with the root URL
    assert "not written by this library" not in text


def test_a_tenant_url_lists_that_tenants_sessions(filled: FilledStore, capsys: pytest.CaptureFixture[str]) -> None:
    text, listed = _ls(capsys, f"{filled.url.rstrip('/')}/acme/", filled)
    assert [tenant["tenant"] for tenant in listed["tenants"]] == ["acme"]
    assert sorted(listed["tenants"][0]["sessions"]) == ["chat-1", "chat-2"]
    assert listed["results"] == len(filled.root.for_tenant("acme").list()) == 6
    assert listed["listed_as"] == {"root": filled.url.rstrip("/"), "tenant": "acme", "session": None}
    assert text.splitlines()[0].startswith("listing tenant 'acme' of root ")
    assert "chat-1/" in text and "chat-2/" in text and "globex" not in text


def test_a_true_root_still_lists_as_a_root(filled: FilledStore, capsys: pytest.CaptureFixture[str]) -> None:
    text, listed = _ls(capsys, filled.url, filled)
    assert "listed_as" not in listed and not text.startswith("listing")
    assert [tenant["tenant"] for tenant in listed["tenants"]] == ["acme", "globex"]
    # With --tenant the URL is the root as given: nothing is reinterpreted.
    _, scoped = _ls(capsys, f"{filled.url.rstrip('/')}/acme", filled, "--tenant", "chat-1")
    assert "listed_as" not in scoped and scoped["results"] == 0
