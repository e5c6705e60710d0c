"""
A result's content as a sequence of byte chunks, so a large result is written without a second whole copy of it.

`ContentChunks` encodes a string a slice at a time and hands bytes on as zero-copy views; the I/O's ``put_chunks``
methods write from it (`stores.io`).
"""

from collections.abc import Iterator

__all__ = ["DEFAULT_CHUNK_CHARS", "ContentChunks", "utf8_size"]

# Characters (or bytes) per chunk: 2 Mi characters encode to 2-8 MiB, large enough that the per-chunk overhead is
# nothing (150 chunks for 300 MB), small enough that the chunks a writer holds while it uploads stay a small share of
# a large result (benchmarks/write_memory.py, 300 MB on S3: 8 Mi held the peak at 1.2x the content, 2 Mi at 1.07x
# to 1.13x).
DEFAULT_CHUNK_CHARS = 2 * 2**20
# The store encodes text so that a string with lone surrogates still round-trips (see `FsspecToolResultStore`).
_ERRORS = "surrogatepass"


def utf8_size(text: str, *, chunk_chars: int = DEFAULT_CHUNK_CHARS) -> int:
    """
    The size of ``text.encode("utf-8", "surrogatepass")``, without holding that whole encoding in memory.

    :param text: The string.
    :param chunk_chars: How many characters to encode at a time when the string is not ASCII.
    :returns: The encoded size in bytes.
    """
    if text.isascii():  # O(1) in CPython: the string object records it; one byte per character
        return len(text)
    return sum(
        len(text[start : start + chunk_chars].encode("utf-8", _ERRORS)) for start in range(0, len(text), chunk_chars)
    )


class ContentChunks:
    """
    A `str` as UTF-8 encoded chunks, or a bytes-like object as `memoryview` slices of it; iterable any number of times.

    Chunks are read lazily: iterating encodes one slice at a time, so at most one encoded chunk exists per iteration
    (unless the consumer keeps them).
    """

    def __init__(
        self, content: str | bytes | bytearray | memoryview, *, chunk_chars: int = DEFAULT_CHUNK_CHARS
    ) -> None:
        """
        :param content: The result: text (encoded as UTF-8, lone surrogates kept) or bytes.
        :param chunk_chars: Characters of text, or bytes of binary content, per chunk.
        :raises TypeError: If `content` is neither text nor bytes-like.
        :raises ValueError: If `chunk_chars` is not positive.
        """
        if chunk_chars < 1:
            raise ValueError(f"chunk_chars must be positive, got {chunk_chars}.")
        if not isinstance(content, str | bytes | bytearray | memoryview):
            raise TypeError(f"content must be str or bytes, got {type(content).__name__}.")
        self.content = content
        self.chunk_chars = chunk_chars
        self._nbytes: int | None = None

    @property
    def nbytes(self) -> int:
        """The total size of the chunks in bytes (for text, computed once, a chunk at a time unless ASCII)."""
        if self._nbytes is None:
            content = self.content
            if isinstance(content, str):
                self._nbytes = utf8_size(content, chunk_chars=self.chunk_chars)
            else:
                self._nbytes = memoryview(content).nbytes
        return self._nbytes

    def __iter__(self) -> Iterator[bytes | memoryview]:
        content = self.content
        step = self.chunk_chars
        if isinstance(content, str):
            for start in range(0, len(content), step):
                yield content[start : start + step].encode("utf-8", _ERRORS)
            return
        # cast("B"): byte-sized items, so slices count bytes whatever the buffer's format.
        view = memoryview(content).cast("B")
        for start in range(0, view.nbytes, step):
            yield view[start : start + step]
