"""
The readers behind `read_tool_result`: a page, a binary result, a search, and the text the model gets for each.

Readers are generators that yield the byte ranges they need; `source.drive` and `source.drive_async` serve them.
"""

import base64
from dataclasses import dataclass, field, fields
from typing import Any

from haystack.dataclasses import ImageContent, TextContent

from haystack_integrations.offload.tools.base import ToolOutput
from haystack_integrations.offload.tools.binary import (
    SNIFF_BYTES,
    describe_binary,
    is_vision_image,
    looks_like_text,
    mime_from_bytes,
    mime_from_key,
)
from haystack_integrations.offload.tools.errors import ReadBackToolError
from haystack_integrations.offload.tools.paging import (
    MAX_UTF8_SEQUENCE,
    Page,
    cut_page,
    fetch_size,
    leading_continuations,
)
from haystack_integrations.offload.tools.readahead import ScanRange
from haystack_integrations.offload.tools.search import SearchOutcome, StreamSearch
from haystack_integrations.offload.tools.source import Kind, Reader, textual_mime

# Bytes decoded and matched per search chunk. Storage is read in larger ranges ahead of the search (see `readahead`):
# this only sets the search's own steps, and so the offsets it reports when it stops early, which do not depend on how
# the bytes were fetched.
SEARCH_CHUNK_BYTES = 1 << 20
# A match shown to the model is cut to this many characters.
MAX_SHOWN_MATCH_CHARS = 200
# Bytes of a binary result shown as hex.
HEX_PREVIEW_BYTES = 32


@dataclass(frozen=True)
class ReadOptions:
    """
    The limits a `ReadToolResult` tool applies to every call: its constructor's arguments of the same names.

    Each is checked here, once: every number must be positive, except `context_chars`, which may be 0.
    """

    page_chars: int
    max_page_chars: int
    max_matches: int
    context_chars: int = field(metadata={"may_be_zero": True})
    max_scan_bytes: int
    regex_timeout: float
    regex_match_chars: int
    max_image_bytes: int
    return_images: bool

    def __post_init__(self) -> None:
        for limit in fields(self):
            value = getattr(self, limit.name)
            if limit.metadata.get("may_be_zero"):
                if value < 0:
                    raise ValueError(f"{limit.name} must not be negative, got {value!r}.")
            elif limit.type is not bool and value <= 0:
                raise ValueError(f"{limit.name} must be positive, got {value!r}.")
        if self.page_chars > self.max_page_chars:
            raise ValueError(f"page_chars ({self.page_chars}) must not exceed max_page_chars ({self.max_page_chars}).")


def _past_end(offset: int, total: int) -> ReadBackToolError:
    return ReadBackToolError(
        f"offset={offset} is past the end of this result, which is {total} bytes long; use an offset below {total}."
    )


def read_text(*, offset: int, max_chars: int, label: str = "text result") -> Reader[ToolOutput]:
    """
    Read one page of a text result: one range of about `max_chars` bytes.

    :param offset: Byte position to start at (0, or a `next` offset from a previous header).
    :param max_chars: The most characters the page may hold.
    :param label: What the header calls the result.
    :returns: A reader that returns the header line and the page.
    """
    data, total = yield offset, offset + fetch_size(max_chars)
    if offset > total:
        raise _past_end(offset, total)
    return format_page(cut_page(data, offset=offset, total=total, max_chars=max_chars), label=label)


def format_page(page: Page, *, label: str) -> str:
    """
    Render a page as its header line followed by its text.

    :param page: The page.
    :param label: What the header calls the result.
    :returns: The tool result text.
    """
    parts = [f"{label}: {page.total} bytes of UTF-8"]
    if page.total == 0:
        parts.append("the result is empty")
    else:
        parts.append(f"this page: offset {page.start} to {page.end}, {len(page.text)} characters")
        if page.start != page.requested:
            parts.append(f"offset {page.requested} is inside a character, so the page starts at the next one")
        if not page.exact:
            parts.append("some bytes are not valid UTF-8 and are shown as U+FFFD")
        if page.at_end:
            parts.append("end of result")
        else:
            parts.append(f"more follows: call read_tool_result again with offset={page.end}")
    return f"[{' | '.join(parts)}]\n{page.text}"


def read_binary(*, offset: int, max_chars: int, key: str | None, options: ReadOptions) -> Reader[ToolOutput]:
    """
    Read a result stored as bytes: an image comes back as image content, UTF-8 text as a page, anything else is
    described (kind, size, a hex preview).

    An image the key announces is read in one range of up to `max_image_bytes`; otherwise one page-sized range tells
    the kind from its first bytes (only an image the key did not announce costs a second range).

    :param offset: Byte position to start at.
    :param max_chars: The page size, for bytes that turn out to be text.
    :param key: The writer's key (its extension hints at the format), if known.
    :param options: The tool's limits.
    :returns: A reader that returns the tool result.
    """
    key_mime = mime_from_key(key)
    if options.return_images and is_vision_image(key_mime):
        # One read serves both cases: the whole image when it fits the limit, else its head to describe it.
        data, total = yield 0, options.max_image_bytes
        mime = mime_from_bytes(data[:SNIFF_BYTES])
        if is_vision_image(mime) and len(data) == total:
            return _image(data, mime=str(mime))
        if not is_vision_image(mime):
            note = f"stored as {key_mime}, but its bytes are not an image this tool can show"
            return _describe(total=total, mime=mime, head=data, offset=0, options=options, note=note)
        return _describe(total=total, mime=mime, head=data, offset=0, options=options)

    start = offset
    data, total = yield start, start + max(fetch_size(max_chars), SNIFF_BYTES if offset == 0 else 0)
    if offset > total:
        raise _past_end(offset, total)
    mime = mime_from_bytes(data[:SNIFF_BYTES]) if offset == 0 else None
    if options.return_images and is_vision_image(mime) and total <= options.max_image_bytes:
        if len(data) < total:
            data, total = yield 0, total
        return _image(data[:total], mime=str(mime))
    skipped = leading_continuations(data) if offset > 0 else 0
    if mime is None and looks_like_text(data[skipped:], at_end=offset + len(data) >= total):
        page = cut_page(data[: fetch_size(max_chars)], offset=offset, total=total, max_chars=max_chars)
        label = f"file result ({key_mime})" if key_mime else "binary result"
        return format_page(page, label=f"{label} shown as UTF-8 text")
    return _describe(total=total, mime=mime or key_mime, head=data, offset=offset, options=options)


