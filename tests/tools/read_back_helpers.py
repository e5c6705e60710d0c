"""Helpers for the read-back tool suites: multilingual text, a run's State, a page-by-page reader, a scripted model."""

import base64
import re
import struct
import zlib
from typing import Any

from haystack.components.agents.state.state import State
from haystack.dataclasses import ChatMessage, ImageContent, ToolCall
from haystack.tools import Tool

from haystack_integrations.offload import offload_context

# ASCII, Latin with precomposed and combining accents, CJK (3 bytes), emoji and a ZWJ family (4 bytes each), Arabic,
# a long run without newlines: every UTF-8 width, and combining marks that must stay on their base character.
_PIECES = [
    "plain ascii words and numbers 0123456789 ",
    "café naïve e\u0301 a\u0308 o\u0302\u0323 ",
    "日本語のテキスト、中文字符\uff0c한국어 ",  # \uff0c: a full-width comma
    "emoji 🎉🚀 family 👨\u200d👩\u200d👧\u200d👦 flag 🇺🇳 ",
    "العربية ",
    "x" * 37,
    "\n",
]
_HEADER = re.compile(r"\A\[(?P<header>[^\n]*)\]\n", re.DOTALL)
_NEXT = re.compile(r"offset=(\d+)\]?$")


def multilingual(chars: int, *, seed: int = 0, newlines: bool = True) -> str:
    """
    Deterministic text of about `chars` characters mixing 1- to 4-byte UTF-8 characters and combining marks.

    :param chars: Roughly how many characters to produce.
    :param seed: Varies the mix, so different tenants get different text.
    :param newlines: Include line breaks (False: one enormous line).
    """
    pieces = _PIECES if newlines else [piece for piece in _PIECES if piece != "\n"]
    out: list[str] = []
    length = 0
    state = seed + 1
    while length < chars:
        state = (state * 1103515245 + 12345) % 2**31  # a small LCG: deterministic, no global random state
        piece = pieces[(state >> 8) % len(pieces)]
        out.append(piece)
        length += len(piece)
    return "".join(out)


def state_for(store: Any) -> State:
    """A State carrying `store` in `hook_context`, as the Agent builds it for `Agent.run(hook_context=...)`."""
    return State(schema={"hook_context": {"type": dict}}, data={"hook_context": offload_context(store)})


def split_page(result: str) -> tuple[str, str]:
    """Split a page result into its header (without brackets) and its exact content."""
    match = _HEADER.match(result)
    assert match is not None, f"no header line in {result[:200]!r}"
    return match.group("header"), result[match.end() :]


def next_offset(header: str) -> int | None:
    """The offset of the next page a header gives, or None at the end of the result."""
    if "end of result" in header or "the result is empty" in header:
        return None
    match = _NEXT.search(header)
    assert match is not None, f"no next offset in header {header!r}"
    return int(match.group(1))


def read_all_pages(tool: Tool, state: State, reference: str, **arguments: Any) -> list[str]:
    """Read a result page by page with `tool.invoke`, following the headers; return the pages' contents."""
    pages: list[str] = []
    offset: int | None = 0
    while offset is not None:
        result = tool.invoke(state=state, reference=reference, offset=offset, **arguments)
        assert isinstance(result, str) and not result.startswith("Error"), result
        header, content = split_page(result)
        pages.append(content)
        offset = next_offset(header)
        assert len(pages) < 10_000, "paging does not progress"
    return pages


async def read_all_pages_async(tool: Tool, state: State, reference: str, **arguments: Any) -> list[str]:
    """Async `read_all_pages` (awaits `tool.invoke_async`)."""
    pages: list[str] = []
    offset: int | None = 0
    while offset is not None:
        result = await tool.invoke_async(state=state, reference=reference, offset=offset, **arguments)
        assert isinstance(result, str) and not result.startswith("Error"), result
        header, content = split_page(result)
        pages.append(content)
        offset = next_offset(header)
        assert len(pages) < 10_000, "paging does not progress"
    return pages


def tiny_png(width: int = 2, height: int = 2) -> bytes:
    """A valid PNG (grey pixels), built by hand so the test needs no imaging library."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


# A scripted model and its tools, for Agent runs (see test_read_back_e2e.py)

CHART = tiny_png(16, 16)
PAGE_CHARS = 2_500
NEEDLE = "⚑checkpoint"
POINTER = re.compile(r"at '([^']+)'")


def report(topic: str) -> str:
    """The large result `fetch_report` returns: multilingual text that differs per topic, with a few checkpoints."""
    body = multilingual(30_000, seed=sum(topic.encode()))
    parts = [body[start : start + 3_000] for start in range(0, len(body), 3_000)]
    return f"REPORT ON {topic}\n" + "".join(f"{part}⚑checkpoint {i}⚑" for i, part in enumerate(parts))


def _fetch_report(topic: str) -> str:
    return report(topic)


def _render_chart() -> list[ImageContent]:
    return [ImageContent(base64_image=base64.b64encode(CHART).decode(), mime_type="image/png")]


FETCH = Tool(
    name="fetch_report",
    description="Fetch a long report.",
    parameters={"type": "object", "properties": {"topic": {"type": "string"}}, "required": ["topic"]},
    function=_fetch_report,
)
CHART_TOOL = Tool(
    name="render_chart",
    description="Render a chart.",
    parameters={"type": "object", "properties": {}},
    function=_render_chart,
    outputs_to_string={"raw_result": True},
)


def _call(messages: list[ChatMessage], tool_name: str, **arguments: Any) -> ChatMessage:
    return ChatMessage.from_assistant(
        tool_calls=[ToolCall(tool_name=tool_name, arguments=arguments, id=f"call_{len(messages)}")]
    )


def script(messages: list[ChatMessage]) -> ChatMessage:
    """
    The model. The user's message is "<command>:<argument>":

    - ``read:<topic>`` fetches a report, then reads it page by page from the pointer's reference;
    - ``search:<topic>`` fetches a report, then searches it for `NEEDLE`;
    - ``list:<topic>`` fetches a report, then lists the stored results;
    - ``chart:`` renders a chart, then reads the image back;
    - ``steal:<reference>`` reads someone else's reference straight away.
    """
    user = next(message.text or "" for message in messages if message.is_from("user"))
    command, _, argument = user.partition(":")
    last = messages[-1]
    result = last.tool_call_result
    if result is None:
        if command == "steal":
            return _call(messages, "read_tool_result", reference=argument)
        if command == "chart":
            return _call(messages, "render_chart")
        return _call(messages, "fetch_report", topic=argument)

    tool = result.origin.tool_name
    if tool in {"fetch_report", "render_chart"}:
        pointer = POINTER.search(str(result.result))
        if pointer is None:
            return ChatMessage.from_assistant(f"no pointer in: {str(result.result)[:80]}")
        reference = pointer.group(1)
        if command == "search":
            return _call(messages, "read_tool_result", reference=reference, search=NEEDLE, max_matches=50)
        if command == "list":
            return _call(messages, "list_tool_results")
        return _call(messages, "read_tool_result", reference=reference, offset=0, max_chars=PAGE_CHARS)
    if tool == "read_tool_result" and isinstance(result.result, str) and result.result.startswith("[text result"):
        offset = next_offset(split_page(result.result)[0])
        if offset is not None:
            reference = messages[-2].tool_calls[0].arguments["reference"]
            return _call(messages, "read_tool_result", reference=reference, offset=offset, max_chars=PAGE_CHARS)
    return ChatMessage.from_assistant("Done.")
