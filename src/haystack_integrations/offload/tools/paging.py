"""
Character pages cut from UTF-8 byte ranges, so a page is one ranged read and no character is split or lost.
"""

from dataclasses import dataclass

# The longest UTF-8 sequence: a page always asks for at least this many bytes, so it holds at least one character.
MAX_UTF8_SEQUENCE = 4


def is_continuation(byte: int) -> bool:
    """
    Tell whether a byte continues a multi-byte UTF-8 character (``0b10xxxxxx``).

    :param byte: One byte value.
    :returns: True for a continuation byte.
    """
    return byte & 0xC0 == 0x80


def sequence_length(lead: int) -> int:
    """
    Return how many bytes the UTF-8 character starting with `lead` takes.

    :param lead: The first byte of a character.
    :returns: 1 to 4; 1 for bytes that cannot start a character (decoding reports those).
    """
    if lead < 0x80:
        return 1
    if lead >> 5 == 0b110:
        return 2
    if lead >> 4 == 0b1110:
        return 3
    if lead >> 3 == 0b11110:
        return 4
    return 1


def leading_continuations(data: bytes) -> int:
    """
    Count the bytes at the start of `data` that belong to a character begun before it (at most 3).

    :param data: Bytes read from the middle of a UTF-8 text.
    :returns: How many bytes to skip to reach the start of a character.
    """
    count = 0
    while count < min(MAX_UTF8_SEQUENCE - 1, len(data)) and is_continuation(data[count]):
        count += 1
    return count


def complete_length(data: bytes) -> int:
    """
    Return the length of the longest prefix of `data` that does not end inside a multi-byte character.

    :param data: Bytes read from a UTF-8 text, possibly cut in the middle of a character at the end.
    :returns: ``len(data)`` when the last character is whole, else the position where that character starts.
    """
    for back in range(1, min(MAX_UTF8_SEQUENCE, len(data)) + 1):
        byte = data[-back]
        if not is_continuation(byte):
            return len(data) - back if sequence_length(byte) > back else len(data)
    return len(data)  # no lead byte in the last four: not UTF-8 here, leave it to the decoder to flag


def prefix_bytes(data: bytes, chars: int) -> int:
    """
    Return how many bytes the first `chars` characters of `data` take, following UTF-8 lead bytes.

    :param data: UTF-8 bytes that start on a character boundary.
    :param chars: How many characters to keep.
    :returns: A byte count no larger than ``len(data)``.
    """
    position = 0
    for _ in range(chars):
        if position >= len(data):
            break
        position += sequence_length(data[position])
    return min(position, len(data))


def decode_text(data: bytes) -> tuple[str, bool]:
    """
    Decode UTF-8 as the store wrote it (``surrogatepass``: lone surrogates round-trip).

    :param data: Bytes that start and end on character boundaries.
    :returns: The text, and False if some bytes were not UTF-8 and were replaced with U+FFFD.
    """
    try:
        return data.decode("utf-8", "surrogatepass"), True
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace"), False


def fetch_size(max_chars: int) -> int:
    """
    Return how many bytes to ask for to fill a page of `max_chars` characters.

    :param max_chars: The page size in characters, at least 1.
    :returns: ``max(max_chars, 4)``: ASCII fills the page exactly, wider characters fill it to fewer characters.
    """
    return max(max_chars, MAX_UTF8_SEQUENCE)


@dataclass(frozen=True)
class Page:
    """One page of a text result, cut on character boundaries."""

    text: str
    """The page's characters."""
    start: int
    """Byte position of the page's first character."""
    end: int
    """Byte position just after the page's last character: where the next page starts."""
    total: int
    """The whole result's size in bytes."""
    requested: int
    """The byte position that was asked for; below `start` when it fell inside a character."""
    exact: bool
    """False when some bytes were not UTF-8 and were replaced with U+FFFD."""

    @property
    def at_end(self) -> bool:
        """Whether this page reaches the end of the result."""
        return self.end >= self.total


def cut_page(data: bytes, *, offset: int, total: int, max_chars: int) -> Page:
    """
    Cut one page of at most `max_chars` characters from bytes read at `offset`.

    :param data: The bytes read at `offset` (normally `fetch_size(max_chars)` of them, fewer at the end).
    :param offset: The byte position `data` was read from.
    :param total: The result's total size in bytes.
    :param max_chars: The most characters the page may hold.
    :returns: The page; its `end` is the offset of the next page.
    """
    skipped = leading_continuations(data) if offset > 0 else 0
    body = data[skipped:]
    if offset + len(data) < total:
        body = body[: complete_length(body)]
    body = body[: prefix_bytes(body, max_chars)]
    text, exact = decode_text(body)
    start = offset + skipped
    return Page(text=text, start=start, end=start + len(body), total=total, requested=offset, exact=exact)
