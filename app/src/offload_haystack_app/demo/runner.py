"""
Run many tenants' chat sessions concurrently through the reference server's own code, then check every outcome.

The checks: stored results match their tools byte for byte, approved invoices ran exactly once and denied ones
never, and no session sees another's results, approvals, conversation or audit.
"""

import asyncio
import base64
import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from haystack.dataclasses import ChatMessage

from haystack_integrations.offload import InvalidReferenceError, ResultNotFoundError, StorageError
from haystack_integrations.offload.approvals import ApprovalRequest
from haystack_integrations.offload.hooks import COMPACTION_META_KEY, OFFLOADED_META_KEY
from haystack_integrations.offload.sessions import ChatService, NotFoundError, TurnOutcome
from haystack_integrations.offload.stores import FsspecToolResultStore, validate_scope_id
from offload_haystack_app.demo.scripted_model import SCRIPTED_CONTEXT_WINDOW, scripted_generator
from offload_haystack_app.demo.tools import expected_blocks, invoice_number
from offload_haystack_app.server.agent import build_agent

DEFAULT_TENANTS = ("acme", "globex", "initech")
STEPS = ("research", "logs", "invoice", "decision", "read back")
"""The steps of one session, for progress reporting."""
_TOPICS = ("solar panels", "heat pumps", "battery storage", "wind farms", "grid tariffs", "smart meters")
_CUSTOMERS = ("Initrode", "Umbrella Corp", "Hooli", "Vandelay Industries", "Soylent", "Cyberdyne")

ProgressCallback = Callable[[str, str, str], None]
"""Called with ``(tenant, session, step)`` as each step of a session finishes."""


@dataclass
class SessionOutcome:
    """What one session's conversation produced and what the checks found."""

    tenant: str
    session: str
    results_offloaded: int = 0
    results_compacted: int = 0
    bytes_stored: int = 0
    context_chars_saved: int = 0
    approvals_asked: int = 0
    approvals_granted: int = 0
    isolation_checks: int = 0
    checks_passed: int = 0
    failures: list[str] = field(default_factory=list)
    # Kept for the isolation checks, which run once every session has finished.
    references: list[str] = field(default_factory=list)
    request_ids: list[str] = field(default_factory=list)
    marker: str = ""
    """The session's own token (`session_marker`): in its conversation and results, in no other session's."""

    def check(self, passed: bool, failure: str, *, isolation: bool = False) -> None:
        """
        Count one check.

        :param passed: Whether it passed.
        :param failure: What to report if it did not.
        :param isolation: Whether it is an isolation check.
        """
        if not passed:
            self.failures.append(failure)
        elif isolation:
            self.isolation_checks += 1
        else:
            self.checks_passed += 1


@dataclass
class DemoReport:
    """Everything the demo did, per session, with the root it wrote under."""

    store_url: str
    outcomes: list[SessionOutcome]

    @property
    def ok(self) -> bool:
        """Whether every check in every session passed."""
        return all(not outcome.failures for outcome in self.outcomes)

    @property
    def failures(self) -> list[str]:
        """Every check that failed, as ``tenant/session: what failed``."""
        return [f"{o.tenant}/{o.session}: {failure}" for o in self.outcomes for failure in o.failures]

    def by_tenant(self) -> dict[str, list[SessionOutcome]]:
        """Group the outcomes by tenant, in first-seen order."""
        grouped: dict[str, list[SessionOutcome]] = {}
        for outcome in self.outcomes:
            grouped.setdefault(outcome.tenant, []).append(outcome)
        return grouped

    def tenant_figures(self) -> list[dict[str, Any]]:
        """
        Each tenant's sessions added up, in first-seen order: what ``offload-haystack demo`` shows per tenant.

        :returns: Per tenant, JSON-ready: ``tenant``, ``sessions``, every count of `SessionOutcome` summed (its
            check counts as ``isolation_checks_passed`` and ``other_checks_passed``), and ``failures`` by session.
        """
        counts = [outcome_field.name for outcome_field in fields(SessionOutcome) if outcome_field.type is int]
        return [
            {
                "tenant": tenant,
                "sessions": len(outcomes),
                **{_SHOWN_AS.get(name, name): sum(getattr(o, name) for o in outcomes) for name in counts},
                "failures": [f"{o.session}: {failure}" for o in outcomes for failure in o.failures],
            }
            for tenant, outcomes in self.by_tenant().items()
        ]


# What `DemoReport.tenant_figures` calls the counts of `SessionOutcome` whose own names do not say what they count.
_SHOWN_AS = {"isolation_checks": "isolation_checks_passed", "checks_passed": "other_checks_passed"}


