"""
A rolling deploy's mixed engines on one bucket: what a worker on s3fs (``engine="fsspec"``) writes or creates, a
worker on obstore (``engine="obstore"``) reads, lists, claims and deletes, and the other way round; on moto and, in
the real-S3 lane, on Ceph RGW (`s3_endpoint`, which marks each test ``s3`` or ``rgw``).
"""

import asyncio
import os
import uuid
from typing import Any

import pytest
from haystack.components.agents import Agent
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy
from haystack.tools.tool import Tool

from haystack_integrations.offload import (
    APPROVAL_REQUIRED,
    ApprovalHook,
    Decision,
    DocumentExistsError,
    DurableApprovals,
    FsspecToolResultStore,
    ResultNotFoundError,
    decide,
    offload_context,
    pending_approvals,
    read_audit,
    resume,
)
from haystack_integrations.offload.approvals import ApprovalClaimedError
from haystack_integrations.offload.stores.documents import writer_token
from haystack_integrations.offload.stores.io import MULTIPART_PART_BYTES, MULTIPART_THRESHOLD

PAIRS = pytest.mark.parametrize(
    ("writer_engine", "reader_engine"),
    [("fsspec", "obstore"), ("obstore", "fsspec")],
    ids=["fsspec-to-obstore", "obstore-to-fsspec"],
)
# Above the threshold, and not a whole number of parts: a multipart upload whose last part is short.
LARGE = MULTIPART_THRESHOLD + MULTIPART_PART_BYTES // 2 + 7
INVOICE = {"customer": "acme", "amount": 120}
TEXT = "h\u00e9llo \U0001f30d"


def _workers(server: Any, *engines: str) -> list[FsspecToolResultStore]:
    """One session of one fresh root, as seen by a worker on each engine (each with its own client)."""
    url, options = f"{server.bucket_url}/{uuid.uuid4().hex}", server.storage_options()
    return [
        FsspecToolResultStore(url, storage_options=options, engine=engine).for_session("acme", "chat-1")
        for engine in engines
    ]


def _etag(server: Any, store: FsspecToolResultStore, reference: str) -> str:
    bucket, _, prefix = store._scope_path().partition("/")
    return str(server.client().head_object(Bucket=bucket, Key=f"{prefix}/{reference}")["ETag"]).strip('"')


@PAIRS
def test_results_written_on_one_engine_are_read_listed_and_deleted_on_the_other(
    s3_endpoint: Any, writer_engine: str, reader_engine: str
) -> None:
    writer, reader = _workers(s3_endpoint, writer_engine, reader_engine)
    assert reader.list() == [] and writer.list() == []  # both have looked (and may cache) before anything lands
    large = os.urandom(LARGE)
    text = writer.write(key="1_search_call_1.txt", content=TEXT, tool_name="search")
    small = writer.write(key="2_fetch_call_2.bin", content=b"\x00\xffsmall", tool_name="fetch")
    big = writer.write(key="3_fetch_call_3.bin", content=large, tool_name="fetch")
    assert "-" in _etag(s3_endpoint, writer, big)  # really a multipart upload (its ETag counts the parts)
    assert "-" not in _etag(s3_endpoint, writer, small)

    assert reader.read(text) == TEXT
    assert reader.read(small) == b"\x00\xffsmall"
    assert reader.read(big) == large
    seam = MULTIPART_PART_BYTES  # a range across the first part boundary, the short tail, and past the end
    assert reader.read_range_and_size(big, seam - 100, seam + 100) == (large[seam - 100 : seam + 100], LARGE)
    assert reader.read_range_and_size(big, LARGE - 10, LARGE + 99) == (large[-10:], LARGE)
    assert reader.read_range_and_size(big, LARGE, LARGE + 5) == (b"", LARGE)
    assert reader.read_range_and_size(text, 0, 2) == (TEXT.encode()[:2], len(TEXT.encode()))
    info = reader.info(big)
    assert (info.size, info.kind, info.tool_name) == (LARGE, "bytes", "fetch")
    assert reader.info(text).kind == "text" and reader.info(text).size == len(TEXT.encode())
    assert reader.list() == writer.list()
    assert [record.reference for record in reader.list()] == [big, small, text]  # newest first
    assert [record.size for record in reader.list()] == [LARGE, 7, len(TEXT.encode())]

    reader.delete(small)  # the writer, which listed and read it, must see it gone (info(): the test below)
    with pytest.raises(ResultNotFoundError):
        writer.read(small)
    assert [record.reference for record in writer.list()] == [big, text]
    # And back: the reader purges what is left, the writer writes again and purges that.
    assert reader.purge() == 2
    assert writer.list() == [] and reader.list() == []
    for gone in (big, text):
        with pytest.raises(ResultNotFoundError):
            writer.read(gone)
    again = writer.write(key="4_search_call_4.txt", content="again")
    assert reader.read(again) == "again"
    assert writer.purge() == 1 and reader.list() == []


@pytest.mark.parametrize(
    ("observer_engine", "other_engine"),
    [
        ("fsspec", "obstore"),  # s3fs answered info() from the listing it cached first (fixed: S3IO._size HEADs)
        ("obstore", "fsspec"),
    ],
    ids=["s3fs-observes-obstore", "obstore-observes-s3fs"],
)
def test_a_worker_that_listed_describes_what_the_other_engine_wrote_and_deleted_since(
    s3_endpoint: Any, observer_engine: str, other_engine: str
) -> None:
    observer, other = _workers(s3_endpoint, observer_engine, other_engine)
    old = observer.write(key="1_fetch_call_1.bin", content=b"1234567")
    assert [record.reference for record in observer.list()] == [old]
    new = other.write(key="2_fetch_call_2.bin", content=b"xyz")
    other.delete(old)
    assert [record.reference for record in observer.list()] == [new]
    assert observer.info(new).size == 3
    assert observer.read_range_and_size(new, 3, 8) == (b"", 3)  # past the end: the size alone (a HEAD)
    with pytest.raises(ResultNotFoundError):
        observer.info(old)


