"""
``purge --older-than`` takes the documents of sessions inactive that long (whole sessions), on every backend.

The store is filled by the reference server (`filled`); an inactive session is added by running its history turns with
the clock set 40 days back, as a conversation abandoned long ago would have left it.
"""

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from cli_stores import FilledStore
from haystack.dataclasses import ChatMessage

from haystack_integrations.offload.cli import main
from haystack_integrations.offload.sessions import history as history_module
from haystack_integrations.offload.sessions.history import SessionHistory


async def _old_conversation(history: SessionHistory, turns: int) -> None:
    for number in range(turns):
        turn = await history.begin(await history.read(), kind="message", text=f"question {number}")
        added = [ChatMessage.from_user(f"question {number}"), ChatMessage.from_assistant(f"answer {number}")]
        await history.finish(turn, status="completed", messages=[*turn.conversation, *added])


def test_purge_older_than_takes_inactive_sessions_documents(
    filled: FilledStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    forty_days_ago = datetime.now(UTC) - timedelta(days=40)
    with monkeypatch.context() as patch:
        patch.setattr(history_module, "_now", lambda: forty_days_ago)
        asyncio.run(_old_conversation(SessionHistory(filled.root.for_session("globex", "old"), worker="w"), 3))
    live = {
        (tenant, session): filled.root.for_session(tenant, session).documents("history").list()
        for tenant, session in (("acme", "chat-1"), ("acme", "chat-2"), ("globex", "chat-1"))
    }

    assert main(["purge", *filled.arguments(), "--older-than", "30d", "--dry-run", "--json"]) == 0
    preview = json.loads(capsys.readouterr().out)
    # Three turns' starts and ends (a history writes its head at its tenth turn).
    assert (preview["results"], preview["documents"], preview["sessions"]) == (0, 6, ["globex/old"])
    assert main(["purge", *filled.arguments(), "--older-than", "30d", "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["deleted"] == 6
    assert filled.root.for_session("globex", "old").documents("history").list() == []
    for (tenant, session), names in live.items():
        assert filled.root.for_session(tenant, session).documents("history").list() == names