def session_marker(tenant: str, session: str) -> str:
    """
    The token that marks one session's content, so that finding it anywhere else means a leak.

    24 hex digits of SHA-256 over ``tenant/session`` (ids never contain ``/``, so different sessions hash different
    strings; a collision is a 96-bit accident). Hex digits spell none of the words the scripted model reacts to, and
    the brackets keep a marker from matching inside any other text.

    :param tenant: The tenant id.
    :param session: The session id.
    :returns: A token like ``[case 3f9a0c...]``.
    """
    digest = hashlib.sha256(f"{tenant}/{session}".encode()).hexdigest()[:24]
    return f"[case {digest}]"


def build_demo_service() -> ChatService:
    """
    The service every tenant's sessions share: the server's Agent with the scripted model, labelled as scripted.

    :returns: The service.
    """
    agent = build_agent(scripted_generator(), context_window=SCRIPTED_CONTEXT_WINDOW)
    return ChatService(agent, worker="offload-haystack-demo")


async def _run_session(
    service: ChatService,
    root: FsspecToolResultStore,
    tenant: str,
    session: str,
    number: int,
    progress: ProgressCallback | None,
) -> SessionOutcome:
    outcome = SessionOutcome(tenant=tenant, session=session, marker=session_marker(tenant, session))
    try:
        await _converse(service, root.for_session(tenant, session), outcome, number, progress)
    except Exception as error:  # one broken session is reported with the others' results, not instead of them
        outcome.failures.append(f"the session failed: {type(error).__name__}: {error}")
    return outcome


async def _converse(
    service: ChatService,
    store: FsspecToolResultStore,
    outcome: SessionOutcome,
    number: int,
    progress: ProgressCallback | None,
) -> None:
    tenant, session = outcome.tenant, outcome.session
    # The topic repeats every few sessions; the marker makes the question, and the search results, this session's own.
    topic = f"{_TOPICS[number % len(_TOPICS)]} {outcome.marker}"
    actor = f"{tenant}/demo-user"

    def done(step: str) -> None:
        if progress is not None:
            progress(tenant, session, step)

    research = await service.send_message(
        store, f"Research {topic}, dump the invoices table and chart revenue", actor=actor
    )
    outcome.check(
        research.status == "completed" and len(research.new_references) == 4,
        f"research: expected 4 offloaded blocks, got {len(research.new_references)}",
    )
    done("research")
    logs = await service.send_message(store, "Check the logs of billing, search and payroll", actor=actor)
    outcome.check(
        logs.status == "completed" and not logs.new_references, "logs: expected a completed turn, nothing offloaded"
    )
    done("logs")

    customer, amount = _CUSTOMERS[number % len(_CUSTOMERS)], 100 + 50 * number
    invoice = await service.send_message(store, f"Send an invoice to {customer} for {amount} EUR", actor=actor)
    outcome.check(
        invoice.status == "approval_required" and len(invoice.pending) == 1,
        f"invoice: expected one pending approval, got {invoice.status} with {len(invoice.pending)}",
    )
    outcome.approvals_asked += len(invoice.pending)
    done("invoice")
    for request in invoice.pending:
        await _decide(service, store, outcome, request, number, customer, amount, actor)
    done("decision")

    read_back = await service.send_message(store, 'Read back the search results for "result 7"', actor=actor)
    outcome.check(
        read_back.status == "completed" and "result 7" in (read_back.reply or ""),
        "read back: the model did not find 'result 7' in its own offloaded search results",
    )
    done("read back")
    await _check_contents(service, store, outcome)