@PAIRS
def test_a_document_created_on_one_engine_exists_for_the_other(
    s3_endpoint: Any, writer_engine: str, reader_engine: str
) -> None:
    writer, reader = _workers(s3_endpoint, writer_engine, reader_engine)
    mine, theirs = (f"{name}:{writer_token()}".encode() for name in ("writer", "reader"))
    assert reader.documents("claims").list() == []
    writer.documents("claims").create("call_1", mine)

    claims = reader.documents("claims")
    assert claims.list() == ["call_1"] and claims.get("call_1") == mine
    with pytest.raises(DocumentExistsError):  # the conditional create lost; the other engine's bytes were read back
        claims.create("call_1", theirs)
    claims.create("call_1", mine)  # the same bytes: taken for the writer's own create whose reply was lost
    assert writer.documents("claims").get("call_1") == mine  # unchanged by either attempt
    claims.delete("call_1")
    assert writer.documents("claims").list() == []
    writer.documents("claims").create("call_1", theirs)  # free again after the other engine's delete
    assert claims.get("call_1") == theirs


@PAIRS
async def test_workers_on_both_engines_racing_to_create_one_document_agree_on_one_winner(
    s3_endpoint: Any, writer_engine: str, reader_engine: str
) -> None:
    workers = _workers(s3_endpoint, writer_engine, reader_engine)
    await workers[0].check_exclusive_creates_async()  # the probe, out of the race
    names = [f"call_{index}" for index in range(12)]

    async def attempt(worker: FsspecToolResultStore, name: str, data: bytes) -> bytes | None:
        try:
            await worker.documents("claims").create_async(name, data)
        except DocumentExistsError:
            return None
        return data

    # Both creates of each name in flight at once; which engine's request goes out first alternates.
    order = [(name, w) for index, name in enumerate(names) for w in ((0, 1) if index % 2 else (1, 0))]
    contents = {(name, w): f"{w}:{name}:{writer_token()}".encode() for name, w in order}
    outcomes = await asyncio.gather(*(attempt(workers[w], name, contents[name, w]) for name, w in order))
    winners: dict[str, list[bytes]] = {name: [] for name in names}
    for (name, _), outcome in zip(order, outcomes, strict=True):
        if outcome is not None:
            winners[name].append(outcome)
    for name, [winner] in winners.items():  # exactly one won each name, and both engines read its bytes
        for worker in workers:
            assert await worker.documents("claims").get_async(name) == winner
    for worker in workers:
        assert await worker.documents("claims").list_async() == sorted(names)


def _agent(ran: list[dict[str, Any]]) -> Agent:
    """A real Agent whose scripted model asks for one invoice, with an `ApprovalHook` that always asks first."""

    def send_invoice(customer: str, amount: int) -> str:
        ran.append({"customer": customer, "amount": amount})
        return f"invoice sent to {customer} for {amount}"

    def script(messages: list[ChatMessage]) -> ChatMessage:
        last = messages[-1]
        if last.is_from(ChatRole.USER):
            return ChatMessage.from_assistant(
                "On it.", tool_calls=[ToolCall(tool_name="send_invoice", arguments=INVOICE, id="call_inv")]
            )
        result = last.tool_call_result
        return ChatMessage.from_assistant(f"final: {result.result if result is not None else None}")

    schema = {"type": "object", "properties": {"customer": {"type": "string"}, "amount": {"type": "integer"}}}
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=[Tool(name="send_invoice", description="Send an invoice.", parameters=schema, function=send_invoice)],
        hooks={"before_tool": [ApprovalHook({"send_invoice": AlwaysAskPolicy()})]},
    )
    agent.warm_up()
    return agent


@PAIRS
def test_a_step_held_on_one_engine_is_decided_and_resumed_on_the_other_and_runs_once(
    s3_endpoint: Any, writer_engine: str, reader_engine: str
) -> None:
    holder, other = _workers(s3_endpoint, writer_engine, reader_engine)
    ran: list[dict[str, Any]] = []
    context = offload_context(holder, approval_channel=DurableApprovals(actor="user-7"))
    reply = _agent(ran).run([ChatMessage.from_user("Invoice acme.")], hook_context=context)
    assert reply["exit_reason"] == APPROVAL_REQUIRED and ran == []

    [request] = pending_approvals(other)
    assert (request.tool_call_id, request.arguments) == ("call_inv", INVOICE)
    decide(other, request.request_id, Decision.approve(by="alice"))
    assert pending_approvals(holder) == []
    final = resume(_agent(ran), reply["messages"], other, worker="other")
    assert final["last_message"].text == "final: invoice sent to acme for 120"
    with pytest.raises(ApprovalClaimedError):  # the other engine's claim holds against the holder's replay
        resume(_agent(ran), reply["messages"], holder, worker="holder")

    assert ran == [INVOICE]
    events = [(event.event, event.actor) for event in read_audit(holder)]
    assert events == [
        ("approval.requested", "user-7"),
        ("approval.decided", "alice"),
        ("approval.resumed", "other"),
        ("approval.executed", "other"),
    ]
