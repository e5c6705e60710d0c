"""
How a run asks a person: the channel arrives per run in `hook_context`, never in the hook.

`CallbackApprovals` asks in-process through a callback and waits; `DurableApprovals` records the pending requests in
the session's store and stops the run, for `decide` and `resume` to continue later from any process.
"""

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from haystack.hooks.human_in_the_loop import ConfirmationUIResult, ToolExecutionDecision

from haystack_integrations.offload.approvals.approval_records import ApprovalRequest, Decision
from haystack_integrations.offload.approvals.errors import InvalidApprovalEditError
from haystack_integrations.offload.context import APPROVAL_CHANNEL_KEY as APPROVAL_CHANNEL_KEY
from haystack_integrations.offload.sync_calls import run_blocking

APPROVAL_REQUIRED = "approval_required"
"""The run's ``exit_reason`` when `DurableApprovals` stopped it to wait for decisions."""

Answer = Decision | ConfirmationUIResult | ToolExecutionDecision | bool
"""What a callback may return: a `Decision`, Haystack's UI result or decision, or a plain True (approve) / False."""

ApprovalCallback = Callable[[ApprovalRequest], Answer | Awaitable[Answer]]


class CallbackApprovals:
    """
    Ask in process: call `callback(request)` and wait for its answer, at most `timeout` seconds.

    ```python
    from haystack_integrations.offload import CallbackApprovals, Decision, offload_context

    async def ask(request):
        await websocket.send_json({"approve?": request.tool_name, "arguments": request.arguments})
        reply = await websocket.receive_json()
        return Decision.approve(by=user.id) if reply["ok"] else Decision.deny(reply.get("why"), by=user.id)

    context = offload_context(store, approval_channel=CallbackApprovals(ask, timeout=120))
    reply = await agent.run_async(messages, hook_context=context)
    ```

    The callback may be sync or async; a sync callback runs in its own daemon thread so a person who never answers
    cannot block the event loop or the process's exit. A callback that raises fails the run (the error propagates):
    a broken channel must not look like a person's denial.

    Multi-user use: build one per run (it is cheap); it is never stored in the hook, so `Agent.to_dict()` is
    unaffected.
    """

    def __init__(self, callback: ApprovalCallback, *, timeout: float = 300.0, actor: str | None = None) -> None:
        """
        :param callback: Receives an `ApprovalRequest`; returns (or resolves to) a `Decision`, a Haystack
            `ConfirmationUIResult` / `ToolExecutionDecision`, or a bool.
        :param timeout: Seconds to wait for an answer; then the call is denied as `approval-expired`.
        :param actor: Who the run acts for, recorded in the audit.
        :raises TypeError: If `callback` is not callable.
        :raises ValueError: If `timeout` is not positive.
        """
        if not callable(callback):
            raise TypeError(f"CallbackApprovals needs a callable, got {type(callback).__name__}.")
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}.")
        self.callback = callback
        self.timeout = float(timeout)
        self.actor = actor

    def ask(self, request: ApprovalRequest) -> Decision | None:
        """
        Ask and wait (for sync runs).

        :param request: The call to decide.
        :returns: The decision, or None if the timeout passed first.
        :raises Exception: Whatever the callback raised.
        """
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._call_in_thread(request, lambda answer, error: _settle(future, answer, error))
        try:
            answer = future.result(self.timeout)  # the callback's error, handed over by its thread, is raised here
        except TimeoutError:
            return None
        return to_decision(answer, request)

    async def ask_async(self, request: ApprovalRequest) -> Decision | None:
        """
        Ask and wait without blocking the event loop (for async runs).

        :param request: The call to decide.
        :returns: The decision, or None if the timeout passed first.
        :raises Exception: Whatever the callback raised.
        """
        if inspect.iscoroutinefunction(self.callback):
            try:
                answer = await asyncio.wait_for(self.callback(request), self.timeout)
            except TimeoutError:
                return None
            return to_decision(answer, request)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def deliver(answer: Any, error: BaseException | None) -> None:
            # RuntimeError: the loop has closed, because the run stopped waiting (its timeout passed) and is gone.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, answer, error)

        self._call_in_thread(request, deliver)
        try:
            answer = await asyncio.wait_for(future, self.timeout)
        except TimeoutError:
            return None
        return to_decision(answer, request)

    def _call_in_thread(self, request: ApprovalRequest, deliver: Callable[[Any, BaseException | None], None]) -> None:
        """
        Run the callback in a daemon thread of its own (a person who never answers blocks neither the event loop nor
        the process's exit), awaiting what it returns if that is awaitable; its answer or error goes to `deliver`.
        """

        def call() -> None:
            try:
                answer = self.callback(request)
                if inspect.isawaitable(answer):
                    answer = run_blocking(_awaited, answer)
            except BaseException as error:  # handed to the waiting caller, which raises it
                deliver(None, error)
            else:
                deliver(answer, None)

        threading.Thread(target=call, name="approval-callback", daemon=True).start()


