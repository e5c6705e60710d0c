"""Run many tenants' sessions concurrently through one shared Agent, then check where every result went."""

import asyncio
import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage
from haystack.hooks.tool_result_offloading import NeverOffload, OffloadOverChars, ToolResultOffloadHook

from haystack_integrations.offload.constants import READ_BACK_TOOL_NAMES
from haystack_integrations.offload.context import offload_context
from haystack_integrations.offload.demo.model import scripted_generator
from haystack_integrations.offload.demo.tools import DEMO_TOOLS, TOOL_FUNCTIONS
from haystack_integrations.offload.errors import InvalidReferenceError, ResultNotFoundError
from haystack_integrations.offload.stores import FsspecToolResultStore

DEFAULT_TENANTS = ("acme", "globex", "initech")


@dataclass
class SessionOutcome:
    """What one session's run produced and what the checks found."""

    tenant: str
    session: str
    results_offloaded: int = 0
    bytes_stored: int = 0
    context_chars_saved: int = 0
    checks_passed: int = 0
    failures: list[str] = field(default_factory=list)


@dataclass
class DemoReport:
    """Everything the demo did, per session, with the root it wrote under."""

    store_url: str
    outcomes: list[SessionOutcome]

    @property
    def ok(self) -> bool:
        """Whether every check in every session passed."""
        return all(not outcome.failures for outcome in self.outcomes)

    def by_tenant(self) -> dict[str, list[SessionOutcome]]:
        """Group the outcomes by tenant, in first-seen order."""
        grouped: dict[str, list[SessionOutcome]] = {}
        for outcome in self.outcomes:
            grouped.setdefault(outcome.tenant, []).append(outcome)
        return grouped


def build_demo_agent() -> Agent:
    """
    Build the one Agent every tenant's runs share: scripted model, demo tools, Haystack's offload hook.

    The hook's constructor store is a throwaway: every run brings its own session store in `hook_context`.

    :returns: A warmed-up Agent.
    """
    strategies: dict[str | tuple[str, ...], Any] = {"*": OffloadOverChars(4000)}
    strategies.update({name: NeverOffload() for name in READ_BACK_TOOL_NAMES})
    hook = ToolResultOffloadHook(
        store=FsspecToolResultStore("memory://offload-demo-unused"), offload_strategies=strategies
    )
    agent = Agent(chat_generator=scripted_generator(), tools=list(DEMO_TOOLS), hooks={"after_tool": [hook]})
    agent.warm_up()
    return agent


def _originals(tenant: str, session: str) -> dict[str, str]:
    """The full results each tool returned in this session's run, recomputed for the byte-for-byte check."""
    return {tool.name: TOOL_FUNCTIONS[tool.name](**_arguments(tool.name, tenant, session)) for tool in DEMO_TOOLS}


def _arguments(tool_name: str, tenant: str, session: str) -> dict[str, str]:
    return {"query": _question(tenant, session)} if tool_name == "web_search" else {"table": "invoices"}


def _question(tenant: str, session: str) -> str:
    return f"{tenant} {session} market overview"


async def _run_session(
    agent: Agent, root: FsspecToolResultStore, tenant: str, session: str
) -> tuple[SessionOutcome, list[str]]:
    store = root.for_session(tenant, session)
    result = await agent.run_async(
        [ChatMessage.from_user(_question(tenant, session))], hook_context=offload_context(store)
    )
    outcome = SessionOutcome(tenant=tenant, session=session)
    references: list[str] = []
    originals = _originals(tenant, session)
    for message in result["messages"]:
        tool_result = message.tool_call_result
        if tool_result is None:
            continue
        written = message.meta.get("tool_result_offloaded") or []
        if not written:
            continue
        original = originals[tool_result.origin.tool_name]
        for reference in written:
            stored = await store.read_async(reference)
            outcome.results_offloaded += 1
            outcome.bytes_stored += len(stored.encode() if isinstance(stored, str) else stored)
            outcome.context_chars_saved += len(original) - len(tool_result.result)
            references.append(reference)
            if stored == original:
                outcome.checks_passed += 1
            else:
                outcome.failures.append(f"{reference}: stored content differs from the tool's result")
    if outcome.results_offloaded == 0:
        outcome.failures.append("no result was offloaded")
    return outcome, references


async def _check_isolation(
    root: FsspecToolResultStore, outcome: SessionOutcome, references: list[str], others: list[SessionOutcome]
) -> None:
    """Every other session must fail to read this session's references, by name and by crafted paths."""
    for other in others:
        intruder = root.for_session(other.tenant, other.session)
        for reference in references:
            for attempt in (
                reference,
                f"{outcome.tenant}/{outcome.session}/{reference}",
                f"../../{outcome.tenant}/{outcome.session}/{reference}",
            ):
                try:
                    await intruder.read_async(attempt)
                except (ResultNotFoundError, InvalidReferenceError):
                    outcome.checks_passed += 1
                else:
                    outcome.failures.append(f"{other.tenant}/{other.session} could read {attempt!r}")


async def run_demo_async(
    store_url: str,
    *,
    storage_options: dict[str, Any] | None = None,
    tenants: tuple[str, ...] = DEFAULT_TENANTS,
    sessions_per_tenant: int = 4,
    on_session_done: Callable[[SessionOutcome], None] | None = None,
) -> DemoReport:
    """
    Run every tenant's sessions concurrently on one shared Agent, then verify contents and isolation.

    :param store_url: Root URL of the store (a local directory, ``memory://...`` or ``s3://bucket/prefix``).
    :param storage_options: fsspec options for the store (e.g. an S3 endpoint).
    :param tenants: Tenant ids.
    :param sessions_per_tenant: Concurrent chat sessions per tenant.
    :param on_session_done: Called as each session's run finishes (for progress output).
    :returns: The report.
    """
    root = FsspecToolResultStore(store_url, storage_options=storage_options)
    await root.warm_up_async()
    agent = build_demo_agent()
    run_id = uuid.uuid4().hex[:8]
    plan = [(tenant, f"chat-{run_id}-{n}") for tenant in tenants for n in range(1, sessions_per_tenant + 1)]

    async def run_one(tenant: str, session: str) -> tuple[SessionOutcome, list[str]]:
        outcome, references = await _run_session(agent, root, tenant, session)
        if on_session_done is not None:
            on_session_done(outcome)
        return outcome, references

    runs = await asyncio.gather(*(run_one(tenant, session) for tenant, session in plan))
    outcomes = [outcome for outcome, _ in runs]
    for outcome, references in runs:
        # One session of every other tenant, and a sibling session of the same tenant.
        others = [o for o in outcomes if o.tenant != outcome.tenant and o.session.endswith("-1")]
        others += [o for o in outcomes if o.tenant == outcome.tenant and o.session != outcome.session][:1]
        await _check_isolation(root, outcome, references, others)
    return DemoReport(store_url=store_url, outcomes=outcomes)


def run_demo(store_url: str, **kwargs: Any) -> DemoReport:
    """
    Synchronous entry point for `run_demo_async`.

    :param store_url: Root URL of the store.
    :param kwargs: Passed to `run_demo_async`.
    :returns: The report.
    """
    return asyncio.run(run_demo_async(store_url, **kwargs))


def digest(text: str | bytes) -> str:
    """Short content digest used in the demo's output."""
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()[:12]
