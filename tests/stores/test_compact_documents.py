"""Session documents gzipped where that makes them smaller, read back either way (and as written before)."""

import gzip
import json
import os
from datetime import UTC, datetime

import pytest
from haystack.dataclasses import ChatMessage

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.sessions.conversation_cache import ConversationCache
from haystack_integrations.offload.sessions.history import SessionHistory
from haystack_integrations.offload.stores.compact_documents import (
    COMPRESS_FROM,
    compress_document,
    decompress_document,
)
from haystack_integrations.offload.stores.retention import activity_time


def test_a_document_is_gzipped_when_that_is_smaller_and_reads_back_exactly() -> None:
    document = json.dumps({"messages": ["a long answer, said again and again. " * 20]}).encode()
    stored = compress_document(document)
    assert len(stored) < len(document) and gzip.decompress(stored) == document  # gunzip reads it
    assert decompress_document(stored) == document


def test_a_small_or_incompressible_document_is_stored_as_it_is() -> None:
    small = b'{"turn":1}'
    assert len(small) < COMPRESS_FROM and compress_document(small) == small
    # Random bytes do not compress: gzip's framing would only add to them.
    noise = os.urandom(400)
    assert compress_document(noise) == noise


def test_a_damaged_compressed_document_is_a_clear_error() -> None:
    stored = compress_document(b'{"x": "' + b"y" * 1000 + b'"}')
    with pytest.raises(ValueError, match="damaged"):
        decompress_document(stored[:20])


def test_retention_dates_a_session_by_a_compressed_end() -> None:
    moment = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
    end = json.dumps({"turn": 1, "ended_at": moment.isoformat(), "messages": ["words " * 100]}).encode()
    assert compress_document(end) != end and activity_time(compress_document(end)) == moment


async def test_a_session_stored_uncompressed_before_reads_and_carries_on() -> None:
    session = FsspecToolResultStore("memory://compact-before").for_session("acme", "chat-1")
    history = SessionHistory(session, worker="w1", cache=ConversationCache(0))
    first = [ChatMessage.from_user("q " * 200), ChatMessage.from_assistant("a " * 200)]
    turn = await history.begin(await history.read(), kind="message", text="q")
    await history.finish(turn, status="completed", messages=first)
    documents = session.documents("history")
    stored = await documents.get_async("turn.00000001.end.json")
    assert stored != decompress_document(stored)
    await documents.put_async("turn.00000001.end.json", decompress_document(stored))  # as the code before wrote it
    cold = SessionHistory(session, worker="w2", cache=ConversationCache(0))
    state = await cold.read()
    assert state.conversation == first
    turn = await cold.begin(state, kind="message", text="next")
    await cold.finish(turn, status="completed", messages=[*first, ChatMessage.from_user("next")])
    assert len((await history.read()).conversation) == 3
