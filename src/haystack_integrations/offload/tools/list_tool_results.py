"""`list_tool_results`: the model lists the results offloaded in its own conversation, newest first."""

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from haystack.components.agents.state.state import State
from haystack.hooks.tool_result_offloading.types import ToolResultStore
from pydantic import BaseModel, ConfigDict, Field

from haystack_integrations.offload.constants import READ_BACK_TOOL_NAMES
from haystack_integrations.offload.tools.base import ReadBackTool, ToolOutput, argument_schema
from haystack_integrations.offload.tools.errors import ReadBackToolError
from haystack_integrations.offload.types import ListableResults

LIST_TOOL_RESULTS_NAME = "list_tool_results"
if LIST_TOOL_RESULTS_NAME not in READ_BACK_TOOL_NAMES:  # pragma: no cover - a guard for future renames
    raise RuntimeError("list_tool_results must be listed in READ_BACK_TOOL_NAMES, or hooks would offload its output.")

# Haystack's ToolResultOffloadHook writes keys as "{step}_{tool_name}_{call_id}[_{position}].{extension}".
_HAYSTACK_KEY_STEP = re.compile(r"(\d+)_")
# How the store makes a key safe (stores.names.safe_key): a tool name appears in the key spelled this way.
_UNSAFE_KEY_CHARS = re.compile(r"[^A-Za-z0-9._-]")


# Sent with every model call: see the note on read_tool_result's DESCRIPTION.
# "chat", not "conversation": the cursor argument (after) had to fit in the same budget (tests/tools/test_tool_schemas).
DESCRIPTION = "List this chat's offloaded tool results, newest first, with references."
# With a tool_name filter, the most pages one call reads looking for matches (each one LIST on S3).
MAX_FILTERED_PAGES = 10


@runtime_checkable
class PagedResults(Protocol):
    """A store that lists a page at a time (`FsspecToolResultStore.list_page_async`): a page costs a page."""

    async def list_page_async(self, *, limit: int = 20, after: str | None = None) -> Any:
        """One page, newest first: an object with ``results`` and ``next_after``."""

    def list_page(self, *, limit: int = 20, after: str | None = None) -> Any:
        """The sync form of `list_page_async`."""


class ListToolResultsArguments(BaseModel):
    """The arguments the model may pass to `list_tool_results`."""

    model_config = ConfigDict(extra="forbid")

    limit: int | None = Field(default=None, ge=1)
    tool_name: str | None = None
    # Where to continue: the listing's header names the reference to pass, so the schema needs no description.
    after: str | None = None


