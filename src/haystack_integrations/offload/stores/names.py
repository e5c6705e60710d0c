"""
Object names: how a write's key, content kind, tool name and time become one safe, unique file name.

A stored result is one object whose name carries its own metadata, so that it works the same on every fsspec backend
(memory and local disk have no object metadata) and costs no extra request::

    20261129T213400123456Z-5f3a9c1e.t.web_search.3_web_search_call_abc.txt
    └────── created ─────┘ └nonce─┘ │ └─ tool ─┘ └─────── key ─────────┘
                                    └ kind: t = text (UTF-8), b = bytes

- `created` is UTC with microseconds, so names sort by time (and one process's writes in write order);
- `nonce` is random, so two writes in one session never collide, whatever key they were given (keys repeat across
  runs: step counters restart and id-less tool calls fall back to positions);
- `kind` records whether `write` was given `str` or `bytes`, so `read` gives back the same type without guessing;
- `key` is the caller's key made safe: odd characters become `_`, and an over-long key (providers send tool-call ids
  of ~1.5 KB) is cut and suffixed with a hash of the original, keeping its extension.
"""

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

ContentKind = Literal["text", "bytes"]

MAX_KEY_LENGTH = 100
MAX_TOOL_NAME_LENGTH = 64
_KIND_CODES: dict[ContentKind, str] = {"text": "t", "bytes": "b"}
_KINDS_BY_CODE: dict[str, ContentKind] = {code: kind for kind, code in _KIND_CODES.items()}
_STAMP_FORMAT = "%Y%m%dT%H%M%S"
_UNSAFE_KEY_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_UNSAFE_TOOL_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_EXTENSION = re.compile(r"\.[A-Za-z0-9]{1,10}$")
_NAME = re.compile(
    r"(?P<stamp>\d{8}T\d{12}Z)-(?P<nonce>[0-9a-f]{8})"
    r"\.(?P<kind>[tb])"
    rf"\.(?P<tool>[A-Za-z0-9_-]{{0,{MAX_TOOL_NAME_LENGTH}}})"
    rf"\.(?P<key>[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{MAX_KEY_LENGTH - 1}}})"
)


@dataclass(frozen=True)
class ParsedName:
    """The metadata carried by an object name."""

    created: datetime
    kind: ContentKind
    tool_name: str | None
    key: str


def safe_key(key: str) -> str:
    """
    Return a bounded key made of ``A-Z a-z 0-9 . _ -`` that does not start with `.`.

    A key that had to change is suffixed with a short hash of the original, so distinct odd keys stay distinct.

    :param key: The caller's key (for Haystack's hook: step, tool name and tool-call id, plus an extension).
    :returns: The safe key.
    """
    cleaned = _UNSAFE_KEY_CHARS.sub("_", key).lstrip(".") or "result"
    if cleaned == key and len(key) <= MAX_KEY_LENGTH:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    match = _EXTENSION.search(cleaned)
    extension = match.group(0) if match else ""
    stem = cleaned[: len(cleaned) - len(extension)]
    room = MAX_KEY_LENGTH - len(extension) - len(digest) - 1
    return f"{stem[:room]}-{digest}{extension}"


def safe_tool_name(tool_name: str | None) -> str:
    """
    Return the tool name as it is recorded in an object name (empty when unknown).

    :param tool_name: The tool's name, or None.
    :returns: The name limited to ``A-Z a-z 0-9 _ -`` and `MAX_TOOL_NAME_LENGTH` characters.
    """
    if not tool_name:
        return ""
    return _UNSAFE_TOOL_CHARS.sub("_", tool_name)[:MAX_TOOL_NAME_LENGTH]


def new_object_name(*, key: str, kind: ContentKind, tool_name: str | None, now: datetime | None = None) -> str:
    """
    Build a fresh, unique object name for one write.

    :param key: The caller's key.
    :param kind: Whether the content was given as text or bytes.
    :param tool_name: The tool that produced the result, if known.
    :param now: The creation time (UTC); defaults to the current time.
    :returns: The object name, also the reference returned to the caller.
    """
    created = (now or datetime.now(UTC)).astimezone(UTC)
    stamp = f"{created.strftime(_STAMP_FORMAT)}{created.microsecond:06d}Z"
    return f"{stamp}-{secrets.token_hex(4)}.{_KIND_CODES[kind]}.{safe_tool_name(tool_name)}.{safe_key(key)}"


def parse_object_name(name: str) -> ParsedName | None:
    """
    Read the metadata out of an object name.

    :param name: A single path segment.
    :returns: The parsed metadata, or None when `name` is not a result written by this library.
    """
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    stamp = match.group("stamp")
    try:
        created = datetime.strptime(stamp[:15], _STAMP_FORMAT).replace(microsecond=int(stamp[15:21]), tzinfo=UTC)
    except ValueError:
        return None
    return ParsedName(
        created=created,
        kind=_KINDS_BY_CODE[match.group("kind")],
        tool_name=match.group("tool") or None,
        key=match.group("key"),
    )
