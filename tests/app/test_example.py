"""
The app's example of the target pattern (`demo/example.py`: `offload_context` + ``agent.run_async`` per request, one
Agent and one store made at start-up) runs, isolates each tenant's chat, and costs one PUT per offloaded result.
"""

import uuid
from pathlib import Path

import pytest

from haystack_integrations.offload import FsspecToolResultStore, ResultNotFoundError
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from offload_haystack_app.demo import example


@pytest.mark.s3
@pytest.mark.parametrize("tenants", [("acme",), ("acme", "globex", "initech")])
async def test_each_chat_offloads_to_its_own_session_with_one_put_a_result(
    tenants: tuple[str, ...], s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    url = f"{s3_server.bucket_url}/example-{uuid.uuid4().hex}"
    options = s3_server.storage_options()
    s3_requests.clear()
    chats = await example.run_example(url, storage_options=options, tenants=tenants)
    # Per chat: a search page and a table, one PUT each; the read-back turn's search, one GET. No HEAD, no LIST.
    assert s3_requests.methods() == {"PUT": 2 * len(tenants), "GET": len(tenants)}
    root = FsspecToolResultStore(url, storage_options=options)
    for chat in chats:
        assert len(chat.references) == 2
        assert "11 matches" in chat.reply  # the read-back tool searched the chat's own search result
        store = root.for_session(chat.tenant, chat.chat_id)
        assert {record.reference for record in await store.list_async()} == set(chat.references)
        for other in tenants:
            if other != chat.tenant:
                with pytest.raises(ResultNotFoundError):
                    await root.for_session(other, chat.chat_id).read_async(chat.references[0])


def test_the_example_runs_as_a_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert example.main([str(tmp_path / "results")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == ["acme/chat-1", "globex/chat-1"]
    assert all("2 results offloaded" in line for line in lines)