class ListToolResults(ReadBackTool):
    """
    A Haystack `Tool` that lists the tool results offloaded in the current conversation, newest first.

    Each line gives a result's reference (for `read_tool_result`), the tool that produced it, its kind and size, and
    when it was stored. Like `ReadToolResult` it lists through the *current run's* store from `hook_context`, so in a
    multi-user server a run sees its own session's results and nothing else; a `store` given here is only a fallback.

    The tool name comes from the store's metadata: our hooks record it with ``write(..., tool_name=...)``. Haystack's
    stock `ToolResultOffloadHook` only passes a key, ``{step}_{tool_name}_{call_id}.{ext}``; for those results the
    tool name is inferred from the key by matching the names of this run's tools (marked "inferred from key"), and
    otherwise shown as not recorded, with the key.

    The store must be able to list: `FsspecToolResultStore`, or any store with ``list`` and ``list_async`` (the
    `ListableResults` Protocol), whose records have the attributes of `StoredResult` (``reference``, ``key``,
    ``tool_name``, ``kind``, ``size``, ``created``); with any other store the model gets an error result saying so.
    This tool's output is never worth offloading: see `READ_BACK_TOOL_NAMES`. Each listing counts once in
    ``offload.readback.calls`` as ``list`` (`metrics.read_back`); a failed one is not counted.

    Usage example:

    ```python
    from haystack_integrations.offload import ListToolResults, FsspecToolResultStore

    store = FsspecToolResultStore("memory://results").for_session("acme", "chat-42")
    store.write(key="1_web_search_call_1.txt", content="...", tool_name="web_search")
    print(ListToolResults(store=store).invoke())
    ```
    """

    arguments_model = ListToolResultsArguments

    def __init__(
        self,
        *,
        store: ToolResultStore | None = None,
        default_limit: int = 20,
        max_limit: int = 100,
        raise_on_error: bool = False,
    ) -> None:
        """
        Create the tool. The module-level `list_tool_results` is one with the defaults.

        :param store: Fallback store for runs whose `hook_context` carries none (leave unset in multi-user servers).
        :param default_limit: How many results to list when the model does not say.
        :param max_limit: The most results one call lists.
        :param raise_on_error: Raise `ToolInvocationError` on failure instead of returning ``"Error: ..."``.
        :raises ValueError: If a limit is not positive or `default_limit` exceeds `max_limit`.
        """
        if default_limit <= 0 or max_limit <= 0:
            raise ValueError("default_limit and max_limit must be positive.")
        if default_limit > max_limit:
            raise ValueError(f"default_limit ({default_limit}) must not exceed max_limit ({max_limit}).")
        self.default_limit = default_limit
        self.max_limit = max_limit
        super().__init__(
            name=LIST_TOOL_RESULTS_NAME,
            description=DESCRIPTION,
            parameters=argument_schema(ListToolResultsArguments),
            store=store,
            raise_on_error=raise_on_error,
        )

    async def _run_async(self, store: ToolResultStore, arguments: Any, state: State | None) -> ToolOutput:
        """List a page (or, from a store that lists only whole, the listing cut to a page) of the run's results."""
        if isinstance(store, PagedResults):
            pages = _Pages(self, arguments, _run_tool_names(state))
            while pages.wanted():
                pages.add(await store.list_page_async(limit=pages.page_size(), after=pages.after))
            self._count_read("list", 0, store)
            return pages.render()
        if not isinstance(store, ListableResults):
            raise _cannot_list()
        records = await store.list_async()
        self._count_read("list", 0, store)  # a listing reads no stored result's bytes
        return self._render(records, arguments, state)

    def _limit(self, arguments: ListToolResultsArguments) -> int:
        return min(arguments.limit or self.default_limit, self.max_limit)

    def _render(self, records: Iterable[Any], arguments: ListToolResultsArguments, state: State | None) -> str:
        # A store that lists only whole: the page is cut here.
        tool_names = _run_tool_names(state)
        rows = [(record, *_tool_of(record, tool_names)) for record in records]
        if arguments.after is not None:
            position = next(
                (index for index, row in enumerate(rows) if getattr(row[0], "reference", None) == arguments.after), None
            )
            rows = rows[position + 1 :] if position is not None else []
        if arguments.tool_name:
            rows = [row for row in rows if row[1] == arguments.tool_name]
        limit = self._limit(arguments)
        shown = rows[:limit]
        after = getattr(shown[-1][0], "reference", None) if len(shown) < len(rows) else None
        return _rendered(shown, arguments, after, self.max_limit)

    def _init_parameters(self) -> dict[str, Any]:
        return {**super()._init_parameters(), "default_limit": self.default_limit, "max_limit": self.max_limit}


