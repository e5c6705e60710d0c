"""
Exit aborts: how often a program that used the default engine (obstore) on S3 dies at exit instead of exiting 0.

Each run is a fresh interpreter that does what a user's script does and then returns from its main module: no
``os._exit``, no explicit close. Three programs:

- ``plain``: write one result to ``s3://`` and read it back;
- ``write-behind``: the same through ``OffloadHook(write_behind=True)`` on a real Haystack Agent run (the upload
  finishes behind the run, and the script exits right after);
- ``agent``: a Haystack Agent (``MockChatGenerator``) with `OffloadHook`, `OffloadCompactionHook` and the read-back
  tools, one tool call whose result is offloaded and then read back.

A run counts as an abort when the process ends on a signal (SIGABRT, SIGSEGV, SIGBUS) or with any other non-zero
status. Runs go two at a time (both cores busy, as under load), against moto's S3 server in a process of its own.

    PYTHONPATH=src python benchmarks/exit_aborts.py --runs 500 --program plain
    PYTHONPATH=src python benchmarks/exit_aborts.py --runs 200 --program plain --without-exit-wait   # the control
"""

import argparse
import collections
import concurrent.futures
import json
import signal
import subprocess
import sys
import textwrap
import time
import uuid

from haystack_integrations.offload.testing.local_s3 import LocalS3Server

PROGRAMS = {
    "plain": """
        from haystack_integrations.offload import FsspecToolResultStore

        store = FsspecToolResultStore(URL, storage_options=OPTIONS).for_session("acme", SESSION)
        reference = store.write(key="a.txt", content="hello " * 100)
        assert store.read(reference) == "hello " * 100
    """,
    "write-behind": """
        from haystack.components.agents import Agent
        from haystack.components.generators.chat.mock import MockChatGenerator
        from haystack.dataclasses import ChatMessage, ToolCall
        from haystack.hooks.tool_result_offloading import OffloadOverChars
        from haystack.tools import Tool

        from haystack_integrations.offload import FsspecToolResultStore, OffloadHook, offload_context

        def script(messages):
            if messages[-1].tool_call_result is None:
                return ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="fetch", arguments={}, id="c1")])
            return ChatMessage.from_assistant("done")

        fetch = Tool(name="fetch", description="Fetch.", parameters={"type": "object", "properties": {}},
                     function=lambda: "x" * 20_000)
        agent = Agent(chat_generator=MockChatGenerator(response_fn=script), tools=[fetch],
                      hooks={"after_tool": [OffloadHook({"*": OffloadOverChars(1000)}, write_behind=True)]})
        agent.warm_up()
        store = FsspecToolResultStore(URL, storage_options=OPTIONS).for_session("acme", SESSION)
        agent.run([ChatMessage.from_user("go")], hook_context=offload_context(store))
    """,
    "agent": """
        from haystack.components.agents import Agent
        from haystack.components.generators.chat.mock import MockChatGenerator
        from haystack.dataclasses import ChatMessage, ToolCall
        from haystack.hooks.tool_result_offloading import OffloadOverChars
        from haystack.tools import Tool

        from haystack_integrations.offload import (
            FsspecToolResultStore, OffloadCompactionHook, OffloadHook, offload_context, read_tool_result,
        )

        def script(messages):
            results = [m.tool_call_result for m in messages if m.tool_call_result is not None]
            if not results:
                return ChatMessage.from_assistant(tool_calls=[ToolCall(tool_name="fetch", arguments={}, id="c1")])
            if len(results) == 1:
                reference = results[0].result.split("'")[1] if "'" in results[0].result else "missing"
                call = ToolCall(tool_name="read_tool_result", arguments={"reference": reference}, id="c2")
                return ChatMessage.from_assistant(tool_calls=[call])
            return ChatMessage.from_assistant("done")

        fetch = Tool(name="fetch", description="Fetch.", parameters={"type": "object", "properties": {}},
                     function=lambda: "x" * 20_000)
        agent = Agent(
            chat_generator=MockChatGenerator(response_fn=script),
            tools=[fetch, read_tool_result],
            hooks={
                "after_tool": [OffloadHook({"*": OffloadOverChars(1000)})],
                "before_llm": [OffloadCompactionHook(context_window=128_000)],
            },
        )
        agent.warm_up()
        store = FsspecToolResultStore(URL, storage_options=OPTIONS).for_session("acme", SESSION)
        reply = agent.run([ChatMessage.from_user("go")], hook_context=offload_context(store))
        assert reply["last_message"].text == "done", reply["last_message"]
        assert not reply["messages"][-2].tool_call_result.error, reply["messages"][-2]  # the read-back worked
    """,
}


# The control: the same program with the library's exit wait (`stores.exit_wait`) taken back, as before the fix.
WITHOUT_EXIT_WAIT = """
import atexit
from haystack_integrations.offload.stores import exit_wait
atexit.unregister(exit_wait.wait_for_foreign_threads)
"""


def _program(name: str, url: str, options: dict[str, object], *, exit_wait: bool) -> str:
    header = f"URL, OPTIONS, SESSION = {url!r}, {json.dumps(options)}, __import__('sys').argv[1]\n"
    return header + textwrap.dedent(PROGRAMS[name]) + ("" if exit_wait else WITHOUT_EXIT_WAIT)


def _run_once(code: str) -> tuple[int, str]:
    done = subprocess.run(  # noqa: S603 - this interpreter on a program built here
        [sys.executable, "-c", code, uuid.uuid4().hex], capture_output=True, text=True, timeout=120, check=False
    )
    return done.returncode, done.stderr[-400:]


def _outcome(returncode: int) -> str:
    if returncode == 0:
        return "exit 0"
    if returncode < 0:
        return signal.Signals(-returncode).name
    return f"exit {returncode}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--program", choices=sorted(PROGRAMS), default="plain")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (default: %(default)s)")
    parser.add_argument(
        "--without-exit-wait", action="store_true", help="the control: take the library's exit wait back"
    )
    args = parser.parse_args()
    with LocalS3Server() as server:
        url = f"{server.bucket_url}/exit-aborts"
        code = _program(args.program, url, server.storage_options(), exit_wait=not args.without_exit_wait)
        outcomes: collections.Counter[str] = collections.Counter()
        examples: dict[str, str] = {}
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            for returncode, stderr in pool.map(lambda _: _run_once(code), range(args.runs)):
                outcome = _outcome(returncode)
                outcomes[outcome] += 1
                examples.setdefault(outcome, stderr)
    wall = time.monotonic() - started
    aborts = args.runs - outcomes["exit 0"]
    version = ".".join(map(str, sys.version_info[:3]))
    program = f"{args.program}, exit wait taken back" if args.without_exit_wait else args.program
    print(f"| {program} | Python {version} | {args.runs} | {aborts} | {dict(outcomes)} | {wall:.0f} s |")
    for outcome, stderr in examples.items():
        if outcome != "exit 0":
            print(f"{outcome}: {stderr.strip()}", file=sys.stderr)
    return 0 if aborts == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