class DurableApprovals:
    """
    Ask across requests and workers: record the pending requests in the session's store and stop the run.

    ```python
    from haystack_integrations.offload import DurableApprovals, offload_context, pending_approvals

    reply = await agent.run_async(messages, hook_context=offload_context(store, approval_channel=DurableApprovals()))
    if reply["exit_reason"] == "approval_required":
        return {"pending": [request.model_dump(mode="json") for request in await pending_approvals_async(store)]}
    ```

    The run's store must be session-scoped (`FsspecToolResultStore.for_session`). Later, any worker records decisions
    with `decide` and continues the conversation with `resume`.
    """

    def __init__(self, *, ttl: float = 24 * 3600.0, actor: str | None = None) -> None:
        """
        :param ttl: Seconds a request can be decided; an undecided request that expires reaches the model as an
            `approval-expired` error result when the step is resumed.
        :param actor: Who the run acts for, recorded on the requests and in the audit.
        :raises ValueError: If `ttl` is negative.
        """
        if ttl < 0:
            raise ValueError(f"ttl must be zero or more seconds, got {ttl}.")
        self.ttl = float(ttl)
        self.actor = actor


class StrategyApprovals:
    """
    Ask through the hook's Haystack `ConfirmationStrategy` rules, as `ConfirmationHook` does: the channel an
    `ApprovalHook` built from strategies uses when the run brings none (a console, a single-user script).

    The run's `hook_context` is passed to each strategy as its ``confirmation_strategy_context``.
    """

    actor: str | None = None
    timeout = 0.0

    def __init__(self, strategies: Callable[[str], Any], context: dict[str, Any] | None) -> None:
        """
        :param strategies: Finds the strategy for a tool name.
        :param context: The run's `hook_context`.
        """
        self.strategies = strategies
        self.context = context

    def _arguments(self, request: ApprovalRequest) -> dict[str, Any]:
        return {**strategy_input(request), "confirmation_strategy_context": self.context}

    def ask(self, request: ApprovalRequest) -> Decision:
        """
        Run the strategy for the request's tool and wait for its decision.

        :param request: The call to decide.
        :returns: The decision.
        """
        strategy = self.strategies(request.tool_name)
        return to_decision(strategy.run(**self._arguments(request)), request)

    async def ask_async(self, request: ApprovalRequest) -> Decision:
        """Async `ask`: the strategy's ``run_async`` if it has one, else its ``run`` in a worker thread."""
        strategy = self.strategies(request.tool_name)
        run_async = getattr(strategy, "run_async", None)
        if callable(run_async):
            answer = await run_async(**self._arguments(request))
        else:
            answer = await asyncio.to_thread(strategy.run, **self._arguments(request))
        return to_decision(answer, request)


ApprovalChannel = CallbackApprovals | DurableApprovals | StrategyApprovals


def strategy_input(request: ApprovalRequest) -> dict[str, Any]:
    """What a Haystack `ConfirmationStrategy` is asked about a call (as `ConfirmationHook` asks, and traces, it)."""
    return {
        "tool_name": request.tool_name,
        "tool_description": request.tool_description,
        "tool_params": dict(request.arguments),
        "tool_call_id": request.tool_call_id,
    }


def channel_from(hook_context: object) -> ApprovalChannel | None:
    """
    Return the run's approval channel.

    :param hook_context: The run's `hook_context`.
    :returns: The channel, or None if the run brought none.
    :raises TypeError: If `hook_context` is not a dict or the channel is of an unknown type.
    """
    if hook_context is None:
        return None
    if not isinstance(hook_context, dict):
        raise TypeError(f"hook_context must be a dictionary, got {type(hook_context).__name__}.")
    channel = hook_context.get(APPROVAL_CHANNEL_KEY)
    if channel is None or isinstance(channel, CallbackApprovals | DurableApprovals):
        return channel
    raise TypeError(
        f"hook_context[{APPROVAL_CHANNEL_KEY!r}] must be CallbackApprovals or DurableApprovals, "
        f"got {type(channel).__name__}."
    )


def to_decision(answer: object, request: ApprovalRequest) -> Decision:
    """
    Normalize a callback's answer into a `Decision`.

    :param answer: A `Decision`, a Haystack `ConfirmationUIResult` (``confirm`` / ``reject`` / ``modify``) or
        `ToolExecutionDecision`, or a bool.
    :param request: The request answered (a Haystack decision for another call or tool is refused).
    :returns: The decision.
    :raises InvalidApprovalEditError: If the answer cannot be understood or names another tool or call.
    """
    if isinstance(answer, Decision):
        return answer
    if isinstance(answer, bool):
        return Decision(approved=answer)
    if isinstance(answer, ConfirmationUIResult):
        if answer.action == "confirm":
            return Decision.approve()
        if answer.action == "reject":
            return Decision.deny(answer.feedback)
        if answer.action == "modify":
            return Decision.approve(answer.new_tool_params, reason=answer.feedback)
        raise InvalidApprovalEditError(f"Unknown confirmation action {answer.action!r}: use confirm, reject or modify.")
    if isinstance(answer, ToolExecutionDecision):
        if answer.tool_call_id is not None and answer.tool_call_id != request.tool_call_id:
            raise InvalidApprovalEditError("The decision is for another tool call.")
        if not answer.execute:
            return Decision(approved=False, reason=answer.feedback, tool_name=answer.tool_name)
        edited = answer.final_tool_params if answer.final_tool_params != request.arguments else None
        return Decision(approved=True, arguments=edited, reason=answer.feedback, tool_name=answer.tool_name)
    raise InvalidApprovalEditError(
        f"An approval callback must return a Decision, ConfirmationUIResult, ToolExecutionDecision or bool, "
        f"got {type(answer).__name__}."
    )


async def _awaited(answer: Awaitable[Any]) -> Any:
    return await answer


def _settle(
    future: "asyncio.Future[Any] | concurrent.futures.Future[Any]", answer: Any, error: BaseException | None
) -> None:
    if future.done():  # the waiter timed out and went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(answer)
