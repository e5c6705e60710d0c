"""
The pure parts of read-back: cutting character pages out of UTF-8 byte ranges, and searching a stream of chunks.

No store here: bytes are sliced from memory exactly as a ranged GET would return them, so every page edge and every
chunk edge can be tried.
"""

import itertools
import re

import pytest
import regex
from read_back_helpers import multilingual

from haystack_integrations.offload.tools.paging import (
    complete_length,
    cut_page,
    fetch_size,
    leading_continuations,
)
from haystack_integrations.offload.tools.search import SearchOutcome, StreamSearch

TEXT = multilingual(3000, seed=3) + "\ud800 a lone surrogate, as the store's surrogatepass writes it"
DATA = TEXT.encode("utf-8", "surrogatepass")


def _pages(data: bytes, max_chars: int, start: int = 0) -> list[tuple[int, int, str]]:
    """Page through `data` the way the tool does, following each page's end."""
    pages = []
    offset = start
    while True:
        page = cut_page(
            data[offset : offset + fetch_size(max_chars)], offset=offset, total=len(data), max_chars=max_chars
        )
        pages.append((page.start, page.end, page.text))
        assert page.exact
        assert len(page.text) <= max_chars
        if page.at_end:
            return pages
        assert page.end > offset, "a page must make progress"
        offset = page.end


@pytest.mark.parametrize("max_chars", [1, 2, 3, 4, 5, 7, 64, 1000, 10_000])
def test_pages_reassemble_exactly_for_every_page_size(max_chars: int) -> None:
    pages = _pages(DATA, max_chars)
    assert "".join(text for _, _, text in pages) == TEXT
    # Contiguous byte ranges: every byte on exactly one page.
    assert pages[0][0] == 0
    assert all(previous[1] == following[0] for previous, following in itertools.pairwise(pages))
    assert pages[-1][1] == len(DATA)


def test_a_page_moves_about_the_page_size_and_never_splits_a_character() -> None:
    for start, end, text in _pages(DATA, 100)[:-1]:
        # At most 3 bytes short: the start of a character that did not fit, re-read by the next page.
        assert 97 <= end - start <= 100
        assert text.encode("utf-8", "surrogatepass") == DATA[start:end]


def test_an_offset_inside_a_character_starts_at_the_next_character() -> None:
    emoji = "🎉".encode()
    data = b"ab" + emoji + b"cd"
    for inside in (3, 4, 5):
        page = cut_page(data[inside:], offset=inside, total=len(data), max_chars=10)
        assert (page.requested, page.start, page.text) == (inside, 6, "cd")


def test_a_range_ending_inside_a_character_stops_before_it() -> None:
    data = "日本".encode()  # 6 bytes
    for cut in range(1, 6):
        page = cut_page(data[:cut], offset=0, total=len(data), max_chars=10)
        assert page.end == (3 if cut >= 3 else 0)
        assert page.text == ("日" if cut >= 3 else "")


def test_the_utf8_helpers_at_the_edges() -> None:
    assert complete_length(b"") == 0
    assert complete_length("aé".encode()) == 3
    assert complete_length(b"a" + "é".encode()[:1]) == 1
    assert complete_length("🎉".encode()[:3]) == 0
    assert leading_continuations("🎉".encode()[1:]) == 3
    assert leading_continuations(b"abc") == 0
    # Not UTF-8 at all: left to the decoder, which flags it rather than losing it.
    page = cut_page(b"\xff\xfeok", offset=0, total=4, max_chars=10)
    assert not page.exact and page.text.endswith("ok") and page.end == 4


def test_a_combining_mark_may_start_a_page_but_the_text_joins_back_unchanged() -> None:
    text = "e\u0301" * 50
    data = text.encode()
    pages = _pages(data, 3)
    assert "".join(page for _, _, page in pages) == text


def _search_all(
    data: bytes, pattern: "regex.Pattern[str]", *, chunk: int, context: int = 5, span: int = 50
) -> StreamSearch:
    search = StreamSearch(
        pattern=pattern,
        start=0,
        max_matches=10_000,
        context_chars=context,
        max_match_chars=span,
        chunk_bytes=chunk,
        max_scan_bytes=1 << 40,
        timeout=5.0,
    )
    while (byte_range := search.next_range()) is not None:
        search.feed(data[byte_range[0] : byte_range[1]], len(data))
    return search


