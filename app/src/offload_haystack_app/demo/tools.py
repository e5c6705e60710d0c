"""
The demo's tools, stand-ins for a team's own: deterministic results of the kinds that crowd a context window, and one
that needs approval. The server's Agent serves them until it is given tools of its own (`build_agent(tools=...)`).

Every result depends on the arguments only, so the demo can recompute it and check the stored copy byte for byte.
"""

import hashlib
import struct
import zlib
from base64 import b64decode, b64encode
from collections.abc import Callable
from typing import Any

from haystack.dataclasses import ImageContent, TextContent
from haystack.tools.tool import Tool

CHART_WIDTH = 360
CHART_HEIGHT = 180
_BAR_COLOURS = [(63, 81, 181), (0, 150, 136), (255, 152, 0), (233, 30, 99), (121, 85, 72), (96, 125, 139)]


def search_results(query: str) -> str:
    """
    Return a long, deterministic page of search hits for `query`.

    :param query: What to search for.
    :returns: About 20 KB of text that depends on the query only.
    """
    digest = hashlib.sha256(query.encode()).hexdigest()
    return "\n".join(
        f"[{rank}] {query} — result {rank} ({digest[rank % 48 : rank % 48 + 16]}): " + "relevant snippet " * 8
        for rank in range(1, 121)
    )


def sql_rows(table: str) -> str:
    """
    Return a deterministic CSV dump of `table`.

    :param table: Which table to dump.
    :returns: About 30 KB of CSV.
    """
    header = "id,customer,region,amount_eur,status"
    rows = [
        f"{i},{table}-customer-{i:05d},{['eu', 'us', 'apac'][i % 3]},{(i * 37) % 10_000}.00,paid" for i in range(600)
    ]
    return "\n".join([header, *rows])


def chart_values(metric: str) -> list[int]:
    """
    The six monthly values the chart of `metric` shows (0-100), derived from the metric's name.

    :param metric: What the chart shows.
    :returns: Six values.
    """
    digest = hashlib.sha256(metric.encode()).digest()
    return [20 + digest[position] % 81 for position in range(6)]


def chart_png(metric: str) -> bytes:
    """
    Draw a bar chart of `metric` as a PNG, with no imaging library: raw RGB rows, zlib, and the three PNG chunks.

    :param metric: What the chart shows.
    :returns: The PNG file's bytes.
    """
    values = chart_values(metric)
    slot = CHART_WIDTH // len(values)
    rows = bytearray()
    for y in range(CHART_HEIGHT):
        rows.append(0)  # PNG filter type "None" for this row
        height_from_bottom = CHART_HEIGHT - y
        for x in range(CHART_WIDTH):
            bar, within = divmod(x, slot)
            drawn = bar < len(values) and 8 <= within < slot - 8 and height_from_bottom <= values[bar] * 1.6
            if drawn:
                rows.extend(_BAR_COLOURS[bar % len(_BAR_COLOURS)])
            elif y % 36 == 0:
                rows.extend((224, 224, 224))  # grid line
            else:
                shade = 255 - y // 12
                rows.extend((shade, shade, 255))
    header = struct.pack(">IIBBBBB", CHART_WIDTH, CHART_HEIGHT, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(bytes(rows), 9))
        + _chunk(b"IEND", b"")
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def chart_caption(metric: str) -> str:
    """
    The text block that comes with the chart of `metric`.

    :param metric: What the chart shows.
    :returns: One line naming the metric and its values.
    """
    values = ", ".join(str(value) for value in chart_values(metric))
    return f"Bar chart of {metric} for the last six months: {values}."


def render_chart(metric: str) -> list[TextContent | ImageContent]:
    """
    Render a chart of `metric`: a caption and a PNG.

    :param metric: What to chart, e.g. "revenue".
    :returns: A text block and an image block.
    """
    image = ImageContent(base64_image=b64encode(chart_png(metric)).decode(), mime_type="image/png")
    return [TextContent(text=chart_caption(metric)), image]


