"""
The library's target pattern in one page: an Agent and a store made once, and per request the caller's own session
store brought to the run in ``hook_context`` (`offload_context` + ``agent.run_async``).

The server does the same through `ChatService`, which adds what a multi-worker deployment needs around it (durable
history, turn claims, approvals across requests); this is the core underneath, for a team that starts smaller.
``python -m offload_haystack_app.demo.example [STORE_URL]`` runs it with the scripted model and two demo tools.
"""

import asyncio
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from haystack.components.agents import Agent
from haystack.dataclasses import ChatMessage

from haystack_integrations.offload import FsspecToolResultStore, offload_context
from haystack_integrations.offload.hooks import OFFLOADED_META_KEY
from offload_haystack_app.demo.scripted_model import scripted_generator
from offload_haystack_app.demo.tools import SQL_QUERY, WEB_SEARCH
from offload_haystack_app.server.agent import build_agent

RESEARCH = "Research solar panels and dump the invoices table"
READ_BACK = 'Read back the search results for "result 7"'


@dataclass
class ExampleChat:
    """What one tenant's chat did: the model's last words, and the references of the results offloaded."""

    tenant: str
    chat_id: str
    reply: str = ""
    references: list[str] = field(default_factory=list)


async def answer(
    agent: Agent, results: FsspecToolResultStore, tenant: str, chat_id: str, messages: list[ChatMessage]
) -> list[ChatMessage]:
    """
    One request of a web handler: run the shared Agent on the caller's own session store.

    :param agent: The Agent shared by every request (its hooks keep nothing between runs).
    :param results: The store made at start-up, at the root of every tenant's results.
    :param tenant: The caller's tenant (from its credentials, never from the request body).
    :param chat_id: The conversation.
    :param messages: The conversation so far, the new user message last.
    :returns: The conversation after the run, with pointers where results were offloaded.
    """
    # One isolated store per tenant + session: the hooks and read-back tools of this run use it, and no other.
    store = results.for_session(tenant=tenant, session=chat_id)
    reply = await agent.run_async(messages, hook_context=offload_context(store))
    messages_after: list[ChatMessage] = reply["messages"]
    return messages_after


async def run_example(
    store_url: str, *, storage_options: dict[str, Any] | None = None, tenants: tuple[str, ...] = ("acme", "globex")
) -> list[ExampleChat]:
    """
    Start up once, then serve a research turn and a read-back turn for each tenant's chat, all chats at once.

    :param store_url: Root URL of the store (a local directory, ``memory://...`` or ``s3://bucket/prefix``).
    :param storage_options: fsspec options for the store (e.g. an S3 endpoint).
    :param tenants: One chat per tenant.
    :returns: What each chat did.
    """
    # At start-up: one store and one Agent for every user. Your own tools go in `tools=`; these two are the demo's.
    results = FsspecToolResultStore(store_url, storage_options=storage_options)
    await results.warm_up_async()
    agent = build_agent(scripted_generator(), tools=[WEB_SEARCH, SQL_QUERY])
    chats = [ExampleChat(tenant=tenant, chat_id="chat-1") for tenant in tenants]
    await asyncio.gather(*(_converse(agent, results, chat) for chat in chats))
    return chats


async def _converse(agent: Agent, results: FsspecToolResultStore, chat: ExampleChat) -> None:
    # The conversation is the caller's to keep (ChatService keeps it in the store); here it stays in memory.
    messages: list[ChatMessage] = []
    for text in (RESEARCH, READ_BACK):
        messages = await answer(agent, results, chat.tenant, chat.chat_id, [*messages, ChatMessage.from_user(text)])
    chat.reply = messages[-1].text or ""
    chat.references = [reference for message in messages for reference in message.meta.get(OFFLOADED_META_KEY) or []]


def main(argv: list[str] | None = None) -> int:
    """
    Run the example and print what each chat did.

    :param argv: ``[STORE_URL]``; a temporary directory by default.
    :returns: 0.
    """
    arguments = sys.argv[1:] if argv is None else argv
    with tempfile.TemporaryDirectory(prefix="offload-example-") as scratch:
        chats = asyncio.run(run_example(arguments[0] if arguments else scratch))
    for chat in chats:
        said = " ".join(chat.reply.split())
        print(
            f"{chat.tenant}/{chat.chat_id}: {len(chat.references)} results offloaded; the model said: {said[:160]}..."
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
