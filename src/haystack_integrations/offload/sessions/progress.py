"""
A turn's progress as it happens: what the run is doing, for a client that asked to watch (server-sent events).

One `TurnProgress` per request that asks for a stream, fed by Haystack's streaming callback and the progress hooks,
which find it in ``hook_context[PROGRESS_CONTEXT_KEY]``. Publishing never waits.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from haystack.components.agents.state.state import State
from haystack.core.serialization import default_from_dict, default_to_dict
from haystack.dataclasses import ChatMessage, StreamingChunk, ToolCall, ToolCallResult

from haystack_integrations.offload.compat import last_assistant_index
from haystack_integrations.offload.hooks.pointers import OFFLOADED_META_KEY

PROGRESS_CONTEXT_KEY = "offload.progress"
"""The `hook_context` key of the run's `TurnProgress`."""

DEFAULT_MAX_EVENTS = 256
"""Progress events held for a reader before newer ones are dropped (a turn makes a few per tool call)."""
MAX_ARGUMENTS_SUMMARY = 120
MAX_ARGUMENT_VALUE = 40


@dataclass(frozen=True)
class ProgressEvent:
    """
    One thing a run did: `kind` names it (the SSE event name), `data` says what (JSON-ready).

    Kinds: ``turn`` (``turn``), ``tool_call`` (``tool_call_id``, ``tool_name``, ``arguments``: a short summary),
    ``tool_result`` (``tool_call_id``, ``tool_name``, ``error``, ``size`` in bytes), ``offloaded`` (``tool_call_id``,
    ``tool_name``, ``references``, ``size``), ``approval_requested`` (``request_id``, ``tool_call_id``, ``tool_name``,
    ``arguments``), ``reply`` (no data).
    """

    kind: str
    data: dict[str, Any] = field(default_factory=dict)


