"""
Approvals need a `SessionDocumentSource`, not this library's store: a third-party store that keeps documents works end
to end, and a store that keeps none (Haystack's plain protocol) gets a clear error from the durable channel and the
ledger.
"""

import uuid
from pathlib import Path
from typing import Any

import pytest
from approval_scenario import ledger_lines, make_agent, plan
from haystack.components.agents import Agent
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy, NeverAskPolicy

from haystack_integrations.offload import (
    APPROVAL_REQUIRED,
    ApprovalRequest,
    AskOncePerSession,
    CallbackApprovals,
    Decision,
    DurableApprovals,
    FsspecToolResultStore,
    decide,
    decide_async,
    offload_context,
    pending_approvals,
    pending_approvals_async,
    read_audit,
    read_audit_async,
    resume,
    resume_async,
)
from haystack_integrations.offload.approvals.ledger import ApprovalLedger, session_scope
from haystack_integrations.offload.context import RESULT_STORE_CONTEXT_KEY, resume_context
from haystack_integrations.offload.types import Documents, SessionDocumentSource

INVOICE = ("send_invoice", {"customer": "acme", "amount": 120}, "call_inv")


class DelegatingStore:
    """
    A third-party store: Haystack's ``write``/``read`` and the `SessionDocumentSource` Protocol, delegating to a real
    session.

    Not a subclass of `FsspecToolResultStore` and no ``scope``: approvals may use nothing but the Protocol.
    """

    supports_binary_content = True

    def __init__(self, inner: FsspecToolResultStore) -> None:
        self._inner = inner
        self.namespaces: list[str] = []

    @property
    def tenant(self) -> str | None:
        return self._inner.tenant

    @property
    def session(self) -> str | None:
        return self._inner.session

    def documents(self, namespace: str) -> Documents:
        self.namespaces.append(namespace)
        return self._inner.documents(namespace)

    def write(self, *, key: str, content: str | bytes) -> str:
        return self._inner.write(key=key, content=content)

    def read(self, reference: str) -> str | bytes:
        return self._inner.read(reference)


class PlainStore:
    """Haystack's `ToolResultStore` protocol and nothing more: no documents, no tenant, no session."""

    def __init__(self) -> None:
        self.written: dict[str, str | bytes] = {}

    def write(self, *, key: str, content: str | bytes) -> str:
        self.written[key] = content
        return key

    def read(self, reference: str) -> str | bytes:
        return self.written[reference]


class DocumentsOnlyStore(PlainStore):
    """Has ``documents()`` but says nothing of its tenant and session: not a `SessionDocumentSource`."""

    def __init__(self, inner: FsspecToolResultStore) -> None:
        super().__init__()
        self._inner = inner

    def documents(self, namespace: str) -> Documents:
        return self._inner.documents(namespace)


@pytest.fixture
def root() -> FsspecToolResultStore:
    return FsspecToolResultStore(f"memory://approval-protocols-{uuid.uuid4().hex}")


@pytest.fixture
def inner(root: FsspecToolResultStore) -> FsspecToolResultStore:
    return root.for_session("acme", "chat-1")


@pytest.fixture
def agent(ledger: Path) -> Agent:
    return make_agent({"send_invoice": AlwaysAskPolicy(), "*": NeverAskPolicy()})


def durable(store: Any) -> dict[str, Any]:
    return offload_context(store, approval_channel=DurableApprovals())


def test_a_third_party_document_store_holds_decides_and_resumes(
    agent: Agent, inner: FsspecToolResultStore, ledger: Path
) -> None:
    store = DelegatingStore(inner)
    assert isinstance(store, SessionDocumentSource) and not isinstance(store, FsspecToolResultStore)

    reply = agent.run([plan(INVOICE)], hook_context=durable(store))
    assert reply["exit_reason"] == APPROVAL_REQUIRED
    [request] = pending_approvals(store)
    # The records went through the wrapper into the real session: the library's own store sees the same request.
    assert [r.request_id for r in pending_approvals(inner)] == [request.request_id]
    assert (request.tenant, request.session) == ("acme", "chat-1")

    decide(store, request.request_id, Decision.approve(by="alice"))
    final = resume(agent, reply["messages"], store)

    assert len(ledger_lines(ledger)) == 1
    assert final["last_message"].text == "final: invoice sent to acme for 120"
    assert [event.event for event in read_audit(store)] == [
        "approval.requested",
        "approval.decided",
        "approval.resumed",
        "approval.executed",
    ]
    assert {"approvals", "audit"} <= set(store.namespaces)


