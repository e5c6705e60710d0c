"""
How a conversation's messages are stored in its history: ``ChatMessage.to_dict`` without its default fields, one text
as a plain string, and read back as ``ChatMessage.from_dict`` expects.
"""

import json
from typing import Any

from haystack.dataclasses import ChatMessage
from pydantic_core import to_jsonable_python


def stored_form(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    # The JSON form (tuples become lists), so a conversation read back compares equal to the one that was written.
    return [compacted(to_jsonable_python(message.to_dict())) for message in messages]


def compacted(message: dict[str, Any]) -> dict[str, Any]:
    """
    A message's dict as stored: ``ChatMessage.to_dict`` without the fields it leaves at their defaults (no name, no
    meta), and a message of one text as that text (`expanded` undoes it; ``ChatMessage.from_dict`` reads it too).

    A message of 300 characters is stored in 331 to 336 bytes instead of 361 to 366: what a cold read fetches beyond
    the text the model is sent (it was 1.22x at 500 turns of such exchanges).
    """
    compact = {
        key: value
        for key, value in message.items()
        if not ((key == "meta" and value == {}) or (key == "name" and value is None))
    }
    match compact.get("content"):
        case [{"text": str(text), **rest}] if not rest:
            compact["content"] = text
    return compact


def expanded(message: dict[str, Any]) -> dict[str, Any]:
    """A stored message's dict as ``ChatMessage.from_dict`` reads it today (content as a list of parts)."""
    if isinstance(message.get("content"), str):
        return {**message, "content": [{"text": message["content"]}]}
    return message


def added_messages(before: list[ChatMessage], after: list[ChatMessage]) -> list[ChatMessage] | None:
    """The messages `after` adds to `before`, or None if it changed any of them (compared without serializing both)."""
    if len(after) < len(before):
        return None
    for old, new in zip(before, after, strict=False):
        if old is not new and old != new and stored_form([old]) != stored_form([new]):
            return None
    return after[len(before) :]


def message_json(message: dict[str, Any]) -> str:
    # Compacted here too, so messages stored by earlier versions are checkpointed in the compact form.
    return json.dumps(compacted(message), separators=(",", ":"))
