"""`read_tool_result`: the model reads an offloaded result back, a page or a search at a time, via its run's store."""

import dataclasses
from typing import Any

import regex  # type: ignore[import-untyped]
from haystack.components.agents.state.state import State
from haystack.hooks.tool_result_offloading.types import ToolResultStore
from pydantic import BaseModel, ConfigDict, Field

from haystack_integrations.offload.constants import READ_BACK_TOOL_NAMES
from haystack_integrations.offload.metrics import ReadKind
from haystack_integrations.offload.tools.base import ReadBackTool, ToolOutput, argument_schema
from haystack_integrations.offload.tools.errors import ReadBackToolError
from haystack_integrations.offload.tools.reading import ReadOptions, read_binary, read_text, search_result
from haystack_integrations.offload.tools.source import (
    Reader,
    ResultSource,
    ServedBytes,
    drive,
    drive_async,
    source_for,
)

READ_TOOL_RESULT_NAME = "read_tool_result"
if READ_TOOL_RESULT_NAME not in READ_BACK_TOOL_NAMES:  # pragma: no cover - a guard for future renames
    raise RuntimeError("read_tool_result must be listed in READ_BACK_TOOL_NAMES, or hooks would offload its pages.")

DEFAULT_PAGE_CHARS = 10_000
DEFAULT_MATCHES = 20
"""Matches one search returns when the model does not say (at most the tool's `max_matches`)."""
MAX_SEARCH_PATTERN_CHARS = 500
# Quotes and spaces models put around a reference they copy from "... at '<reference>'".
_REFERENCE_WRAPPING = " \t\r\n'\"`"


class ReadToolResultArguments(BaseModel):
    """The arguments the model may pass to `read_tool_result` (anything else is refused with a clear message)."""

    model_config = ConfigDict(extra="forbid")

    reference: str
    offset: int = Field(default=0, ge=0)
    max_chars: int | None = Field(default=None, ge=1)
    search: str | None = Field(default=None, max_length=MAX_SEARCH_PATTERN_CHARS)
    regex: bool = False
    ignore_case: bool = False
    max_matches: int | None = Field(default=None, ge=1)