class TurnProgress:
    """
    The publisher of one turn's progress: a bounded queue between the run and the one reader that asked for it.

    ```python
    progress = TurnProgress()
    turn = asyncio.create_task(service.send_message(store, "Chart revenue", progress=progress))
    async for event in progress.follow(turn):
        print(event.kind, event.data)        # tool_call, tool_result, offloaded, reply ...
    outcome = turn.result()
    ```

    Made and used on one event loop (the request's): the run's hooks and Haystack's async streaming callback run there.
    """

    def __init__(self, *, max_events: int = DEFAULT_MAX_EVENTS, keepalive: float = 15.0) -> None:
        """
        :param max_events: Events held for a slow reader; newer ones are dropped (and counted) past this.
        :param keepalive: Seconds `follow` waits for an event before it yields None, so the stream can send a comment
            that keeps proxies from closing an idle connection (and notices a client that is gone).
        """
        self._queue: asyncio.Queue[ProgressEvent] = asyncio.Queue(max_events)
        self.keepalive = keepalive
        self.dropped = 0
        """Events dropped because the reader was behind."""
        self.started = asyncio.Event()
        """Set when the turn was claimed: errors before it are the request's (409, 422), after it the stream's."""
        self._replying = False
        self._sizes: dict[str, int] = {}
        self._running: set[str] = set()

    # Publishing (from the run)

    def publish(self, kind: str, **data: Any) -> None:
        """
        Queue an event for the reader, or drop it (and count it) if the reader is too far behind. Never waits.

        :param kind: The event's kind.
        :param data: What it says (JSON-ready values).
        """
        try:
            self._queue.put_nowait(ProgressEvent(kind, data))
        except asyncio.QueueFull:
            self.dropped += 1

    def turn_started(self, turn: int) -> None:
        """
        Tell the reader the turn was claimed and the run begins.

        :param turn: The turn's number in the session.
        """
        self.publish("turn", turn=turn)
        self.started.set()

    async def on_chunk(self, chunk: StreamingChunk) -> None:
        """
        Haystack's streaming callback: the model's text and the tools' results, as the Agent streams them.

        :param chunk: A chunk from the chat generator, or a tool result from the Agent's tool invoker.
        """
        result = chunk.tool_call_result
        if result is not None:
            self.tool_result(result)
            return
        if chunk.content and not self._replying:
            self._replying = True
            self.publish("reply")
        if chunk.finish_reason is not None:
            self._replying = False  # the next model call's text is a new reply

    def tool_call(self, call: ToolCall) -> None:
        """
        Announce a call about to run.

        :param call: The call, with the arguments it runs with.
        """
        self._running.add(call.id or "")
        self.publish("tool_call", **_call_fields(call), arguments=summarize_arguments(call.arguments))

    def tool_result(self, result: ToolCallResult) -> None:
        """
        Announce a tool's result (its size is kept for the ``offloaded`` event).

        :param result: The result, as the tool returned it (before any offload).
        """
        call_id = result.origin.id or ""
        self._running.discard(call_id)
        size = result_size(result.result)
        self._sizes[call_id] = size
        self.publish("tool_result", **_call_fields(result.origin), error=bool(result.error), size=size)

    def unreported(self, tool_call_id: str | None) -> bool:
        """
        Whether a call was announced (``tool_call``) and its result not yet (``tool_result``).

        :param tool_call_id: The call's id.
        :returns: True while the call's result is still to be told.
        """
        return (tool_call_id or "") in self._running

    def size_of(self, tool_call_id: str | None) -> int | None:
        """
        The size of a result this run's tools returned, as the streaming callback saw it (before any offload).

        :param tool_call_id: The call's id.
        :returns: Its size in bytes, or None if it was not seen.
        """
        return self._sizes.get(tool_call_id or "")

    # Reading (from the stream)

    async def follow(self, turn: "asyncio.Future[Any]") -> AsyncIterator[ProgressEvent | None]:
        """
        Yield the turn's events as they come, and None after each `keepalive` without one, until the turn is done.

        Events published up to the turn's end are all yielded (those not dropped); the turn's outcome is left to the
        caller (``turn.result()``).

        :param turn: The task running the turn.
        :yields: Events, and None for "still running".
        """
        while not turn.done():
            getting = asyncio.ensure_future(self._queue.get())
            try:
                await asyncio.wait({getting, turn}, timeout=self.keepalive, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getting.done():
                    getting.cancel()
            if getting.done() and not getting.cancelled():
                yield getting.result()
            elif not turn.done():
                yield None
        while not self._queue.empty():
            yield self._queue.get_nowait()


# What the run's hooks publish


def run_progress(state: State) -> TurnProgress | None:
    """
    The run's publisher, if its client asked to watch.

    :param state: The Agent's live `State` (read through ``state.data``: ``state.get`` deep-copies).
    :returns: The `TurnProgress` in the run's `hook_context`, or None.
    """
    hook_context = state.data.get("hook_context")
    found = hook_context.get(PROGRESS_CONTEXT_KEY) if isinstance(hook_context, Mapping) else None
    return found if isinstance(found, TurnProgress) else None


class _ProgressHook:
    """
    What the progress hooks share: each finds the run's `TurnProgress` and announces from the step's messages.

    Stateless, with nothing to configure: one instance serves every run, and ``run_async`` is ``run`` (no I/O).
    """

    def run(self, state: State) -> None:
        """
        Announce what this hook tells, if the run's client asked to watch.

        :param state: The Agent's live `State`.
        """
        progress = run_progress(state)
        if progress is not None:
            self._announce(progress, state.data.get("messages") or [])

    async def run_async(self, state: State) -> None:
        """
        The same as `run`: publishing never waits.

        :param state: The Agent's live `State`.
        """
        self.run(state)

    def _announce(self, progress: TurnProgress, messages: list[ChatMessage]) -> None:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """Serialize the hook (it has no settings)."""
        return default_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Deserialize the hook."""
        return default_from_dict(cls, data)


class ToolCallProgressHook(_ProgressHook):
    """
    A ``before_tool`` hook that announces the calls about to run, to the run's `TurnProgress` (if it has one).

    Register it after the approval hooks: calls they hold or deny are not announced, and edited calls are announced
    with the arguments they run with. Stateless: one instance serves every run.
    """

    allowed_hook_points = ("before_tool",)

    def _announce(self, progress: TurnProgress, messages: list[ChatMessage]) -> None:
        # This step's calls that will run.
        position = last_assistant_index(messages=messages)
        if position < 0 or not messages[position].tool_calls:
            return  # a held step: the service announces its approval requests
        # Denied calls already have their error result.
        answered = {m.tool_call_result.origin.id for m in _step_results(messages) if m.tool_call_result is not None}
        for call in messages[position].tool_calls:
            if call.id is None or call.id not in answered:
                progress.tool_call(call)


class ToolResultProgressHook(_ProgressHook):
    """
    An ``after_tool`` hook that announces this step's results the streaming callback did not, to the run's
    `TurnProgress`.

    The Agent's tool invoker tells the callback each result as it returns, so in a plain run this finds nothing left to
    announce. A call approved after a stop runs in `resume_async` (the held step is finished outside the Agent's run,
    then the run continues), which has no callback to tell: this hook tells its result, once, with its size before any
    offload. Only announced calls (``tool_call``) are told, so denied calls stay silent as in a plain run. Register it
    before the offload hook. Stateless: one instance serves every run.
    """

    allowed_hook_points = ("after_tool",)

    def _announce(self, progress: TurnProgress, messages: list[ChatMessage]) -> None:
        # The step's results not yet told.
        for message in _step_results(messages):
            result = message.tool_call_result
            if result is not None and progress.unreported(result.origin.id):
                progress.tool_result(result)


class OffloadProgressHook(_ProgressHook):
    """
    An ``after_tool`` hook that announces this step's results written to the store, to the run's `TurnProgress`.

    Register it after the offload hook. With write-behind offload the upload may still be in flight when this is
    published; a write that fails puts the result back, and the turn's ``new_results`` (in its final answer) is what
    was stored. Stateless: one instance serves every run.
    """

    allowed_hook_points = ("after_tool",)

    def _announce(self, progress: TurnProgress, messages: list[ChatMessage]) -> None:
        # The step's offloaded results.
        for message in _step_results(messages):
            references = message.meta.get(OFFLOADED_META_KEY)
            result = message.tool_call_result
            if not references or result is None:
                continue
            shown = [str(reference) for reference in references]
            progress.publish(
                "offloaded", **_call_fields(result.origin), references=shown, size=progress.size_of(result.origin.id)
            )


def _step_results(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The tool results after the newest assistant message: this step's."""
    position = last_assistant_index(messages=messages)
    return messages[position + 1 :] if position >= 0 else []


# Small, JSON-ready descriptions


def _call_fields(call: ToolCall) -> dict[str, Any]:
    """What every event about a call names: the call's id and its tool."""
    return {"tool_call_id": call.id, "tool_name": call.tool_name}


def summarize_arguments(arguments: Mapping[str, Any]) -> str:
    """
    Tool arguments as a person reads them in one line: ``customer=Initech, amount=250``, shortened.

    :param arguments: The call's arguments.
    :returns: At most `MAX_ARGUMENTS_SUMMARY` characters.
    """
    parts = []
    for name, value in arguments.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        parts.append(f"{name}={_shortened(shown, MAX_ARGUMENT_VALUE)}")
    return _shortened(", ".join(parts), MAX_ARGUMENTS_SUMMARY)


def result_size(result: Any) -> int:
    """
    A tool result's size in bytes: UTF-8 text, and the decoded bytes of image or file blocks.

    :param result: A `ToolCallResult`'s ``result``: a string or a list of content blocks.
    :returns: The size.
    """
    if isinstance(result, str):
        return len(result.encode("utf-8", "surrogatepass"))
    total = 0
    for block in result if isinstance(result, list) else []:
        text = getattr(block, "text", None)
        encoded = getattr(block, "base64_image", None) or getattr(block, "base64_data", None)
        if isinstance(text, str):
            total += len(text.encode("utf-8", "surrogatepass"))
        elif isinstance(encoded, str):
            total += len(encoded) * 3 // 4 - encoded.count("=", -2)
    return total


def _shortened(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
