"""
Object names: how a write's key, content kind, tool name and time become one safe, unique file name.

A result's name carries its metadata (``0<time counting down>-<nonce>.<kind>.<tool>.<key>``), so it needs no object
metadata and no extra request, and a session's results sort newest first in S3's lexical order (`listing_order`);
names of the layout before (``<YYYYmmddTHHMMSSffffff>Z-<nonce>...``, counting up) stay readable and sort after them.
A local write's temporary file (``.tmp-<time>-<hex>``) carries its writer's time.
"""

import hashlib
import os
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
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
TEMPORARY_PREFIX = ".tmp-"
TEMPORARY_GRACE = timedelta(hours=1)
"""How long a temporary file may stand before purges take it for a killed writer's (no write takes that long)."""
PROBE_GRACE = timedelta(minutes=10)
"""How long a probe key (the exclusive-create check's, named as a temporary file) may stand on a store that writes no
temporary files (object stores) before purges take it for a killed prober's: a probe is a few requests, each within
its retry deadline."""
# Older versions named temporary files without a time (``.tmp-<16 hex>``); those are matched too.
_TEMPORARY = re.compile(r"\.tmp-(?:(?P<stamp>\d{8}T\d{12})Z-)?[0-9a-f]{16}")
NEWEST_FIRST_MARK = "0"
"""The first character of a result name that counts down: below every digit a legacy name starts with."""
_COUNTDOWN_DIGITS = 17
_COUNTDOWN_TOP = 10**_COUNTDOWN_DIGITS - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAME = re.compile(
    rf"(?:{NEWEST_FIRST_MARK}(?P<countdown>\d{{{_COUNTDOWN_DIGITS}}})|(?P<stamp>\d{{8}}T\d{{12}}Z))"
    r"-(?P<nonce>[0-9a-f]{8})"
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
    stamp = _countdown(now)
    return f"{stamp}-{os.urandom(4).hex()}.{_KIND_CODES[kind]}.{safe_tool_name(tool_name)}.{safe_key(key)}"


def is_object_name(name: str) -> bool:
    """
    Whether `name` is a result written by this library: `parse_object_name` would not return None, found without
    building its metadata (every read checks its reference's name; most need nothing more).

    :param name: A single path segment.
    :returns: True if it parses.
    """
    match = _NAME.fullmatch(name)
    if match is None:
        return False
    # Any 17 digits count down to a time between 1970 and 5138: only an old-style stamp can name no date.
    return match.group("countdown") is not None or _parse_stamp(match.group("stamp")) is not None


@lru_cache(maxsize=4096)  # a page's reference is often paged again: its kind and age are parsed once
def parse_object_name(name: str) -> ParsedName | None:
    """
    Read the metadata out of an object name.

    :param name: A single path segment.
    :returns: The parsed metadata, or None when `name` is not a result written by this library.
    """
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    countdown = match.group("countdown")
    created = _parse_countdown(countdown) if countdown is not None else _parse_stamp(match.group("stamp"))
    if created is None:
        return None
    return ParsedName(
        created=created,
        kind=_KINDS_BY_CODE[match.group("kind")],
        tool_name=match.group("tool") or None,
        key=match.group("key"),
    )


def is_legacy_name(name: str) -> bool:
    """
    :param name: A single path segment that `parse_object_name` accepts.
    :returns: Whether it was written before names counted down (it sorts after them, oldest first).
    """
    return not name.startswith(NEWEST_FIRST_MARK)


def listing_order(name: str) -> tuple[bool, str]:
    """
    The order results are listed in, newest first: names that count down in lexical order, then legacy names in
    reverse lexical order (theirs count up).

    :param name: A result name (`parse_object_name` accepts it).
    :returns: A sort key.
    """
    if is_legacy_name(name):
        # Reverse lexical order of names made of ASCII characters: complement each code point.
        return True, "".join(chr(0x7F - ord(char)) for char in name)
    return False, name


def new_temporary_name(*, now: datetime | None = None) -> str:
    """
    Build a fresh name for a local write's temporary file.

    :param now: The writer's time (UTC); defaults to the current time.
    :returns: A name that starts with `TEMPORARY_PREFIX` and carries the time.
    """
    return f"{TEMPORARY_PREFIX}{_stamp(now)}-{secrets.token_hex(8)}"


def is_temporary_name(name: str) -> bool:
    """
    :param name: A single path segment.
    :returns: Whether it names a local write's temporary file (of this version, or of one before it).
    """
    return _TEMPORARY.fullmatch(name) is not None


def is_stale_temporary(name: str, *, now: datetime | None = None, grace: timedelta = TEMPORARY_GRACE) -> bool:
    """
    Whether a temporary file was left behind by a writer that died (killed mid-write, the machine lost power).

    A write in progress is never older than `grace`; neither is its time more than `grace` ahead (a writer's clock
    hours fast must not keep its leftovers for hours). A name without a time comes from an older version, whose
    writers are gone once this one runs: it is stale.

    :param name: A single path segment.
    :param now: The time to judge at; the current time by default.
    :param grace: How long a write may take; ``timedelta(0)`` makes every temporary file stale (`end_session`).
    :returns: Whether `name` is a temporary file to remove.
    """
    match = _TEMPORARY.fullmatch(name)
    if match is None:
        return False
    stamp = match.group("stamp")
    created = _parse_stamp(stamp) if stamp is not None else None
    return created is None or abs((now or datetime.now(UTC)) - created) >= grace


def _stamp(now: datetime | None) -> str:
    created = (now or datetime.now(UTC)).astimezone(UTC)
    return f"{created.strftime(_STAMP_FORMAT)}{created.microsecond:06d}Z"


def _countdown(now: datetime | None) -> str:
    # The mark and 17 digits: 10**17 - 1 minus microseconds since the epoch, so later names sort first. Names written
    # before start with a digit above the mark (their year), so they sort after every one of these.
    if now is None:
        micros = time.time_ns() // 1000  # every write names one object: no datetime to build and take apart
    else:
        elapsed = now.astimezone(UTC) - _EPOCH
        micros = (elapsed.days * 86_400 + elapsed.seconds) * 1_000_000 + elapsed.microseconds
    # Clamped: a clock before 1970 (or past the year 5138) still makes a well-formed name.
    return f"{NEWEST_FIRST_MARK}{_COUNTDOWN_TOP - min(max(micros, 0), _COUNTDOWN_TOP):0{_COUNTDOWN_DIGITS}d}"


def _parse_countdown(countdown: str) -> datetime | None:
    try:
        return _EPOCH + timedelta(microseconds=_COUNTDOWN_TOP - int(countdown))
    except OverflowError:
        return None


def _parse_stamp(stamp: str) -> datetime | None:
    """The time of a ``20261129T213400123456`` stamp (a trailing ``Z`` is ignored), or None if it is no date."""
    # By position, not strptime: every read parses its reference's stamp, and strptime costs ten times as much.
    if len(stamp) < 21 or stamp[8] != "T" or not (stamp[:8].isdecimal() and stamp[9:21].isdecimal()):
        return None
    try:
        return datetime(
            int(stamp[0:4]),
            int(stamp[4:6]),
            int(stamp[6:8]),
            int(stamp[9:11]),
            int(stamp[11:13]),
            int(stamp[13:15]),
            int(stamp[15:21]),
            tzinfo=UTC,
        )
    except ValueError:
        return None