class ReadToolResult(ReadBackTool):
    """
    A Haystack `Tool` that lets the model read an offloaded tool result back, by pages or by search.

    It reads through the *current run's* store: the one the application passed as
    ``Agent.run(..., hook_context=offload_context(store))`` (Haystack's `RESULT_STORE_CONTEXT_KEY`), reached through
    the live `State` the Agent injects. So one Agent with one instance of this tool serves every user of a server, and
    a run can only ever read its own session's results: a reference from another tenant or session, a path, a URL or
    ``..`` gets an error result, and nothing is read. A `store` given here is only a fallback for runs that bring none.

    What the model gets:

    - **a page**: a header line (total size, the offsets this page covers, the offset of the next page), then up to
      `page_chars` characters exactly as stored. Pages are cut by characters, not lines, so a result of a few huge
      lines pages too. Offsets are byte positions in the stored UTF-8; with an `FsspecToolResultStore` (or any store
      with ranged reads, see `types.RangedResults`) a page is one ranged read (one ranged GET on S3, about
      `page_chars` bytes), never the whole result, and a multi-byte character is never split (see `tools.paging`);
    - **a search** (`search`, optionally a regular expression): the matches with a little context and their offsets,
      matched in 1 MiB chunks and stopped at the match bound, so a 200 MB result is never held in memory whole. The
      first MiB is read alone; past it, ranges of up to 16 MiB are read ahead, up to 3 at once (about 48 MiB held);
    - **an image** as image content a vision model can see (PNG, JPEG, GIF, WebP up to `max_image_bytes`); other
      binary results are described (kind, size, a hex preview) and bytes that are UTF-8 text are paged as text.

    Failures (a refused or unknown reference, bad arguments, a storage error) come back as ``"Error: ..."`` results the
    model can act on; the run goes on.

    Metrics (`metrics.read_back`): each call that read counts once in ``offload.readback.calls`` as a ``page``, a
    ``search`` or a ``binary`` read, with the bytes of the result it was served (a search: the bytes it scanned) in
    ``offload.readback.bytes``. A failed call is not counted there; its storage requests are, by the store.

    Keep this tool's results in the conversation: offloading a page would hand the model a pointer to the page, which
    it would read, and so on. This library's hooks skip the tools in `READ_BACK_TOOL_NAMES`; with Haystack's stock
    `ToolResultOffloadHook`, map them to `NeverOffload()`::

        ToolResultOffloadHook(store, {("read_tool_result", "list_tool_results"): NeverOffload(), "*": ...})

    With Haystack's `FileSystemToolResultStore` a page is one seek and read in the result's file, after the store's own
    containment check. With any other store (anything with Haystack's `read(reference)`), paging and search work the
    same but every call reads the whole result.

    Usage example:

    ```python
    from haystack.components.agents import Agent
    from haystack_integrations.offload import (
        FsspecToolResultStore, offload_context, read_tool_result, list_tool_results,
    )

    results = FsspecToolResultStore("s3://acme-agent-results/prod")          # once, at start-up
    agent = Agent(chat_generator=..., tools=[web_search, read_tool_result, list_tool_results], hooks=...)

    store = results.for_session(tenant=user.org_id, session=chat_id)         # per request
    reply = await agent.run_async(messages, hook_context=offload_context(store))
    ```
    """

    arguments_model = ReadToolResultArguments

    def __init__(
        self,
        *,
        store: ToolResultStore | None = None,
        page_chars: int = DEFAULT_PAGE_CHARS,
        max_page_chars: int = 50_000,
        max_matches: int = 50,
        context_chars: int = 80,
        max_scan_bytes: int = 64 * 1024 * 1024,
        regex_timeout: float = 1.0,
        regex_match_chars: int = 1_000,
        max_image_bytes: int = 5 * 1024 * 1024,
        return_images: bool = True,
        raise_on_error: bool = False,
    ) -> None:
        """
        Create the tool. The module-level `read_tool_result` is one with the defaults.

        :param store: Fallback store for runs whose `hook_context` carries none. In a multi-user server leave it unset
            and pass each run's store through `hook_context`, so no run can fall back to a shared store.
        :param page_chars: Characters per page when the model does not say (`max_chars`).
        :param max_page_chars: The most characters the model may ask for in one page.
        :param max_matches: The most matches one search returns (the model may ask for fewer; default 20).
        :param context_chars: Characters of context shown on each side of a match.
        :param max_scan_bytes: The most bytes one search call reads before it stops and says where to resume.
        :param regex_timeout: Seconds a regular expression may run per call before it is stopped (catastrophic
            backtracking in a model-written pattern would otherwise hold a worker thread).
        :param regex_match_chars: The longest regular-expression match guaranteed to be found across the edge between
            two search chunks.
        :param max_image_bytes: Larger images are described instead of returned (5 MiB: Anthropic's per-image limit).
        :param return_images: Return images as image content. Turn off for chat generators that cannot take images
            in tool results; images are then described.
        :param raise_on_error: Raise `ToolInvocationError` on failure (Haystack's tool-failure policy then applies)
            instead of returning ``"Error: ..."``.
        :raises ValueError: If a limit is not positive (`context_chars`: negative) or `page_chars` exceeds
            `max_page_chars`.
        """
        self.options = ReadOptions(
            page_chars=page_chars,
            max_page_chars=max_page_chars,
            max_matches=max_matches,
            context_chars=context_chars,
            max_scan_bytes=max_scan_bytes,
            regex_timeout=regex_timeout,
            regex_match_chars=regex_match_chars,
            max_image_bytes=max_image_bytes,
            return_images=return_images,
        )
        super().__init__(
            name=READ_TOOL_RESULT_NAME,
            description=DESCRIPTION,
            parameters=argument_schema(ReadToolResultArguments),
            store=store,
            raise_on_error=raise_on_error,
        )

    def _run(self, store: ToolResultStore, arguments: Any, state: State | None) -> ToolOutput:
        reference = _clean_reference(arguments.reference)
        source = source_for(store, reference)
        source.open()
        served = ServedBytes()
        output = drive(served.tally(self._reader(source, arguments)), source)
        self._count(store, source, arguments, served)
        return output

    async def _run_async(self, store: ToolResultStore, arguments: Any, state: State | None) -> ToolOutput:
        reference = _clean_reference(arguments.reference)
        source = source_for(store, reference)
        await source.open_async()
        served = ServedBytes()
        output = await drive_async(served.tally(self._reader(source, arguments)), source)
        self._count(store, source, arguments, served)
        return output

    def _count(
        self, store: ToolResultStore, source: ResultSource, arguments: ReadToolResultArguments, served: ServedBytes
    ) -> None:
        """
        Count a call that read: a ``search`` (the bytes it scanned), else a ``binary`` or a text ``page`` (the bytes
        its range held). Reached only when the reader returned, so a failed call (an error result) is not counted.
        """
        kind: ReadKind = "search" if arguments.search else "binary" if source.kind == "bytes" else "page"
        self._count_read(kind, served.total, store)

    def _reader(self, source: ResultSource, arguments: ReadToolResultArguments) -> Reader[ToolOutput]:
        if arguments.search:
            flags = regex.V0 | (regex.IGNORECASE if arguments.ignore_case else 0)
            try:
                pattern = regex.compile(arguments.search if arguments.regex else regex.escape(arguments.search), flags)
            except regex.error as error:
                raise ReadBackToolError(f"Invalid regular expression {arguments.search!r}: {error}.") from error
            shown = f"{'regular expression' if arguments.regex else 'text'} {arguments.search!r}"
            if arguments.ignore_case:
                shown += " (ignoring case)"
            options = self.options
            if not arguments.regex:
                # A literal match is exactly as long as the text, so the overlap between chunks can be that short.
                options = dataclasses.replace(options, regex_match_chars=len(arguments.search))
            return search_result(
                kind=source.kind or "text",
                key=source.key,
                pattern=pattern,
                shown_pattern=shown,
                offset=arguments.offset,
                max_matches=min(arguments.max_matches or DEFAULT_MATCHES, options.max_matches),
                options=options,
            )
        max_chars = min(arguments.max_chars or self.options.page_chars, self.options.max_page_chars)
        if source.kind == "bytes":
            return read_binary(offset=arguments.offset, max_chars=max_chars, key=source.key, options=self.options)
        return read_text(offset=arguments.offset, max_chars=max_chars)

    def _init_parameters(self) -> dict[str, Any]:
        return {**super()._init_parameters(), **dataclasses.asdict(self.options)}


def _clean_reference(reference: str) -> str:
    cleaned = reference.strip(_REFERENCE_WRAPPING)
    if not cleaned:
        raise ReadBackToolError("The reference is empty: pass the reference shown where the result was offloaded.")
    return cleaned


# The model reads this schema on every call of every step, so it says only what the tool's own output does not: each
# page's first line names the next offset ("more follows: call read_tool_result again with offset=..."), a search lists
# match offsets and says how to read there, and a bad argument gets an error naming it. Parameter names carry the rest.
# Measured in benchmarks/README.md ("Read-back tools: what their schemas cost per call").
DESCRIPTION = (
    "Read an offloaded tool result by the reference in its pointer (\"... at '<reference>'\"). Returns one page; its "
    "first line says where the next starts. Set search to find text instead."
)


read_tool_result = ReadToolResult()
"""The `read_tool_result` tool with default limits, reading through each run's store from `hook_context`."""
