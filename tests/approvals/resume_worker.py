"""
A worker process that resumes a held step and hangs inside the approved call, for a test to SIGKILL it there.

Run as ``python resume_worker.py <store url> <storage options JSON> <tenant> <session> <messages JSON> <lease>
[<tenant role ARN>]`` with this directory and ``tests`` on ``PYTHONPATH``. The invoice tool records its effect (a
ledger line) and then hangs, so a kill lands after the side effect and before the worker could record the result: the
case nobody can resolve alone.
"""

import asyncio
import json
import sys
import time

from haystack.dataclasses import ChatMessage
from test_approval_composition import _record, agent_with, approvals

from haystack_integrations.offload import FsspecToolResultStore, resume_async
from support.isolation import isolation_kwargs


def charge_then_hang(customer: str, amount: int) -> str:
    """Charge (record the effect), then hang until killed."""
    result = _record("invoice", f"{customer}:{amount}")
    time.sleep(600)
    return result


def main() -> None:
    url, options, tenant, session, messages, lease = sys.argv[1:7]
    role_arn = sys.argv[7] if len(sys.argv) > 7 else ""  # given: the store isolates tenants (support.isolation)
    isolation = isolation_kwargs(role_arn) if role_arn else {}
    store = FsspecToolResultStore(url, storage_options=json.loads(options), **isolation).for_session(tenant, session)
    invoice_hook, _ = approvals()
    agent = agent_with([invoice_hook], invoice=charge_then_hang)
    history = [ChatMessage.from_dict(message) for message in json.loads(messages)]
    asyncio.run(resume_async(agent, history, store, worker="doomed", lease=float(lease)))


if __name__ == "__main__":
    main()