async def _decide(
    service: ChatService,
    store: FsspecToolResultStore,
    outcome: SessionOutcome,
    request: ApprovalRequest,
    number: int,
    customer: str,
    amount: int,
    actor: str,
) -> None:
    outcome.request_ids.append(request.request_id)
    mode = ("deny", "approve", "edit")[number % 3]
    edited = {"customer": customer, "amount": amount // 2} if mode == "edit" else None
    decided = await service.decide(
        store,
        request.request_id,
        approved=mode != "deny",
        arguments=edited,
        reason="Over this month's budget." if mode == "deny" else None,
        actor=actor,
    )
    resumed: TurnOutcome | None = decided.resumed
    outcome.check(resumed is not None and resumed.status == "completed", "decision: the conversation did not resume")
    reply = resumed.reply if resumed is not None else ""
    events = [event for event in await service.audit(store) if event.request_id == request.request_id]
    executed = [event for event in events if event.event == "approval.executed"]
    if mode == "deny":
        outcome.check(
            not executed and "did not run" in (reply or ""), "decision: a denied invoice ran, or the model was not told"
        )
        return
    outcome.approvals_granted += 1
    final_amount = amount // 2 if mode == "edit" else amount
    outcome.check(
        len(executed) == 1 and invoice_number(customer, final_amount) in (reply or ""),
        f"decision: the approved invoice ran {len(executed)} time(s), or with other arguments than approved",
    )


async def _check_contents(service: ChatService, store: FsspecToolResultStore, outcome: SessionOutcome) -> None:
    """Every stored result is referenced by the conversation and equals its tool's output, byte for byte."""
    transcript = await service.transcript(store)
    expected: dict[str, str | bytes] = {}
    for message in transcript.messages:
        references = list(message.meta.get(OFFLOADED_META_KEY) or [])
        result = message.tool_call_result
        if result is None or not references:
            continue
        blocks = expected_blocks(result.origin.tool_name, result.origin.arguments)
        for reference, block in zip(references, blocks, strict=False):
            expected[reference] = block
        outcome.context_chars_saved += _payload_chars(blocks) - len(str(result.result))
        if COMPACTION_META_KEY in message.meta:
            outcome.results_compacted += len(references)
    stored = await service.results(store)
    outcome.results_offloaded = len(stored)
    outcome.bytes_stored = sum(record.size for record in stored)
    outcome.references = [record.reference for record in stored]
    outcome.check(bool(stored), "no result was offloaded")
    outcome.check(outcome.results_compacted > 0, "compaction never offloaded an older result")
    marked = False
    for record in stored:
        content = await store.read_async(record.reference)
        outcome.check(
            record.reference in expected and content == expected[record.reference],
            f"{record.reference}: stored content differs from what the tool returned",
        )
        marked = marked or _carries(content, outcome.marker)
    # Without these two, a marker that never reached the store would let every isolation check pass unseen.
    outcome.check(
        any(outcome.marker in _message_text(message) for message in transcript.messages),
        f"the conversation does not carry the session's marker {outcome.marker}",
    )
    outcome.check(marked, f"no stored result carries the session's marker {outcome.marker}")


def _message_text(message: ChatMessage) -> str:
    # Everything a message holds (text, tool calls and their arguments, tool results, meta), not only its text.
    return json.dumps(message.to_dict(), ensure_ascii=False, default=str)


def _carries(content: str | bytes, marker: str) -> bool:
    return marker.encode() in content if isinstance(content, bytes) else marker in content


def _payload_chars(blocks: list[str | bytes]) -> int:
    # What the result would occupy in the conversation: text as is, images as their base64.
    return sum(len(block) if isinstance(block, str) else len(base64.b64encode(block)) for block in blocks)


async def _gone_reference(scratch: FsspecToolResultStore) -> str:
    """
    A well-formed reference that names nothing anywhere: a result written to a session of its own, then deleted.

    :param scratch: A session no demo conversation uses.
    :returns: The deleted result's reference.
    """
    reference = await scratch.write_async(key="never-read.txt", content="gone", tool_name="web_search")
    await scratch.delete_async(reference)
    return reference


async def _check_isolation(
    service: ChatService,
    root: FsspecToolResultStore,
    outcome: SessionOutcome,
    intruders: list[tuple[str, str]],
    gone: str,
) -> None:
    """
    Other sessions (another tenant's with the same id, a sibling of the same tenant) see nothing of this one.

    :param gone: A reference that names nothing (`_gone_reference`): what a request for this session's results must
        look like from another session.
    """
    victim = f"{outcome.tenant}/{outcome.session}"
    for tenant, session in intruders:
        intruder = root.for_session(tenant, session)
        who = f"{tenant}/{session}"
        missing = await _not_found_message(service.read_page(intruder, gone))
        for reference in outcome.references:
            refused = await _not_found_message(service.read_page(intruder, reference))
            outcome.check(
                refused is not None and refused == missing,
                f"{who} could read {victim}'s {reference}, or its refusal differs from a missing result's",
                isolation=True,
            )
            for crafted in (f"{victim}/{reference}", f"../../{victim}/{reference}", f"..%2F..%2F{victim}/{reference}"):
                try:
                    await intruder.read_async(crafted)
                except (InvalidReferenceError, ResultNotFoundError):
                    outcome.check(True, "", isolation=True)
                else:
                    outcome.check(False, f"{who} read {victim}'s result through {crafted!r}", isolation=True)
        intruder_results = await service.results(intruder)
        listed = {record.reference for record in intruder_results}
        outcome.check(not listed & set(outcome.references), f"{who} lists {victim}'s results", isolation=True)
        for record in intruder_results:
            content = await intruder.read_async(record.reference)
            outcome.check(
                not _carries(content, outcome.marker),
                f"{who}'s result {record.reference} holds {victim}'s content",
                isolation=True,
            )
        for request_id in outcome.request_ids:
            refused = await _not_found_message(service.decide(intruder, request_id, approved=True, actor=who))
            outcome.check(refused is not None, f"{who} could decide {victim}'s approval {request_id}", isolation=True)
            audit = await service.audit(intruder)
            outcome.check(
                all(event.request_id != request_id for event in audit),
                f"{who}'s audit shows {victim}'s approval",
                isolation=True,
            )
        transcript = await service.transcript(intruder)
        outcome.check(
            all(outcome.marker not in _message_text(message) for message in transcript.messages),
            f"{who}'s conversation contains {victim}'s messages",
            isolation=True,
        )


async def _not_found_message(call: Any) -> str | None:
    """The service's not-found message, or None when it answered anything else (as it does for what it found)."""
    try:
        await call
    except NotFoundError as error:
        return str(error)
    except StorageError:
        raise  # the store failed: reported as a failed check run, not as a leak
    except Exception:  # "already decided", "expired", "invalid": each says the thing exists in this scope
        return None
    return None


def demo_sessions(tenants: tuple[str, ...], sessions_per_tenant: int, run_id: str) -> list[str]:
    """
    Check the demo's tenants and session count, and name its sessions: ``chat-<run_id>-1`` and on.

    Every tenant uses the same session ids, so the isolation checks can try another tenant's *same-named* session.

    :param tenants: Tenant ids.
    :param sessions_per_tenant: Sessions per tenant.
    :param run_id: The run's id.
    :returns: The session ids.
    :raises ValueError: If there are no tenants or sessions, a tenant is repeated, or an id is invalid.
    """
    if not tenants or sessions_per_tenant < 1:
        raise ValueError("The demo needs at least one tenant and one session per tenant.")
    if len(set(tenants)) != len(tenants):
        raise ValueError(f"Each tenant may appear once, got {', '.join(tenants)}.")
    sessions = [f"chat-{run_id}-{n}" for n in range(1, sessions_per_tenant + 1)]
    for tenant in tenants:
        validate_scope_id(tenant, field="tenant")
    for session in sessions:
        validate_scope_id(session, field="session")
    return sessions


async def run_demo_async(
    store_url: str,
    *,
    storage_options: dict[str, Any] | None = None,
    tenants: tuple[str, ...] = DEFAULT_TENANTS,
    sessions_per_tenant: int = 4,
    on_progress: ProgressCallback | None = None,
    run_id: str | None = None,
) -> DemoReport:
    """
    Run every tenant's sessions concurrently on one shared Agent, then verify contents, approvals and isolation.

    :param store_url: Root URL of the store (a local directory, ``memory://...`` or ``s3://bucket/prefix``).
    :param storage_options: fsspec options for the store (e.g. an S3 endpoint).
    :param tenants: Tenant ids.
    :param sessions_per_tenant: Concurrent chat sessions per tenant.
    :param on_progress: Called as each step of each session finishes (for progress output).
    :param run_id: Names this run's sessions ``chat-<run_id>-<n>``; random by default, so runs never share sessions.
    :returns: The report.
    :raises ValueError: If there are no tenants or sessions, a tenant is repeated, or an id is invalid.
    :raises StorageError: If the store cannot be listed (a missing bucket, a bad endpoint).
    :raises StoragePermissionError: If the store refuses the credentials.
    """
    run_id = run_id if run_id is not None else uuid.uuid4().hex[:8]
    # Fail on a bad id before any session runs, rather than in the middle of the concurrent runs.
    sessions = demo_sessions(tenants, sessions_per_tenant, run_id)
    root = FsspecToolResultStore(store_url, storage_options=storage_options)
    await root.warm_up_async()
    # One LIST up front: a missing bucket or refused credentials fail here, clearly, not in every session at once.
    await root.for_tenant(tenants[0]).list_async(limit=1)
    service = build_demo_service()
    plan = [(tenant, session, number) for tenant in tenants for number, session in enumerate(sessions, start=1)]
    outcomes = list(
        await asyncio.gather(
            *(_run_session(service, root, tenant, session, number, on_progress) for tenant, session, number in plan)
        )
    )
    # Written and deleted once per run, in a session of its own: two requests, whatever the number of sessions.
    gone = await _gone_reference(root.for_session(tenants[0], f"chat-{run_id}-scratch"))
    for outcome in outcomes:
        intruders = [(tenant, outcome.session) for tenant in tenants if tenant != outcome.tenant]
        intruders += [(outcome.tenant, session) for session in sessions if session != outcome.session][:1]
        try:
            await _check_isolation(service, root, outcome, intruders, gone)
        except Exception as error:  # a broken intruder session fails the check instead of ending the demo
            outcome.failures.append(f"the isolation checks failed: {type(error).__name__}: {error}")
    return DemoReport(store_url=store_url, outcomes=outcomes)


def run_demo(store_url: str, **kwargs: Any) -> DemoReport:
    """
    Synchronous entry point for `run_demo_async`.

    :param store_url: Root URL of the store.
    :param kwargs: Passed to `run_demo_async`.
    :returns: The report.
    """
    return asyncio.run(run_demo_async(store_url, **kwargs))