async def test_a_third_party_document_store_works_async(
    agent: Agent, inner: FsspecToolResultStore, ledger: Path
) -> None:
    store = DelegatingStore(inner)
    reply = await agent.run_async([plan(INVOICE)], hook_context=durable(store))
    [request] = await pending_approvals_async(store)
    await decide_async(store, request.request_id, Decision.deny("no", by="alice"))
    final = await resume_async(agent, reply["messages"], store)
    assert ledger_lines(ledger) == []
    assert final["approval_outcomes"][0].outcome == "denied"
    assert "approval.decided" in [event.event for event in await read_audit_async(store)]


def test_a_third_party_document_store_audits_and_remembers_for_the_callback_channel(
    inner: FsspecToolResultStore, ledger: Path
) -> None:
    agent = make_agent({"send_invoice": AskOncePerSession()})
    store = DelegatingStore(inner)
    asked: list[str] = []

    def approve(request: ApprovalRequest) -> Decision:
        asked.append(request.request_id)
        return Decision.approve(by="alice")

    for _ in range(2):
        agent.run([plan(INVOICE)], hook_context=offload_context(store, approval_channel=CallbackApprovals(approve)))
    assert len(asked) == 1 and len(ledger_lines(ledger)) == 2
    assert [event.event for event in read_audit(inner)] == ["approval.requested", "approval.decided"]


def test_a_store_without_documents_is_a_clear_type_error_for_the_durable_channel(agent: Agent, ledger: Path) -> None:
    with pytest.raises(TypeError, match=r"needs a documents\(\) API .* got PlainStore"):
        agent.run([plan(INVOICE)], hook_context=durable(PlainStore()))
    assert ledger_lines(ledger) == []
    for call in (pending_approvals, read_audit, ApprovalLedger, session_scope):
        with pytest.raises(TypeError, match=r"needs a documents\(\) API"):
            call(PlainStore())  # type: ignore[operator]
    with pytest.raises(TypeError, match=r"needs a documents\(\) API"):
        decide(PlainStore(), "00000001-0123456789ab-0", Decision.approve())  # type: ignore[arg-type]


def test_a_store_with_documents_but_no_tenant_or_session_is_not_a_document_store(
    inner: FsspecToolResultStore,
) -> None:
    with pytest.raises(TypeError, match="SessionDocumentSource"):
        session_scope(DocumentsOnlyStore(inner))


def test_a_store_without_documents_still_serves_the_callback_channel(ledger: Path) -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    context = offload_context(PlainStore(), approval_channel=CallbackApprovals(lambda request: True))
    reply = agent.run([plan(INVOICE)], hook_context=context)
    assert len(ledger_lines(ledger)) == 1
    assert reply["last_message"].text == "final: invoice sent to acme for 120"


def test_an_unscoped_document_store_is_refused(root: FsspecToolResultStore) -> None:
    with pytest.raises(ValueError, match="belong to one session"):
        pending_approvals(DelegatingStore(root))
    with pytest.raises(ValueError, match="belong to one session"):
        session_scope(DelegatingStore(root.for_tenant("acme")))


def test_a_resumed_context_keeps_the_resumed_scope(root: FsspecToolResultStore, inner: FsspecToolResultStore) -> None:
    # The scope is the store's tenant and session (the Protocol has no `scope`): a store without them is of another.
    store = DelegatingStore(inner)
    for same in (inner, DelegatingStore(inner), store):
        context = resume_context(store, {RESULT_STORE_CONTEXT_KEY: same}, default_channel=DurableApprovals)
        assert context[RESULT_STORE_CONTEXT_KEY] is same
    chat_2 = root.for_session("acme", "chat-2")
    for other in (chat_2, DelegatingStore(chat_2), PlainStore()):
        with pytest.raises(ValueError, match="another scope"):
            resume_context(store, {RESULT_STORE_CONTEXT_KEY: other}, default_channel=DurableApprovals)