def _image(data: bytes, *, mime: str) -> ToolOutput:
    header = f"[image result ({mime}), {len(data)} bytes: shown below]"
    return [TextContent(text=header), ImageContent(base64_image=base64.b64encode(data).decode("ascii"), mime_type=mime)]


def _describe(
    *, total: int, mime: str | None, head: bytes, offset: int, options: ReadOptions, note: str | None = None
) -> str:
    description = describe_binary(size=total, mime=mime, head=head, preview_bytes=HEX_PREVIEW_BYTES)
    notes = [note] if note else []
    if offset:
        notes.append(f"the preview starts at offset {offset}")
    if is_vision_image(mime):
        if not options.return_images:
            notes.append("this tool is configured not to return images")
        elif total > options.max_image_bytes:
            notes.append(f"too large to show as an image here (the limit is {options.max_image_bytes} bytes)")
    else:
        notes.append("it is not text, so it cannot be read as pages or searched")
    return f"[{description}{''.join(f' | {note}' for note in notes)}]"


def search_result(
    *,
    kind: Kind,
    key: str | None,
    pattern: Any,
    shown_pattern: str,
    offset: int,
    max_matches: int,
    options: ReadOptions,
) -> Reader[ToolOutput]:
    """
    Search a result in ranged chunks and list the matches with some context (see `search.StreamSearch`).

    Each chunk is asked for as a `ScanRange`, so the driver may serve it from larger ranges read ahead.

    :param kind: Whether the result was stored as text or bytes.
    :param key: The writer's key, if known.
    :param pattern: The compiled `regex` pattern.
    :param shown_pattern: How the header shows what was searched for.
    :param offset: Byte position to start searching from.
    :param max_matches: Stop after this many matches.
    :param options: The tool's limits.
    :returns: A reader that returns the matches as text.
    """
    key_mime = mime_from_key(key)
    if kind == "bytes" and key_mime is not None and not textual_mime(key_mime):
        raise ReadBackToolError("This result is binary data, which cannot be searched; read it to see what it is.")
    search = StreamSearch(
        pattern=pattern,
        start=offset,
        max_matches=max_matches,
        context_chars=options.context_chars,
        max_match_chars=options.regex_match_chars,
        chunk_bytes=SEARCH_CHUNK_BYTES,
        max_scan_bytes=options.max_scan_bytes,
        timeout=options.regex_timeout,
    )
    # The search reads on sequentially until its scan limit (its last chunk may start just before the limit, and a
    # character cut at `offset` is skipped): the driver may read ahead that far, never further.
    until = offset + MAX_UTF8_SEQUENCE + options.max_scan_bytes + SEARCH_CHUNK_BYTES
    first = True
    while (byte_range := search.next_range()) is not None:
        data, total = yield ScanRange(*byte_range, until=until)
        if first and offset > total:
            raise _past_end(offset, total)
        first = False
        search.feed(data, total)
    return format_search(search.outcome(), shown_pattern=shown_pattern)


def format_search(outcome: SearchOutcome, *, shown_pattern: str) -> str:
    """
    Render a search outcome: a header line, then one line per match.

    :param outcome: What the search found.
    :param shown_pattern: How to show what was searched for.
    :returns: The tool result text.
    """
    count = len(outcome.matches)
    parts = [
        f"search for {shown_pattern} in a result of {outcome.total} bytes",
        f"scanned offset {outcome.start} to {outcome.scanned_to}",
        f"{count} match{'es' if count != 1 else ''}",
    ]
    if outcome.reason == "end":
        parts.append("searched to the end of the result")
    elif outcome.reason == "max_matches":
        parts.append(f"stopped at {count} matches; more may follow: search again with offset={outcome.resume}")
    elif outcome.reason == "scan_limit":
        parts.append(f"stopped before the end (scan limit); search again with offset={outcome.resume} to continue")
    elif outcome.reason == "timeout":
        parts.append(
            f"the regular expression took too long and was stopped; simplify it or search again with "
            f"offset={outcome.resume}"
        )
    else:
        parts.append(f"stopped at offset {outcome.scanned_to}: the result is not UTF-8 text from there")
    lines = [f"[{' | '.join(parts)}]"]
    for match in outcome.matches:
        text = match.text
        if len(text) > MAX_SHOWN_MATCH_CHARS:
            text = text[:MAX_SHOWN_MATCH_CHARS] + "…"
        lines.append(f"offset {match.position}: {_one_line(match.before)}⟦{_one_line(text)}⟧{_one_line(match.after)}")
    if count:
        lines.append("(read the page at a match with read_tool_result and that offset)")
    return "\n".join(lines)


def _one_line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
