"""
A worker process for the approval tests: decides or resumes against a shared store, as a server's workers would.

It reads one JSON command per line on stdin and answers one JSON line on stdout. A resume is two-phase, so a test can
line several workers up before letting them race: ``{"op": "prepare", ...}`` builds everything and answers
``{"status": "ready"}``; ``{"op": "go"}`` resumes and answers ``resumed`` (with the final answer) or ``claimed``.
Run as ``python approval_worker.py`` with ``src``, this directory and ``tests`` on ``PYTHONPATH``.
"""

import asyncio
import json
import sys
from typing import Any

from approval_scenario import make_agent
from haystack.dataclasses import ChatMessage
from haystack.hooks.human_in_the_loop import AlwaysAskPolicy

from haystack_integrations.offload import (
    Decision,
    FsspecToolResultStore,
    decide,
    pending_approvals,
    resume,
    resume_async,
)
from haystack_integrations.offload.approvals import ApprovalClaimedError
from support.isolation import isolation_kwargs


def _answer(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def main() -> None:
    agent = make_agent({"send_invoice": AlwaysAskPolicy()})
    roots: dict[str, FsspecToolResultStore] = {}
    prepared: dict[str, Any] = {}
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "quit":
            return
        if op in {"prepare", "decide"}:
            root = roots.get(command["url"])
            if root is None:
                role_arn = command.get("role_arn")  # given: the store isolates tenants (support.isolation)
                root = roots[command["url"]] = FsspecToolResultStore(
                    command["url"],
                    storage_options=command["storage_options"],
                    engine=command.get("engine", "fsspec"),
                    **(isolation_kwargs(role_arn) if role_arn else {}),
                )
                root.warm_up()
            store = root.for_session(command["tenant"], command["session"])
        if op == "decide":
            decided = []
            for request in pending_approvals(store):
                answer = command["decisions"][request.tool_call_id]
                decide(store, request.request_id, Decision.model_validate(answer))
                decided.append(request.tool_call_id)
            _answer({"status": "decided", "calls": decided})
        elif op == "prepare":
            messages = [ChatMessage.from_dict(message) for message in command["messages"]]
            prepared = {"store": store, "messages": messages, "worker": command["worker"], "async": command["async"]}
            _answer({"status": "ready"})
        elif op == "go":
            try:
                if prepared["async"]:
                    reply = asyncio.run(
                        resume_async(agent, prepared["messages"], prepared["store"], worker=prepared["worker"])
                    )
                else:
                    reply = resume(agent, prepared["messages"], prepared["store"], worker=prepared["worker"])
            except ApprovalClaimedError:
                _answer({"status": "claimed"})
            else:
                _answer({"status": "resumed", "final": reply["last_message"].text})


if __name__ == "__main__":
    main()