@pytest.mark.parametrize("chunk", [16, 17, 64, 333, 4096, 1 << 20])
@pytest.mark.parametrize("needle", ["日本語", "🎉🚀", "e\u0301", "words and", "x" * 30])
def test_chunked_search_finds_exactly_what_a_whole_text_search_finds(chunk: int, needle: str) -> None:
    expected = [match.start() for match in re.finditer(re.escape(needle), TEXT)]
    assert expected, "the needle must occur"
    outcome = _search_all(DATA, regex.compile(regex.escape(needle)), chunk=chunk, span=len(needle)).outcome()
    found = [match.position for match in outcome.matches]
    assert found == [len(TEXT[:index].encode("utf-8", "surrogatepass")) for index in expected]
    assert {match.text for match in outcome.matches} == {needle}
    assert outcome.reason == "end" and outcome.scanned_to == len(DATA)
    for match in outcome.matches:
        index = TEXT.index(needle, len(DATA[: match.position].decode("utf-8", "surrogatepass")))
        assert match.before == TEXT[max(0, index - 5) : index]
        assert match.after == TEXT[index + len(needle) : index + len(needle) + 5]


@pytest.mark.parametrize("chunk", [32, 100, 1024])
def test_chunked_regex_search_matches_a_whole_text_search(chunk: int) -> None:
    pattern = r"[a-z]+ \d{3}|café|\p{Han}{2,}"
    expected = [(m.start(), m.group(0)) for m in regex.finditer(pattern, TEXT)]
    outcome = _search_all(DATA, regex.compile(pattern), chunk=chunk, span=40).outcome()
    assert [(len(DATA[: m.position].decode("utf-8", "surrogatepass")), m.text) for m in outcome.matches] == expected


def test_search_stops_at_the_match_bound_and_says_where_to_resume() -> None:
    data = ("....needle" * 100).encode()
    search = StreamSearch(
        pattern=regex.compile("needle"),
        start=0,
        max_matches=3,
        context_chars=2,
        max_match_chars=6,
        chunk_bytes=64,
        max_scan_bytes=1 << 30,
        timeout=5.0,
    )
    reads = 0
    while (byte_range := search.next_range()) is not None:
        reads += 1
        search.feed(data[byte_range[0] : byte_range[1]], len(data))
    outcome = search.outcome()
    assert [m.position for m in outcome.matches] == [4, 14, 24]
    assert (outcome.reason, outcome.resume, reads) == ("max_matches", 30, 1)


def test_search_stops_at_the_scan_limit_without_losing_a_match_at_the_edge() -> None:
    data = ("a" * 95 + "needle").encode()
    first = StreamSearch(
        pattern=regex.compile("needle"),
        start=0,
        max_matches=10,
        context_chars=0,
        max_match_chars=6,
        chunk_bytes=98,
        max_scan_bytes=98,
        timeout=5.0,
    )
    while (byte_range := first.next_range()) is not None:
        first.feed(data[byte_range[0] : byte_range[1]], len(data))
    outcome = first.outcome()
    assert outcome.matches == [] and outcome.reason == "scan_limit"
    assert outcome.resume is not None and outcome.resume <= 95
    resumed = _search_from(data, outcome.resume)
    assert [m.position for m in resumed.matches] == [95]


def _search_from(data: bytes, start: int) -> SearchOutcome:
    search = StreamSearch(
        pattern=regex.compile("needle"),
        start=start,
        max_matches=10,
        context_chars=0,
        max_match_chars=6,
        chunk_bytes=1024,
        max_scan_bytes=1 << 30,
        timeout=5.0,
    )
    while (byte_range := search.next_range()) is not None:
        search.feed(data[byte_range[0] : byte_range[1]], len(data))
    return search.outcome()


def test_a_catastrophic_regular_expression_is_stopped_by_its_time_budget() -> None:
    data = ("a" * 40 + "!").encode()
    search = StreamSearch(
        pattern=regex.compile(r"(a|aa)+c"),
        start=0,
        max_matches=10,
        context_chars=0,
        max_match_chars=100,
        chunk_bytes=1024,
        max_scan_bytes=1 << 30,
        timeout=0.05,
    )
    while (byte_range := search.next_range()) is not None:
        search.feed(data[byte_range[0] : byte_range[1]], len(data))
    assert search.outcome().reason == "timeout"


def test_search_stops_where_the_bytes_stop_being_text_and_keeps_what_came_before() -> None:
    # The needle sits near the end of the first 32-byte chunk, where a match waits for the next chunk's context.
    data = b"x" * 24 + b"needle" + b"ab" + b"\xff\xfe\x00binary"
    search = StreamSearch(
        pattern=regex.compile("needle"),
        start=0,
        max_matches=10,
        context_chars=3,
        max_match_chars=6,
        chunk_bytes=32,
        max_scan_bytes=1 << 30,
        timeout=5.0,
    )
    while (byte_range := search.next_range()) is not None:
        search.feed(data[byte_range[0] : byte_range[1]], len(data))
    outcome = search.outcome()
    assert [match.position for match in outcome.matches] == [24]
    assert (outcome.reason, outcome.scanned_to) == ("not_text", 32)
