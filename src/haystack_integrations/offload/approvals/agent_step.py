"""
Running a held step's calls as the Agent runs a step, and continuing its conversation as the Agent would.

The one place that depends on the private Haystack functions the Agent runs tools with (through `compat`).
"""

from typing import Any

from haystack.components.agents import Agent
from haystack.components.agents.state.state import State
from haystack.components.agents.state.state_utils import replace_values
from haystack.dataclasses import ChatMessage, ToolCall
from haystack.hooks.protocol import AFTER_TOOL, BEFORE_TOOL
from haystack.tools import flatten_tools_or_toolsets
from haystack.tools.tool import Tool

from haystack_integrations.offload.compat import run_hooks_async as _run_hooks_async
from haystack_integrations.offload.compat import run_tool_async as _run_tool_async
from haystack_integrations.offload.hooks.write_behind import settle_run

# Running the calls as the Agent runs a step: its ``before_tool`` hooks, its tool executor, its ``after_tool`` hooks.
# The one place that depends on the private Haystack functions the Agent runs tools with (through `compat`).


def run_tools(agent: Agent, selection: Any) -> list[Tool]:
    """
    The tools a resumed run uses: the Agent's, or the run's ``tools=`` selection (tools or names of the Agent's tools).

    :param agent: The Agent.
    :param selection: The ``tools`` argument the caller passes to the run, or None.
    :returns: The flat list of tools.
    """
    if selection is None:
        return flatten_tools_or_toolsets(agent.tools)
    if isinstance(selection, list) and all(isinstance(name, str) for name in selection):
        known = {tool.name: tool for tool in flatten_tools_or_toolsets(agent.tools)}
        return [known[name] for name in selection if name in known]
    return flatten_tools_or_toolsets(selection)


def resumed_state(
    agent: Agent,
    messages: list[ChatMessage],
    *,
    tools: list[Tool],
    hook_context: dict[str, Any],
    values: dict[str, Any],
) -> State:
    """
    A `State` like the one the Agent builds for a step, for running the resumed calls and ``after_tool`` hooks.

    :param agent: The Agent.
    :param messages: The conversation so far (without the held step).
    :param tools: The run's tools.
    :param hook_context: The run's `hook_context`.
    :param values: The caller's run keyword arguments; those named in the Agent's ``state_schema`` seed the state.
    :returns: The state.
    """
    state = State(
        schema=agent.resolved_state_schema,
        data={key: value for key, value in values.items() if key in agent.state_schema},
    )
    state.set("messages", list(messages))
    state.set("step_count", 0)
    state.set("token_usage", {})
    state.set("context_tokens", 0)
    state.set("tool_call_counts", {tool.name: 0 for tool in tools})
    state.set("exit_reason", None)
    state.set("continue_run", False)
    state.set("tools", tools)
    state.set("hook_context", hook_context)
    return state


async def execute_async(agent: Agent, calls: list[ToolCall], state: State) -> list[ChatMessage]:
    """
    Run `calls` as the Agent would in one step.

    :param agent: The Agent (its ``raise_on_tool_invocation_failure`` and ``tool_concurrency_limit`` apply).
    :param calls: The calls to run, with their final arguments.
    :param state: The resumed state; tools read from and write to it.
    :returns: One tool message per call, in the order of `calls`.
    """
    if not calls:
        return []
    messages, _ = await _run_tool_async(
        messages=[ChatMessage.from_assistant(tool_calls=calls)],
        state=state,
        tools=state.data["tools"],
        raise_on_failure=agent.raise_on_tool_invocation_failure,
        max_workers=agent.tool_concurrency_limit,
    )
    _count(state, calls)
    return _in_call_order(calls, messages)


async def before_tool_async(agent: Agent, state: State) -> None:
    """
    Run the Agent's whole ``before_tool`` chain over the state, as the Agent does before it runs a step's calls.

    :param agent: The Agent.
    :param state: The resumed state, ending with the held message; hooks may rewrite it or stop the run.
    """
    await _run_hooks_async(hooks=agent.hooks, hook_point=BEFORE_TOOL, state=state)


async def after_tool_async(agent: Agent, state: State, conversation: list[ChatMessage]) -> list[ChatMessage]:
    """
    Run the Agent's ``after_tool`` hooks over the resumed conversation and return it as they left it.

    Uploads a write-behind `OffloadHook` started are waited for, as at the end of a run.

    :param agent: The Agent.
    :param state: The resumed state.
    :param conversation: The conversation ending with the held step and its results.
    :returns: The conversation after the hooks (e.g. with large results offloaded).
    """
    state.set("messages", conversation, handler_override=replace_values)
    await _run_hooks_async(hooks=agent.hooks, hook_point=AFTER_TOOL, state=state)
    # A resume is a run of its own with no after_run: settle here, so every pointer returned names a stored result.
    await settle_run(state, wait=True)
    return list(state.data["messages"])


def _count(state: State, calls: list[ToolCall]) -> None:
    counts = dict(state.data.get("tool_call_counts") or {})
    for call in calls:
        counts[call.tool_name] = counts.get(call.tool_name, 0) + 1
    state.set("tool_call_counts", counts, handler_override=replace_values)


def _in_call_order(calls: list[ToolCall], messages: list[ChatMessage]) -> list[ChatMessage]:
    # The executor puts unknown-tool errors first; match each result to its call by identity to restore the order.
    ordered: list[ChatMessage] = []
    for call in calls:
        for message in messages:
            result = message.tool_call_result
            if result is not None and result.origin is call:
                ordered.append(message)
                break
        else:  # pragma: no cover - the executor answers every call it is given
            raise RuntimeError(f"The tool executor returned no result for the call to {call.tool_name!r}.")
    return ordered


def continuing_agent(agent: Agent) -> Agent:
    """
    The Agent that continues the conversation: the same one, minus its prompts.

    An Agent renders its ``system_prompt`` before, and its ``user_prompt`` after, the messages of every run. The
    conversation resume hands over already starts with the system prompt and holds the user's turn, so rendering them
    again would duplicate both; a clone without prompts (same generator, tools and hooks) continues it as it is.
    """
    if agent.system_prompt is None and agent.user_prompt is None:
        return agent
    return agent.clone(system_prompt=None, user_prompt=None, required_variables=None)


def exit_condition(agent: Agent, assistant: ChatMessage | None, results: list[ChatMessage]) -> str | None:
    """The Agent's own rule: an exit-condition tool that ran without error ends the run (any errored one cancels)."""
    if agent.exit_conditions == ["text"] or assistant is None:
        return None
    errored = {
        message.tool_call_result.origin.tool_name
        for message in results
        if message.tool_call_result is not None and message.tool_call_result.error
    }
    found = None
    for call in assistant.tool_calls:
        if call.tool_name in agent.exit_conditions:
            if call.tool_name in errored:
                return None
            found = found or call.tool_name
    return found
