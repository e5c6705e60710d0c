"""
Sync and async done one way (issue 45): every sync entry point of the approvals and the read-back tools waits for its
async twin through `sync_calls.sync_twin`, so the two cannot disagree, in what they return, raise or send to S3.
"""

import ast
import asyncio
import importlib
import inspect
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from approval_scenario import make_agent, plan
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy

from haystack_integrations.offload import DurableApprovals, FsspecToolResultStore, offload_context
from haystack_integrations.offload.approvals.errors import ApprovalNotFoundError
from haystack_integrations.offload.approvals.ledger import ApprovalLedger
from haystack_integrations.offload.tools.base import ReadBackTool
from haystack_integrations.offload.tools.list_tool_results import ListToolResults

PACKAGE = Path(__file__).parents[2] / "src" / "haystack_integrations" / "offload"


def _module(name: str) -> object:
    # `approvals` exports functions named as its modules (`resume`): the module itself is imported by its path.
    return importlib.import_module(f"haystack_integrations.offload.approvals.{name}")


DERIVED: list[tuple[object, str]] = [
    (_module("decisions"), "pending_approvals"),
    (_module("decisions"), "decide"),
    (_module("resume"), "resume"),
    (_module("audit"), "append_audit"),
    (_module("audit"), "read_audit"),
    (_module("audit_repair"), "repair_audit"),
    *(
        (ApprovalLedger, name)
        for name in (
            "listing",
            "newest",
            "snapshot",
            "hold",
            "step",
            "decision",
            "create_decision",
            "remembered",
            "remember",
            "read",
        )
    ),
    (ReadBackTool, "_run"),
]

# The sync functions still written beside an async twin, and why each differs from waiting for it.
SANS_IO = "a sans-I/O reader driven by the sync driver (`tools/source.py`): the reading logic is written once"
WRITTEN_TWICE = {
    "approvals/channels.py:CallbackApprovals.ask": "how a sync run waits for a person: a thread, a timeout",
    "approvals/channels.py:StrategyApprovals.ask": "a Haystack strategy's sync `run`, as `ConfirmationHook` calls it",
    "tools/base.py:ReadBackTool._call": "Haystack's `Tool(function=...)`: it only dispatches to `_run`",
    "tools/base.py:ReadBackTool.invoke": "Haystack's `Tool.invoke`, extended",
    "tools/list_tool_results.py:PagedResults.list_page": "a Protocol's member: what a third-party store implements",
    "tools/read_tool_result.py:ReadToolResult._run": SANS_IO,
    "tools/source.py:drive": SANS_IO,
    "tools/source.py:ResultSource.open": SANS_IO,
    "tools/source.py:ResultSource.read": SANS_IO,
    "tools/source.py:RangedSource.read": SANS_IO,
    "tools/source.py:FileSource.read": SANS_IO,
    "tools/source.py:WholeSource.open": SANS_IO,
    "tools/source.py:WholeSource.read": SANS_IO,
}


@pytest.mark.parametrize(("owner", "name"), DERIVED, ids=lambda value: getattr(value, "__name__", str(value)))
def test_a_sync_entry_point_is_its_async_twin_waited_for(owner: object, name: str) -> None:
    sync, twin = getattr(owner, name), getattr(owner, f"{name}_async")
    assert inspect.iscoroutinefunction(twin) and not inspect.iscoroutinefunction(sync)
    assert getattr(sync, "__wrapped__", None) is twin, f"{name} is written by hand, not derived with sync_twin"
    assert inspect.signature(sync) == inspect.signature(twin)
    assert sync.__name__ == name
    assert inspect.cleandoc(twin.__doc__ or "") in (sync.__doc__ or "")


def test_the_listing_tool_waits_for_its_async_run() -> None:
    # Inherited: the base's derived `_run` waits for the instance's own `_run_async`.
    assert ListToolResults._run is ReadBackTool._run


def _hand_written_twins(path: Path) -> set[str]:
    """The sync functions of a module written beside an ``<name>_async`` twin instead of waiting for it."""
    found: set[str] = set()

    def visit(scope: ast.AST, prefix: str) -> None:
        body = getattr(scope, "body", [])
        asyncs = {node.name for node in body if isinstance(node, ast.AsyncFunctionDef)}
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef) and f"{node.name}_async" in asyncs:
                waits = any(
                    isinstance(call, ast.Call) and getattr(call.func, "id", None) == "run_blocking"
                    for call in ast.walk(node)
                )
                if not waits:
                    found.add(f"{path.relative_to(PACKAGE)}:{prefix}{node.name}")

    visit(ast.parse(path.read_text()), "")
    return found


