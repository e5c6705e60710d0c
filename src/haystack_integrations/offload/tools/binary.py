"""
What a binary result is: an image a vision model can look at, text stored as bytes, or something to describe.

Haystack's offload hook stores image and file content as bytes under a key ending in the extension of its MIME type
(``3_render_chart_call_1.png``), so the key says what to expect before anything is read; the first bytes (magic
numbers, via `filetype`, which Haystack itself depends on) confirm it.
"""

import mimetypes
import posixpath

import filetype  # type: ignore[import-untyped]

from haystack_integrations.offload.tools.paging import complete_length

# Image types the major vision APIs accept inside a tool result (OpenAI, Anthropic, Gemini all take these four).
VISION_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})

# filetype needs at most this many leading bytes to recognise a format.
SNIFF_BYTES = 262

_TEXT_CONTROLS = frozenset(b"\t\n\r\f\b\x1b")


def mime_from_key(key: str | None) -> str | None:
    """
    Guess a MIME type from the extension at the end of a key or reference.

    :param key: The key the writer gave (or a reference that ends with it), if known.
    :returns: The MIME type, or None when the extension says nothing.
    """
    if not key:
        return None
    extension = posixpath.splitext(key)[1].lower()
    if not extension:
        return None
    return mimetypes.types_map.get(extension) or mimetypes.guess_type(f"result{extension}", strict=False)[0]


def mime_from_bytes(head: bytes) -> str | None:
    """
    Recognise a format from its first bytes.

    :param head: The first bytes of the content (`SNIFF_BYTES` are enough).
    :returns: The MIME type, or None when the bytes match no known format.
    """
    guess = filetype.guess(head)
    return str(guess.mime) if guess is not None else None


def is_vision_image(mime: str | None) -> bool:
    """
    Tell whether a MIME type is an image a vision model can be shown.

    :param mime: The MIME type, if known.
    :returns: True for PNG, JPEG, GIF and WebP.
    """
    return mime in VISION_IMAGE_TYPES


def looks_like_text(data: bytes, *, at_end: bool) -> bool:
    """
    Tell whether bytes are UTF-8 text (a CSV or JSON file stored as bytes) rather than binary data.

    :param data: Bytes read from the start of a character (a page or the head of the content).
    :param at_end: Whether `data` reaches the end of the content (otherwise a cut character at the end is allowed).
    :returns: True when the bytes decode as UTF-8 and hold no NUL or unusual control characters.
    """
    sample = data if at_end else data[: complete_length(data)]
    try:
        text = sample.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not any(ord(char) < 32 and ord(char) not in _TEXT_CONTROLS for char in text)


def describe_binary(*, size: int, mime: str | None, head: bytes, preview_bytes: int) -> str:
    """
    Describe a binary result in one line, with a short hex preview of its first bytes.

    :param size: The result's size in bytes.
    :param mime: Its MIME type, if known.
    :param head: Its first bytes.
    :param preview_bytes: How many of them to show.
    :returns: A description for the model.
    """
    kind = mime or "unknown binary format"
    preview = head[:preview_bytes].hex(" ")
    more = " ..." if size > preview_bytes else ""
    return f"binary result ({kind}), {size} bytes; first bytes (hex): {preview}{more}"