class _Pages:
    """The pages one call reads: one page, or, with a tool_name filter, pages until enough of that tool's results."""

    def __init__(self, tool: ListToolResults, arguments: ListToolResultsArguments, tool_names: Sequence[str]) -> None:
        self.arguments = arguments
        self.tool_names = tool_names
        self.limit = tool._limit(arguments)
        self.max_limit = tool.max_limit
        self.after = arguments.after
        self.rows: list[tuple[Any, str | None, str]] = []
        self.pages = 0
        self.more = True

    def wanted(self) -> bool:
        if not self.more or len(self.rows) >= self.limit:
            return False
        return self.pages == 0 or (bool(self.arguments.tool_name) and self.pages < MAX_FILTERED_PAGES)

    def page_size(self) -> int:
        # Filtered, a page is as large as one call may show: fewer LISTs for a rare tool.
        return self.max_limit if self.arguments.tool_name else self.limit

    def add(self, page: Any) -> None:
        self.pages += 1
        records = list(getattr(page, "results", []))
        for index, record in enumerate(records):
            row = (record, *_tool_of(record, self.tool_names))
            if self.arguments.tool_name and row[1] != self.arguments.tool_name:
                continue
            self.rows.append(row)
            # Cut inside the page (or at its end, with more after it): the next call continues after the last shown.
            if len(self.rows) == self.limit and (
                index < len(records) - 1 or getattr(page, "next_after", None) is not None
            ):
                self.after, self.more = getattr(record, "reference", None), True
                return
        self.after = getattr(page, "next_after", None)
        self.more = self.after is not None

    def render(self) -> str:
        return _rendered(self.rows, self.arguments, self.after if self.more else None, self.max_limit)


def _rendered(
    shown: Sequence[tuple[Any, str | None, str]], arguments: ListToolResultsArguments, after: str | None, max_limit: int
) -> str:
    scope = f" of tool {arguments.tool_name!r}" if arguments.tool_name else ""
    continued = " older" if arguments.after else ""
    if not shown and after is None:
        return f"[no{continued} stored results{scope} in this conversation]"
    if after is not None:
        which = "older" if arguments.after else "newest"
        header = (
            f"[showing the {len(shown)} {which} stored results{scope}; older ones follow: pass after={after!r} "
            f"(limit up to {max_limit}) to see them]"
        )
    else:
        header = (
            f"[{len(shown)}{continued} stored result{'s' if len(shown) != 1 else ''}{scope} in this conversation, "
            "newest first]"
        )
    return "\n".join([header, *(_line(record, tool, how) for record, tool, how in shown)])


def _cannot_list() -> ReadBackToolError:
    return ReadBackToolError(
        "This conversation's result store cannot list its results; use the references shown where results were "
        "offloaded."
    )


def _run_tool_names(state: State | None) -> Sequence[str]:
    tools = state.data.get("tools") if state is not None else None
    return [name for tool in tools or () if isinstance(name := getattr(tool, "name", None), str)]


def _tool_of(record: Any, tool_names: Sequence[str]) -> tuple[str | None, str]:
    """Return the record's tool name and how it is known: "recorded", "inferred" or "unknown"."""
    recorded = getattr(record, "tool_name", None)
    if recorded:
        return str(recorded), "recorded"
    key = str(getattr(record, "key", "") or "")
    step = _HAYSTACK_KEY_STEP.match(key)
    if step is not None:
        rest = key[step.end() :]
        # Tool names and call ids may both contain "_": the longest tool name that fits the key wins.
        candidates = [name for name in tool_names if rest.startswith(f"{_UNSAFE_KEY_CHARS.sub('_', name)}_")]
        if candidates:
            return max(candidates, key=len), "inferred"
    return None, "unknown"


def _line(record: Any, tool: str | None, how: str) -> str:
    if how == "recorded":
        tool_text = f"tool: {tool}"
    elif how == "inferred":
        tool_text = f"tool: {tool} (inferred from key)"
    else:
        tool_text = f"tool: not recorded (key {getattr(record, 'key', '?')})"
    created = getattr(record, "created", None)
    created_text = created.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if isinstance(created, datetime) else "?"
    kind = getattr(record, "kind", "?")
    size = getattr(record, "size", "?")
    return f"- {getattr(record, 'reference', '?')} | {tool_text} | {kind}, {size} bytes | stored {created_text}"


list_tool_results = ListToolResults()
"""The `list_tool_results` tool with default limits, listing through each run's store from `hook_context`."""
