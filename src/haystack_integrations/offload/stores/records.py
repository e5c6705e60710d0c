"""Validated records describing stored results."""

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from haystack_integrations.offload.stores.names import ContentKind


class StoredResult(BaseModel):
    """
    What a store knows about one stored result, without reading it.

    Returned by `FsspecToolResultStore.list` and `FsspecToolResultStore.info`.
    """

    model_config = ConfigDict(frozen=True)

    reference: str = Field(description="The reference to pass to `read`, relative to the store's scope.")
    kind: ContentKind = Field(description="'text' if the result was written as a string, 'bytes' otherwise.")
    size: int = Field(ge=0, description="Stored size in bytes (UTF-8 encoded size for text).")
    created: datetime = Field(description="When the result was written (UTC, microsecond precision).")
    tool_name: str | None = Field(default=None, description="The tool that produced the result, when recorded.")
    key: str = Field(description="The key the writer gave, made safe and bounded.")


class ResultsPage(BaseModel):
    """
    One page of a listing, newest first, and where the next one starts.

    Returned by `FsspecToolResultStore.list_page`.
    """

    model_config = ConfigDict(frozen=True)

    results: list[StoredResult] = Field(description="The page's results, newest first.")
    next_after: str | None = Field(
        default=None,
        description="Pass as ``after`` for the next page: the last result's reference. None: no more results.",
    )
