"""
What of one tool result is written, the pointer left in its place, and how its outcome is counted; no I/O.

`plan` splits a result into blocks with their keys; once `writes` has stored them, `OffloadPlan.pointer_message`
builds the pointer that replaces the result, in Haystack's own text and meta key. `count_outcome` counts what came
of the plan (`metrics.result_offloaded`).
"""

import base64
import mimetypes
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from haystack.dataclasses import ChatMessage, FileContent, ImageContent, TextContent, ToolCallResult
from haystack.hooks.tool_result_offloading.types import ToolResultStore

from haystack_integrations.offload.compat import FALLBACK_EXTENSION as _FALLBACK_EXTENSION
from haystack_integrations.offload.compat import OFFLOADED_META_KEY as _OFFLOADED_META_KEY
from haystack_integrations.offload.compat import content_block_payload as _content_block_payload
from haystack_integrations.offload.compat import offloadable_content_blocks as _offloadable_content_blocks
from haystack_integrations.offload.errors import QuotaExceededError
from haystack_integrations.offload.metrics import OffloadOutcome, result_offloaded

OFFLOADED_META_KEY = _OFFLOADED_META_KEY
"""Haystack's meta key on an offloaded tool-result message; its value is the list of references written."""


# What a plan holds, and the pointer it becomes once written.


@dataclass(frozen=True)
class PlannedBlock:
    """
    One content block of a result, ready to write.

    :param key: The store key, with an extension matching the content.
    :param content: Text, or the decoded bytes of an image or file.
    :param label: For binary blocks, what the pointer calls it (MIME type, or "image"/"file").
    :param filename: For file blocks, the name the tool gave the file.
    """

    key: str
    content: str | bytes
    label: str = ""
    filename: str | None = None

    def describe(self, reference: str, preview_chars: int) -> str:
        """
        Describe the block for the pointer, exactly as Haystack's offload hook does.

        :param reference: Where the block was written.
        :param preview_chars: How many leading characters of text to show.
        :returns: One line of the pointer.
        """
        if isinstance(self.content, str):
            text = self.content
            # The ellipsis tells the model the preview was cut short.
            preview = f"{text[:preview_chars]}{'...' if len(text) > preview_chars else ''}"
            return f"text ({len(text)} characters) at '{reference}'. Preview: {preview}"
        named = f" named '{self.filename}'" if self.filename else ""
        return f"{self.label}{named} ({len(self.content)} bytes) at '{reference}'"


@dataclass(frozen=True)
class OffloadPlan:
    """
    A tool-result message to offload: its blocks, and what to add to the pointer message's meta.

    :param message: The original tool-result message.
    :param result: Its tool result.
    :param blocks: The blocks to write, in order.
    :param preview_chars: How many leading characters of each text to keep in the pointer.
    :param extra_meta: Further meta for the pointer message (a compaction marker, for example).
    """

    message: ChatMessage
    result: ToolCallResult
    blocks: tuple[PlannedBlock, ...]
    preview_chars: int
    extra_meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """The bytes its blocks are stored as: UTF-8 for text (as `FsspecToolResultStore` writes it), raw for binary."""
        return sum(_stored_size(block.content) for block in self.blocks)

    @property
    def tool_name(self) -> str:
        """The tool that produced the result (recorded by stores that take a tool name)."""
        return self.result.origin.tool_name

    @property
    def payload(self) -> str:
        """The string the result occupies in the conversation (base64 for images and files), as policies see it."""
        result = self.result.result
        blocks = [TextContent(text=result)] if isinstance(result, str) else list(result)
        return "".join(_content_block_payload(content_block=block) for block in blocks)

    def pointer_message(self, references: list[str]) -> ChatMessage:
        """
        Build the message that replaces the result: Haystack's pointer text, origin and error flag kept.

        :param references: Where each block was written, in block order.
        :returns: The pointer message, marked offloaded.
        """
        descriptions = [
            block.describe(reference, self.preview_chars)
            for block, reference in zip(self.blocks, references, strict=True)
        ]
        if len(descriptions) == 1:
            pointer = f"Tool result offloaded to {descriptions[0]}"
        else:
            numbered = [f"{position}. {line}" for position, line in enumerate(descriptions, start=1)]
            pointer = "\n".join([f"Tool result offloaded to {len(descriptions)} files:", *numbered])
        return ChatMessage.from_tool(
            tool_result=pointer,
            origin=self.result.origin,
            error=self.result.error,
            meta={**self.message.meta, **self.extra_meta, OFFLOADED_META_KEY: list(references)},
        )


