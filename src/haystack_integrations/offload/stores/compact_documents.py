"""Session documents stored gzip-compressed where that makes them smaller, and read back either way."""

import gzip
import zlib

# Below this, gzip's own 18 bytes of header and trailer eat most of what it saves.
COMPRESS_FROM = 256
# Level 1: a third of level 6's CPU on conversation JSON for a few percent more bytes; a checkpoint of a long
# conversation is compressed on the turn's path.
_LEVEL = 1
_GZIP_MAGIC = b"\x1f\x8b"


def compress_document(data: bytes) -> bytes:
    """
    A document as stored: gzip-compressed when that is smaller, else as it is.

    A JSON document starts with ``{`` and a gzip stream with its magic bytes, so `decompress_document` tells them apart
    (documents written before compression read as they are). ``gunzip`` reads a compressed one.

    :param data: The document.
    :returns: What to store.
    """
    if len(data) < COMPRESS_FROM:
        return data
    packed = gzip.compress(data, compresslevel=_LEVEL, mtime=0)
    return packed if len(packed) < len(data) else data


def decompress_document(data: bytes) -> bytes:
    """
    A stored document as written: decompressed if `compress_document` compressed it.

    :param data: The stored bytes.
    :returns: The document.
    :raises ValueError: If it starts as a gzip stream but is not one.
    """
    if not data.startswith(_GZIP_MAGIC):
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as error:
        raise ValueError("A compressed session document is damaged.") from error
