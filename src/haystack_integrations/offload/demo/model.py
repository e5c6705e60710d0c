"""The demo's scripted model: Haystack's MockChatGenerator with a response function, labelled as scripted."""

from haystack.components.generators.chat import MockChatGenerator
from haystack.dataclasses import ChatMessage, ToolCall

SCRIPTED_MODEL_LABEL = "scripted model (MockChatGenerator), no LLM is called"


def scripted_reply(messages: list[ChatMessage]) -> ChatMessage:
    """
    Decide the next assistant message from the conversation alone, so concurrent runs never share a script position.

    A user message gets a search and a table dump in one step; tool results get a final answer that quotes the
    pointers the model was shown instead of the full results.

    :param messages: The conversation so far.
    :returns: The assistant's reply.
    """
    last = messages[-1]
    if last.tool_call_result is None:
        topic = (last.text or "anything").strip()
        return ChatMessage.from_assistant(
            tool_calls=[
                ToolCall(tool_name="web_search", arguments={"query": topic}, id="call_search"),
                ToolCall(tool_name="sql_query", arguments={"table": "invoices"}, id="call_sql"),
            ]
        )
    seen = [message.tool_call_result.result for message in messages if message.tool_call_result is not None]
    return ChatMessage.from_assistant(f"Summary from {len(seen)} tool results (I saw pointers, not the full text).")


def scripted_generator() -> MockChatGenerator:
    """
    Build the demo's chat generator.

    :returns: A `MockChatGenerator` driven by `scripted_reply`.
    """
    return MockChatGenerator(response_fn=scripted_reply)