def service_logs(service: str) -> str:
    """
    Return the last hour of a service's logs: about 3 KB, with one error line.

    :param service: The service's name.
    :returns: The log lines.
    """
    lines = [f"{service} 12:{minute:02d}:00 INFO request served in {(minute * 7) % 90 + 10} ms" for minute in range(60)]
    lines[42] = f"{service} 12:42:00 ERROR upstream timeout after 30000 ms"
    return "\n".join(lines)


def invoice_number(customer: str, amount: int) -> str:
    """
    The invoice number `send_invoice` reports for these arguments.

    :param customer: Who is invoiced.
    :param amount: The amount in EUR.
    :returns: An id like ``INV-1a2b3c4d``.
    """
    return "INV-" + hashlib.sha256(f"{customer}:{amount}".encode()).hexdigest()[:8]


def send_invoice(customer: str, amount: int) -> str:
    """
    Send an invoice (in the demo: report what would have been sent). The server asks for approval before it runs.

    :param customer: Who is invoiced.
    :param amount: The amount in EUR.
    :returns: A confirmation with the invoice number.
    """
    return f"Invoice {invoice_number(customer, amount)} sent to {customer} for {amount} EUR."


def _one_string_tool(name: str, description: str, parameter: str, function: Callable[..., Any], **options: Any) -> Tool:
    """A demo tool whose one required argument is a string."""
    parameters = {"type": "object", "properties": {parameter: {"type": "string"}}, "required": [parameter]}
    return Tool(name=name, description=description, parameters=parameters, function=function, **options)


WEB_SEARCH = _one_string_tool("web_search", "Search the web and return a page of results.", "query", search_results)
SQL_QUERY = _one_string_tool("sql_query", "Dump a database table as CSV.", "table", sql_rows)
RENDER_CHART = _one_string_tool(
    "render_chart",
    "Render a bar chart of a business metric as a PNG image.",
    "metric",
    render_chart,
    # The image travels as an ImageContent block, not as its repr.
    outputs_to_string={"raw_result": True},
)
FETCH_LOGS = _one_string_tool("fetch_logs", "Fetch the last hour of a service's logs.", "service", service_logs)

SEND_INVOICE = Tool(
    name="send_invoice",
    description="Send an invoice to a customer. A person approves every invoice before it is sent.",
    parameters={
        "type": "object",
        "properties": {
            "customer": {"type": "string", "minLength": 1},
            "amount": {"type": "integer", "minimum": 1, "maximum": 100_000},
        },
        "required": ["customer", "amount"],
        "additionalProperties": False,
    },
    function=send_invoice,
)

DEMO_TOOLS = [WEB_SEARCH, SQL_QUERY, RENDER_CHART, FETCH_LOGS, SEND_INVOICE]
APPROVAL_TOOL_NAMES = ("send_invoice",)
"""The demo's tools that ask a person before every call."""
ALWAYS_OFFLOADED_TOOL_NAMES = ("render_chart",)
"""The demo's tools whose results are always offloaded: a chart is an image, which the model reads back when needed."""
TOOL_FUNCTIONS: dict[str, Callable[..., Any]] = {
    tool.name: tool.function for tool in DEMO_TOOLS if tool.function is not None
}


def expected_blocks(tool_name: str, arguments: dict[str, Any]) -> list[str | bytes]:
    """
    Recompute what a demo tool returned, as the blocks an offload hook stores: text as `str`, images as `bytes`.

    :param tool_name: One of the demo tools.
    :param arguments: The arguments it was called with.
    :returns: The blocks, in order.
    :raises KeyError: If `tool_name` is not a demo tool.
    """
    output = TOOL_FUNCTIONS[tool_name](**arguments)
    if isinstance(output, str):
        return [output]
    blocks: list[str | bytes] = []
    for block in output:
        if isinstance(block, TextContent):
            blocks.append(block.text)
        else:
            blocks.append(b64decode(block.base64_image))
    return blocks