def test_no_sync_body_repeats_its_async_twin() -> None:
    modules = sorted([*(PACKAGE / "approvals").glob("*.py"), *(PACKAGE / "tools").glob("*.py")])
    written = set().union(*(_hand_written_twins(path) for path in modules))
    assert written == set(WRITTEN_TWICE), sorted(written ^ set(WRITTEN_TWICE))


def test_the_twins_raise_the_same_error_for_a_missing_step(store: FsspecToolResultStore) -> None:
    session = store.for_session("acme", "chat-twins")
    with pytest.raises(ApprovalNotFoundError) as sync_error:
        ApprovalLedger(session).step(7)
    with pytest.raises(ApprovalNotFoundError) as async_error:
        asyncio.run(ApprovalLedger(session).step_async(7))
    assert str(sync_error.value) == str(async_error.value)


async def test_a_sync_entry_point_works_inside_a_running_loop(store: FsspecToolResultStore) -> None:
    # A sync Agent.run inside an async server: the twin waits in a helper thread rather than failing.
    session = store.for_session("acme", "chat-in-loop")
    assert ApprovalLedger(session).listing().names == frozenset()
    assert _module("decisions").pending_approvals(session) == []  # type: ignore[attr-defined]


def _gets(requests: Any, measure: Callable[[], object]) -> int:
    requests.clear()
    measure()
    return sum(1 for request in requests.snapshot() if request.method == "GET")


@pytest.mark.s3
def test_a_lagging_head_costs_the_sync_snapshot_what_it_costs_the_async_one_at_two_lags(
    s3_server: Any, s3_requests: Any, ledger: Path
) -> None:
    """
    The hand-written sync snapshot read a lagging head's chain one GET at a time: other requests (one GET fewer, in
    more round trips) than the async one, which reads the head's step, its done record and the next step at once. Now
    it is the async one, waited for: the same requests, growing with the lag alone.
    """
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{uuid.uuid4().hex}", storage_options=s3_server.storage_options()
    )
    session = root.for_session("acme", "chat-1")
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    approvals = session.documents("approvals")
    costs: dict[int, tuple[int, int]] = {}
    held = 1
    for lag in (1, 3):
        while held <= 1 + lag:  # each run holds the session's next step
            call = plan(("send_invoice", {"customer": "acme", "amount": held}, f"c{held}"))
            agent.run([call], hook_context=offload_context(session, approval_channel=DurableApprovals()))
            held += 1
        counted = []
        for snapshot in (lambda: ApprovalLedger(session).snapshot(), lambda: asyncio.run(_snapshot_async(session))):
            approvals.put("head.json", b'{"sequence":1}')
            counted.append(_gets(s3_requests, snapshot))
        costs[lag] = (counted[0], counted[1])
    assert costs[1][0] == costs[1][1] and costs[3][0] == costs[3][1], costs
    assert costs[3][0] - costs[1][0] == 2, costs  # one GET per step the head lags behind


async def _snapshot_async(session: FsspecToolResultStore) -> object:
    return await ApprovalLedger(session).snapshot_async()


@pytest.mark.s3
def test_a_sync_entry_point_refuses_a_store_built_on_an_asynchronous_filesystem(s3_server: Any) -> None:
    # Such a store's client belongs to the loop it was made on: a sync call has none to wait on. The store's own sync
    # API says so; the approvals' twins now ask the store too, instead of running on a loop of their own and failing
    # there ("no running event loop", an unclosed client session).
    import s3fs

    async def build() -> FsspecToolResultStore:
        filesystem = s3fs.S3FileSystem(asynchronous=True, skip_instance_cache=True, **s3_server.storage_options())
        return FsspecToolResultStore(f"{s3_server.bucket_url}/{uuid.uuid4().hex}", filesystem=filesystem)

    session = asyncio.run(build()).for_session("acme", "chat-async-fs")
    for call in (lambda: ApprovalLedger(session).listing(), lambda: _module("decisions").pending_approvals(session)):  # type: ignore[attr-defined]
        with pytest.raises(TypeError, match="asynchronous=True"):
            call()
