"""
The server's turn claims on a real S3 server: messages sent to one session at once give one turn, the rest "busy";
on moto and, in the real-S3 lane, on Ceph RGW, with both engines.
"""

import asyncio
import uuid
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.sessions import ChatService
from haystack_integrations.offload.sessions.errors import SessionBusyError
from offload_haystack_app.demo.scripted_model import scripted_generator
from offload_haystack_app.server import build_agent

AT_ONCE = 4


@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
async def test_messages_sent_at_once_to_one_session_give_one_turn_and_busy_answers(
    s3_endpoint: Any, engine: str
) -> None:
    root = FsspecToolResultStore(
        f"{s3_endpoint.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_endpoint.storage_options(), engine=engine
    )
    session = root.for_session("acme", "chat-1")
    # The search takes a while, so every sender reaches its claim while the winner's turn still runs.
    service = ChatService(build_agent(scripted_generator(), tool_delay=0.5))
    await root.check_exclusive_creates_async()
    outcomes = await asyncio.gather(
        *(service.send_message(session, f"Research topic {index}") for index in range(AT_ONCE)),
        return_exceptions=True,
    )
    replies = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
    busy = [outcome for outcome in outcomes if isinstance(outcome, SessionBusyError)]
    assert (len(replies), len(busy)) == (1, AT_ONCE - 1), outcomes
    transcript = await service.transcript(session)
    assert transcript.turns == 1 and not transcript.busy and transcript.status == "completed"
