"""Demo tools that return large, deterministic results, the kind that crowd a context window."""

import hashlib
from collections.abc import Callable

from haystack.tools.tool import Tool


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


WEB_SEARCH = Tool(
    name="web_search",
    description="Search the web and return a page of results.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    function=search_results,
)

SQL_QUERY = Tool(
    name="sql_query",
    description="Dump a database table as CSV.",
    parameters={"type": "object", "properties": {"table": {"type": "string"}}, "required": ["table"]},
    function=sql_rows,
)

DEMO_TOOLS = [WEB_SEARCH, SQL_QUERY]
TOOL_FUNCTIONS: dict[str, Callable[..., str]] = {"web_search": search_results, "sql_query": sql_rows}
