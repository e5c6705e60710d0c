"""
The app's example of the target pattern (`demo/example.py`: `offload_context` + ``agent.run_async`` per request, one
Agent and one store made at start-up) runs, keeps each tenant's chat in its own session, and costs one PUT per
offloaded result.
"""

import uuid
from pathlib import Path
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore, ResultNotFoundError
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from offload_haystack_app.demo import example


@pytest.mark.s3
@pytest.mark.parametrize("tenants", [("acme",), ("acme", "globex", "initech")])
async def test_each_chat_costs_one_put_an_offloaded_result_and_one_get_to_search_it(
    tenants: tuple[str, ...], s3_server: LocalS3Server, s3_requests: RequestLog
) -> None:
    url = f"{s3_server.bucket_url}/example-{uuid.uuid4().hex}"
    s3_requests.clear()
    chats = await example.run_example(url, storage_options=s3_server.storage_options(), tenants=tenants)
    # Per chat: a search page and a table, one PUT each; the read-back turn's search, one GET. No HEAD, no LIST.
    assert s3_requests.methods() == {"PUT": 2 * len(tenants), "GET": len(tenants)}
    assert [len(chat.references) for chat in chats] == [2] * len(tenants)


async def test_each_chat_offloads_to_its_own_session_only(s3_endpoint: Any) -> None:
    # On moto, and on the real S3 server when its lane is on (OFFLOAD_TEST_REAL_S3).
    url = f"{s3_endpoint.bucket_url}/example-{uuid.uuid4().hex}"
    options = s3_endpoint.storage_options()
    tenants = ("acme", "globex")
    chats = await example.run_example(url, storage_options=options, tenants=tenants)
    root = FsspecToolResultStore(url, storage_options=options)
    for chat in chats:
        assert "11 matches" in chat.reply  # the read-back tool searched the chat's own search result
        store = root.for_session(chat.tenant, chat.chat_id)
        assert {record.reference for record in await store.list_async()} == set(chat.references)
        [other] = [tenant for tenant in tenants if tenant != chat.tenant]
        for reference in chat.references:
            with pytest.raises(ResultNotFoundError):
                await root.for_session(other, chat.chat_id).read_async(reference)


def test_the_example_runs_as_a_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert example.main([str(tmp_path / "results")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == ["acme/chat-1", "globex/chat-1"]
    assert all("2 results offloaded" in line for line in lines)
