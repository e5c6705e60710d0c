"""
Shared parts of the operations suites: deterministic results and their digests, a scripted Agent, aged results.

The model is Haystack's `MockChatGenerator` with a `response_fn` that reads its plan from the latest user message
(``"acme/chat-1: 3x2"``: three steps of two `fetch` calls, each step also asking the small `clock` tool), so any
number of concurrent runs share one Agent without sharing a script position.
"""

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from haystack.components.agents import Agent
from haystack.components.agents.state.state import State
from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ChatRole, ToolCall
from haystack.hooks.tool_result_offloading import RESULT_STORE_CONTEXT_KEY
from haystack.tools import Tool

from haystack_integrations.offload import FsspecToolResultStore, RetryPolicy, offload_context
from haystack_integrations.offload.stores.names import new_object_name
from haystack_integrations.offload.testing.faults import FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server

OFFLOADED = "tool_result_offloaded"
# A short read timeout so that a withheld answer costs a second, not s3fs's default 15. No fault delays a connect, so
# connecting may take as long as an attempt: a 1 s limit was outlasted on a loaded CI machine (a "connect timeout"
# where the test counted only the 503s it injected).
CLIENT_CONFIG = {"read_timeout": 0.5, "connect_timeout": 3}
# Quick backoff: the suites check what is retried and how often, not how long it waits.
# Short waits, but timeouts with room for a loaded machine (CI runs the suite in parallel on 2 cores): a request that
# merely took long there must not count as one more failure, or the exact retry counts the tests assert would drift.
FAST_RETRY = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, attempt_timeout=3.0)


class Roots(NamedTuple):
    """The same prefix seen through the fault proxy (``faulty``) and directly (``direct``)."""

    faulty: FsspecToolResultStore
    direct: FsspecToolResultStore


def proxied_options(s3_server: LocalS3Server, proxy: FaultProxy, *, read_timeout: float = 1.5) -> dict[str, Any]:
    """The server's storage options, pointed at the fault proxy, with short client timeouts."""
    config = {**CLIENT_CONFIG, "read_timeout": read_timeout}
    return {**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url, "config_kwargs": config}


def page(query: str, lines: int = 60) -> str:
    """A deterministic result (about 5 KB at 60 lines) whose every line names the query that produced it."""
    seal = hashlib.sha256(query.encode()).hexdigest()[:16]
    return "\n".join(f"{query} line {i} {seal} " + "lorem ipsum dolor " * 3 for i in range(lines))


def digest(content: str | bytes) -> str:
    data = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
    return hashlib.sha256(data).hexdigest()


def fetch(query: str) -> str:
    return page(query)


def clock(query: str) -> str:
    return f"12:00 for {query}"


def _tool(name: str, function: Any) -> Tool:
    return Tool(
        name=name,
        description=f"The {name} tool.",
        parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        function=function,
    )


def plan_for(label: str, steps: int, calls: int) -> str:
    return f"{label}: {steps}x{calls}"


def originals(label: str, steps: int, calls: int) -> list[str]:
    """Every tool result the scripted run of `label` produces, in order."""
    produced = []
    for step in range(steps):
        produced += [fetch(f"{label} step {step} call {call}") for call in range(calls)]
        produced.append(clock(f"{label} step {step}"))
    return produced


def script(messages: list[ChatMessage]) -> ChatMessage:
    user_index = max(i for i, message in enumerate(messages) if message.is_from(ChatRole.USER))
    label, _, shape = (messages[user_index].text or "").partition(": ")
    steps, calls = (int(part) for part in shape.split("x"))
    done = sum(1 for message in messages[user_index + 1 :] if message.tool_calls)
    if done >= steps:
        return ChatMessage.from_assistant(f"{label}: finished after {done} steps")
    tool_calls = [
        ToolCall(tool_name="fetch", arguments={"query": f"{label} step {done} call {call}"}, id=f"call_{done}_{call}")
        for call in range(calls)
    ]
    tool_calls.append(ToolCall(tool_name="clock", arguments={"query": f"{label} step {done}"}, id=f"clock_{done}"))
    return ChatMessage.from_assistant(tool_calls=tool_calls)


def make_agent(hooks: dict[str, list[Any]], *, max_steps: int = 30) -> Agent:
    agent = Agent(
        chat_generator=MockChatGenerator(response_fn=script),
        tools=[_tool("fetch", fetch), _tool("clock", clock)],
        hooks=hooks,  # type: ignore[arg-type]
        max_agent_steps=max_steps,
    )
    agent.warm_up()
    return agent


def tool_results(result: dict[str, Any]) -> list[ChatMessage]:
    return [message for message in result["messages"] if message.tool_call_result is not None]


def store_of(hook_context: dict[str, Any]) -> FsspecToolResultStore:
    store = hook_context[RESULT_STORE_CONTEXT_KEY]
    assert isinstance(store, FsspecToolResultStore)
    return store


def put_aged(store: FsspecToolResultStore, *, age: timedelta, content: str, key: str = "old.txt") -> str:
    """
    Store a text result whose name says it was written `age` ago, and return its reference.

    It goes straight through the store's filesystem, named exactly as `write` names results, by a writer whose clock
    is `age` behind: the storage's own clock says it was written just now, and that is what decides a result's age
    wherever its name says it is old (retention, purges). Quotas and listings go by the name.
    """
    name = new_object_name(key=key, kind="text", tool_name="fetch", now=datetime.now(UTC) - age)
    fs = store._handle.io().fs
    fs.makedirs(store._scope_path(), exist_ok=True)  # local disk needs the directory; object stores ignore it
    fs.pipe_file(f"{store._scope_path()}/{name}", content.encode())
    return name


def state_for(store: FsspecToolResultStore) -> State:
    """A State carrying `store` in `hook_context`, as the Agent builds it for a tool call."""
    return State(schema={"hook_context": {"type": dict}}, data={"hook_context": offload_context(store)})


def retries_since(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What a store's retry counters gained between two readings."""
    causes = {cause: count - before["causes"].get(cause, 0) for cause, count in after["causes"].items()}
    return {
        **{name: after[name] - before[name] for name in ("retries", "recovered", "gave_up")},
        "causes": {cause: count for cause, count in causes.items() if count},
    }
