"""
The one Agent the reference server (and the demo) shares between every tenant and session.

It is the library's target setup, nothing demo-specific in the hooks: offload after tools, compaction before the model,
approval before side effects, read-back tools for the model, and the progress hooks that tell a watching client what
the run does (they do nothing for runs that bring no `TurnProgress`). The chat generator is the caller's choice: the
scripted `MockChatGenerator` by default, or any OpenAI-compatible endpoint.
"""

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

from haystack.components.agents import Agent
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy
from haystack.hooks.tool_result_offloading import AlwaysOffload, OffloadOverChars
from haystack.tools.tool import Tool

from haystack_integrations.offload import ApprovalHook
from haystack_integrations.offload.hooks import OffloadCompactionHook, OffloadHook
from haystack_integrations.offload.sessions import (
    OffloadProgressHook,
    ToolCallProgressHook,
    ToolResultProgressHook,
)
from haystack_integrations.offload.tools import list_tool_results, read_tool_result
from offload_haystack_app.server.demo_tools import APPROVAL_TOOL_NAMES, DEMO_TOOLS

DEFAULT_OFFLOAD_OVER_CHARS = 4000
DEFAULT_CONTEXT_WINDOW = 128_000


def build_agent(
    chat_generator: Any,
    *,
    offload_over_chars: int = DEFAULT_OFFLOAD_OVER_CHARS,
    context_window: int = DEFAULT_CONTEXT_WINDOW,
    max_agent_steps: int = 20,
    tool_delay: float = 0.0,
) -> Agent:
    """
    Build the shared Agent: demo tools and read-back tools, with the offload, compaction and approval hooks.

    Results over `offload_over_chars` characters go to the run's store, charts always do (the model can read an image
    back with `read_tool_result`); `send_invoice` always asks a person first. Every run brings its store and approval
    channel in ``hook_context``; the hooks keep nothing between runs.

    ```python
    from offload_haystack_app.server.scripted_model import scripted_generator
    from offload_haystack_app.server.agent import build_agent

    agent = build_agent(scripted_generator())          # once, at start-up; shared by every request
    ```

    :param chat_generator: The chat generator (any Haystack chat generator).
    :param offload_over_chars: Offload results longer than this.
    :param context_window: The model's context window in tokens, for compaction.
    :param max_agent_steps: The most model calls one request may make.
    :param tool_delay: Seconds each demo tool takes before it answers (default 0): the scripted tools answer at once,
        so a demo sets this to watch a turn's progress live in the page. The read-back tools are never slowed.
    :returns: The Agent, warmed up.
    """
    # Write-behind: a step's uploads overlap the next model call; the after_run registration waits for them.
    offload = OffloadHook(
        {"*": OffloadOverChars(offload_over_chars), "render_chart": AlwaysOffload()}, write_behind=True
    )
    agent = Agent(
        chat_generator=chat_generator,
        tools=[*(_slowed(tool, tool_delay) for tool in DEMO_TOOLS), read_tool_result, list_tool_results],
        hooks={
            # The progress hooks come after the hooks whose work they report (offloaded results, approved calls), but
            # results the streaming callback did not see (calls `resume` ran) are told before they are offloaded.
            "after_tool": [ToolResultProgressHook(), offload, OffloadProgressHook()],
            "before_llm": [OffloadCompactionHook(context_window=context_window)],
            "before_tool": [ApprovalHook({APPROVAL_TOOL_NAMES: AlwaysAskPolicy()}), ToolCallProgressHook()],
            "after_run": [offload],
        },
        max_agent_steps=max_agent_steps,
    )
    agent.warm_up()
    return agent


def _slowed(tool: Tool, delay: float) -> Tool:
    """`tool`, taking `delay` seconds longer (in the thread Haystack runs sync tools in: the loop never waits)."""
    if delay <= 0 or tool.function is None:
        return tool
    function: Callable[..., Any] = tool.function

    @functools.wraps(function)
    def slowed(*args: Any, **kwargs: Any) -> Any:
        time.sleep(delay)
        return function(*args, **kwargs)

    return dataclasses.replace(tool, function=slowed)
