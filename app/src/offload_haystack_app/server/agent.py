"""
The one Agent the reference server (and the demo) shares between every tenant and session.

It is the library's target setup, nothing demo-specific in the hooks: offload after tools, compaction before the model,
approval before side effects, read-back tools for the model, and the progress hooks that tell a watching client what
the run does (they do nothing for runs that bring no `TurnProgress`). The chat generator and the tools are the
caller's choice: the demo's scripted model and tools (`offload_haystack_app.demo`) until a team brings its own.
"""

import dataclasses
import functools
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from haystack.components.agents import Agent
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy
from haystack.hooks.tool_result_offloading import AlwaysOffload, OffloadOverChars, OffloadPolicy
from haystack.tools.tool import Tool

from haystack_integrations.offload import ApprovalHook
from haystack_integrations.offload.hooks import OffloadCompactionHook, OffloadHook
from haystack_integrations.offload.sessions import (
    OffloadProgressHook,
    ToolCallProgressHook,
    ToolResultProgressHook,
)
from haystack_integrations.offload.tools import list_tool_results, read_tool_result
from offload_haystack_app.demo.tools import ALWAYS_OFFLOADED_TOOL_NAMES, APPROVAL_TOOL_NAMES, DEMO_TOOLS

DEFAULT_OFFLOAD_OVER_CHARS = 4000
DEFAULT_CONTEXT_WINDOW = 128_000


def build_agent(
    chat_generator: Any,
    *,
    tools: Sequence[Tool] | None = None,
    ask_first: Collection[str] | None = None,
    always_offload: Collection[str] | None = None,
    offload_over_chars: int = DEFAULT_OFFLOAD_OVER_CHARS,
    context_window: int = DEFAULT_CONTEXT_WINDOW,
    max_agent_steps: int = 20,
    tool_delay: float = 0.0,
) -> Agent:
    """
    Build the shared Agent: your tools and the read-back tools, with the offload, compaction and approval hooks.

    Results over `offload_over_chars` characters go to the run's store, the `always_offload` tools' always do (the
    model can read an image back with `read_tool_result`); the `ask_first` tools ask a person before every call. Every
    run brings its store and approval channel in ``hook_context``; the hooks keep nothing between runs.

    ```python
    from offload_haystack_app.demo.scripted_model import scripted_generator
    from offload_haystack_app.server.agent import build_agent

    agent = build_agent(scripted_generator())          # once, at start-up; shared by every request
    agent = build_agent(my_generator, tools=[web_search, send_invoice], ask_first=["send_invoice"])  # your own
    ```

    :param chat_generator: The chat generator (any Haystack chat generator).
    :param tools: The tools the model may call; `read_tool_result` and `list_tool_results` are added. Default: the
        demo's (`offload_haystack_app.demo.tools.DEMO_TOOLS`), which the scripted model calls.
    :param ask_first: Names of the tools that ask a person before each call. Default: the demo's (``send_invoice``)
        with the demo's tools, none with tools of your own.
    :param always_offload: Names of the tools whose results are always offloaded, whatever their size (images, for
        one). Default: the demo's (``render_chart``) with the demo's tools, none with tools of your own.
    :param offload_over_chars: Offload results longer than this.
    :param context_window: The model's context window in tokens, for compaction.
    :param max_agent_steps: The most model calls one request may make.
    :param tool_delay: Seconds each of `tools` takes before it answers (default 0): the scripted tools answer at once,
        so a demo sets this to watch a turn's progress live in the page. The read-back tools are never slowed.
    :returns: The Agent, warmed up.
    """
    demo = tools is None
    served = DEMO_TOOLS if tools is None else tools
    if ask_first is None:
        ask_first = APPROVAL_TOOL_NAMES if demo else ()
    if always_offload is None:
        always_offload = ALWAYS_OFFLOADED_TOOL_NAMES if demo else ()
    policies: dict[str | tuple[str, ...], OffloadPolicy] = {"*": OffloadOverChars(offload_over_chars)}
    policies.update({name: AlwaysOffload() for name in always_offload})
    # Write-behind: a step's uploads overlap the next model call; the after_run registration waits for them.
    offload = OffloadHook(policies, write_behind=True)
    # With no tool to ask about, the hook asks nothing: it stays so that adding a rule later changes nothing else.
    approval = ApprovalHook({tuple(ask_first): AlwaysAskPolicy()} if ask_first else {})
    agent = Agent(
        chat_generator=chat_generator,
        tools=[
            *(_slowed(tool, tool_delay) for tool in served),
            read_tool_result,
            list_tool_results,
        ],
        hooks={
            # The progress hooks come after the hooks whose work they report (offloaded results, approved calls), but
            # results the streaming callback did not see (calls `resume` ran) are told before they are offloaded.
            "after_tool": [ToolResultProgressHook(), offload, OffloadProgressHook()],
            "before_llm": [OffloadCompactionHook(context_window=context_window)],
            "before_tool": [approval, ToolCallProgressHook()],
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