def _stored_size(content: str | bytes) -> int:
    if isinstance(content, bytes):
        return len(content)
    # Most tool output is ASCII, which is its own UTF-8 length (`isascii` is a flag check, not a scan).
    return len(content) if content.isascii() else len(content.encode("utf-8", "surrogatepass"))


# Counting what came of a plan.


def store_tenant(store: ToolResultStore) -> str | None:
    """
    The tenant a store is scoped to, for the metrics' ``tenant=`` (which labels only the tenants the operator listed).

    :param store: The run's store.
    :returns: Its ``tenant`` (`FsspecToolResultStore` has one), or `None` for stores that have none.
    """
    tenant = getattr(store, "tenant", None)
    return tenant if isinstance(tenant, str) else None


def count_outcome(offload_plan: OffloadPlan, *, tenant: str | None, error: BaseException | None = None) -> None:
    """
    Count one planned result once its write is decided: ``stored``, else ``refused_quota`` or ``kept_inline``.

    :param offload_plan: The result; its `size` is recorded.
    :param tenant: The store's tenant (`store_tenant`).
    :param error: Why the write failed (a `QuotaExceededError` is a refusal), or `None` if every block was stored.
    """
    outcome: OffloadOutcome = "stored"
    if isinstance(error, QuotaExceededError):
        outcome = "refused_quota"
    elif error is not None:
        outcome = "kept_inline"
    result_offloaded(outcome, offload_plan.size, tenant=tenant)


# Planning.


def plan(
    message: ChatMessage,
    *,
    store: ToolResultStore,
    key_prefix: str,
    preview_chars: int,
    extra_meta: Mapping[str, Any] | None = None,
) -> OffloadPlan | None:
    """
    Plan the offload of one tool-result message, or return `None` if it cannot be offloaded.

    Not offloadable: a message that is not a tool result, an error result, an already offloaded result, an empty
    result, and image or file content for a store that does not set `supports_binary_content` (Haystack logs a
    warning for that one).

    :param message: The message to consider.
    :param store: The store it would go to.
    :param key_prefix: The result's key without extension; multi-block results get ``_<position>`` suffixes.
    :param preview_chars: How many leading characters of each text to keep in the pointer.
    :param extra_meta: Further meta for the pointer message.
    :returns: The plan, or `None`.
    """
    result = message.tool_call_result
    if result is None or result.error or message.meta.get(OFFLOADED_META_KEY):
        return None
    content_blocks = _offloadable_content_blocks(result=result, store=store)
    if content_blocks is None:
        return None
    single = len(content_blocks) == 1
    blocks = tuple(
        _planned_block(block, key_prefix if single else f"{key_prefix}_{position}")
        for position, block in enumerate(content_blocks)
    )
    return OffloadPlan(
        message=message,
        result=result,
        blocks=blocks,
        preview_chars=preview_chars,
        extra_meta=dict(extra_meta or {}),
    )


def _planned_block(block: TextContent | ImageContent | FileContent, key_prefix: str) -> PlannedBlock:
    if isinstance(block, TextContent):
        return PlannedBlock(key=f"{key_prefix}.txt", content=block.text)
    if isinstance(block, ImageContent):
        data, label, filename = base64.b64decode(block.base64_image), block.mime_type or "image", None
    else:
        data, label, filename = base64.b64decode(block.base64_data), block.mime_type or "file", block.filename
    # The tool's own file name wins over the MIME type; only its suffix is used, never its path.
    mime_extension = mimetypes.guess_extension(block.mime_type) if block.mime_type else None
    extension = (Path(filename).suffix if filename else "") or mime_extension or _FALLBACK_EXTENSION
    return PlannedBlock(key=f"{key_prefix}{extension}", content=data, label=label, filename=filename)
