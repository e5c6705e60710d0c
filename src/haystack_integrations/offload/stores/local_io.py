"""The local-disk engine: atomic writes, and every path reached without following a symlink out of the store's root."""

import asyncio
import contextlib
import errno
import os
import stat
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import BinaryIO

from haystack_integrations.offload.errors import InvalidReferenceError
from haystack_integrations.offload.stores.io import Chunk, Listed, SyncBackedIO
from haystack_integrations.offload.stores.names import is_temporary_name, new_temporary_name
from haystack_integrations.offload.stores.sync_api import caller_is_waiting

# Writes and reads up to this size run inline on the loop: about where a thread hop costs as much as the copy it saves
# (writing 256 KiB into the page cache takes about as long as the hop to a worker thread and back).
INLINE_IO_BYTES = 256 * 2**10


class _LocalDiskIO(SyncBackedIO):
    """
    Async calls for local disk: small writes and reads inline on the loop, large ones (and listings) in a thread.

    A thread hop costs more CPU than writing or reading a small file through the page cache (benchmarks/README.md); a
    large copy inline would stall every other task on the loop. Each async call runs the very sync method (or, for a
    whole read, the very checked open) the sync API runs, so the two cannot differ in what they refuse.
    """

    inline_io_bytes = INLINE_IO_BYTES
    writes_temporary_files = True

    async def put_chunks_async(self, path: str, chunks: Iterable[Chunk]) -> None:
        """Async `put_chunks`, in a worker thread (streaming is for large content), which iterates the chunks."""
        await self._in_thread(self.put_chunks, path, chunks)

    def _open_for_read(self, path: str) -> BinaryIO:
        """Open `path` for reading with the same checks as `get`."""
        raise NotImplementedError

    def _walk(self, path: str) -> dict[str, os.stat_result]:
        """Every regular file below the directory `path`, with its status; empty if there is none."""
        raise NotImplementedError

    def find(self, path: str) -> dict[str, int]:
        """Return every file below the directory `path` (recursively) with its size; empty if there is none."""
        return {name: status.st_size for name, status in self._walk(path).items()}

    def find_detailed(self, path: str) -> dict[str, Listed]:
        """As `find`, with each file's mtime from the same walk (no second stat)."""
        return {
            name: Listed(status.st_size, datetime.fromtimestamp(status.st_mtime, tz=UTC))
            for name, status in self._walk(path).items()
        }

    async def get_async(self, path: str) -> bytes:
        """Async `get`: opened (and checked) inline; read inline when small, else in a worker thread."""
        file = self._open_for_read(path)
        handed_over = False
        try:
            if os.fstat(file.fileno()).st_size <= INLINE_IO_BYTES or caller_is_waiting():
                return file.read()
            handed_over = True
        finally:
            if not handed_over:
                file.close()
        # The thread owns the file from here and closes it, even if this await is cancelled: its descriptor is never
        # closed (and its number reused) under a read still running.
        return await asyncio.to_thread(_read_and_close, file)


class LocalIO(_LocalDiskIO):
    """
    Local disk, safe against whoever else can write in the store's directory (another process, a tenant's sandbox).

    Every path is reached one component at a time from ``/``: each directory is opened with ``O_NOFOLLOW`` relative to
    its parent's descriptor, and the file with ``O_NOFOLLOW`` relative to its directory's. A symlink anywhere along the
    path is refused (`InvalidReferenceError`) by the very call that would have followed it, so there is no window
    between a check and an open for a swap to use (the store's root is a real path already). Writes, deletes and
    listings go through the same descriptors: a write or delete lands in the directory that was checked, whatever is
    renamed meanwhile, and a listing never descends into a symlink.

    What a read opens must be a regular file with a single link. A hard link planted in a session can name another
    tenant's file and cannot be told apart from it, so any file with more links is refused, results and documents
    alike, with one exception: a conditional create publishes a document by linking its temporary file into place and
    then unlinking the temporary file, so a document whose only other link is a ``.tmp-*`` file beside it is being
    published, not planted (`_check_links`). Listings still show hard-linked files, so purges remove them.

    Writes go through a temporary file beside the target (renamed into place, or linked for a conditional create), so a
    reader sees a whole result or none. A writer killed mid-write leaves its temporary file; its name carries its time
    (`names.new_temporary_name`) so purges remove it once it is older than `names.TEMPORARY_GRACE`.
    """

    def put(self, path: str, data: bytes) -> None:
        """Write `data` to a temporary file beside `path`, then rename it into place (atomic)."""
        self.put_chunks(path, (data,))

    def put_chunks(self, path: str, chunks: Iterable[Chunk]) -> None:
        """Write the chunks one by one to a temporary file beside `path`, then rename it into place (atomic)."""
        directory, name = os.path.split(path)
        parent = _open_directory(directory, create=True)
        try:
            temporary = _write_temporary(parent, chunks)
            try:
                os.replace(temporary, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                _unlink_quietly(parent, temporary)
                raise
        finally:
            os.close(parent)

    def put_exclusive(self, path: str, data: bytes) -> None:
        """Write a temporary file, then hard-link it into place: the link fails if the name exists (any process)."""
        directory, name = os.path.split(path)
        parent = _open_directory(directory, create=True)
        try:
            temporary = _write_temporary(parent, (data,))
            try:
                # link() is atomic and never replaces: readers see the whole document or nothing.
                os.link(temporary, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
            finally:
                _unlink_quietly(parent, temporary)
        finally:
            os.close(parent)

    def _open_for_read(self, path: str) -> BinaryIO:
        return _open_file(path)

    def get(self, path: str) -> bytes:
        """Return the file's content, opened without following any symlink."""
        with _open_file(path) as file:
            return file.read()

    def get_range(self, path: str, start: int, end: int) -> bytes:
        """Return part of the file, opened without following any symlink."""
        with _open_file(path) as file:
            file.seek(start)
            return file.read(max(0, end - start))

    def get_range_and_size(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        """Return part of the file and its size, from one open file (no window for a swap between the two)."""
        with _open_file(path) as file:
            size = os.fstat(file.fileno()).st_size
            file.seek(start)
            return file.read(max(0, end - start)), size

    def size(self, path: str) -> int:
        """Return the file's size, opened (and checked) as for a read."""
        with _open_file(path) as file:
            return os.fstat(file.fileno()).st_size

    def modified(self, path: str) -> datetime:
        """Return the file's modification time, opened (and checked) as for a read."""
        with _open_file(path) as file:
            return datetime.fromtimestamp(os.fstat(file.fileno()).st_mtime, tz=UTC)

    def _walk(self, path: str) -> dict[str, os.stat_result]:
        """Walk the directory through descriptors, never into a symlink; only regular files are listed."""
        try:
            top = _open_directory(path)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        found: dict[str, os.stat_result] = {}
        try:
            # fwalk opens each subdirectory relative to its parent's descriptor and checks it is the one it listed.
            for directory, _subdirectories, files, directory_fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                base = path if directory == "." else f"{path}/{directory[2:]}"
                for name in files:
                    try:
                        status = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # a concurrent write's temporary file, renamed away between listing and stat
                    if stat.S_ISREG(status.st_mode):
                        found[f"{base}/{name}"] = status
        finally:
            os.close(top)
        return found

    def delete(self, paths: Iterable[str]) -> None:
        """Delete the files, then the directories they leave empty (never the store's root)."""
        directories: set[str] = set()
        for path in paths:
            directory, name = os.path.split(path)
            try:
                parent = _open_directory(directory)
            except FileNotFoundError:
                continue
            try:
                # unlinkat never follows: a planted symlink goes, not its target.
                os.unlink(name, dir_fd=parent)
            except FileNotFoundError:
                continue
            finally:
                os.close(parent)
            directories.add(directory)
        # Deepest first, so a session directory goes before its tenant directory.
        for directory in sorted(directories, key=len, reverse=True):
            _remove_empty_directory(directory)


class PathCheckedLocalIO(_LocalDiskIO):
    """
    Local disk where the OS lacks the descriptor-relative calls `LocalIO` needs (Windows): a check, then the call.

    The real path must be the path built, or the access is refused; a swap between the check and the open can still
    redirect it, so give a store on such a system a directory nobody else writes to.
    """

    def put(self, path: str, data: bytes) -> None:
        """Write `data` to a temporary file beside `path`, then rename it into place (atomic on POSIX and Windows)."""
        self.put_chunks(path, (data,))

    def put_chunks(self, path: str, chunks: Iterable[Chunk]) -> None:
        """Write the chunks to a temporary file beside `path`, then rename it into place."""
        with _temporary_beside(path, chunks) as temporary:
            os.replace(temporary, path)

    def put_exclusive(self, path: str, data: bytes) -> None:
        """Write a temporary file, then hard-link it into place: the link fails if the name exists (any process)."""
        with _temporary_beside(path, (data,)) as temporary:
            os.link(temporary, path)

    def _open_for_read(self, path: str) -> BinaryIO:
        _refuse_redirected(path)
        return open(path, "rb")

    def get(self, path: str) -> bytes:
        """Return the file's content after checking that no symlink redirects the path."""
        _refuse_redirected(path)
        with open(path, "rb") as file:
            return file.read()

    def get_range(self, path: str, start: int, end: int) -> bytes:
        """Return part of the file after checking that no symlink redirects the path."""
        _refuse_redirected(path)
        with open(path, "rb") as file:
            file.seek(start)
            return file.read(max(0, end - start))

    def get_range_and_size(self, path: str, start: int, end: int) -> tuple[bytes, int]:
        """Return part of the file and its size, from one open file."""
        _refuse_redirected(path)
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            file.seek(start)
            return file.read(max(0, end - start)), size

    def size(self, path: str) -> int:
        """Return the file's size after checking that no symlink redirects the path."""
        _refuse_redirected(path)
        return os.stat(path).st_size

    def modified(self, path: str) -> datetime:
        """Return the file's modification time after checking that no symlink redirects the path."""
        _refuse_redirected(path)
        return datetime.fromtimestamp(os.stat(path).st_mtime, tz=UTC)

    def _walk(self, path: str) -> dict[str, os.stat_result]:
        """Walk the directory without following symlinks; symlinks themselves are skipped."""
        found: dict[str, os.stat_result] = {}
        if not os.path.isdir(path):
            return found
        _refuse_redirected(path)
        for directory, _subdirectories, files in os.walk(path, followlinks=False):
            for name in files:
                full = os.path.join(directory, name)
                if not os.path.islink(full):
                    try:
                        found[full] = os.stat(full)
                    except FileNotFoundError:
                        continue
        return found

    def delete(self, paths: Iterable[str]) -> None:
        """Delete the files (after the same check as reads), then the directories they leave empty."""
        directories: set[str] = set()
        for path in paths:
            _refuse_redirected(os.path.dirname(path))
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            directories.add(os.path.dirname(path))
        for directory in sorted(directories, key=len, reverse=True):
            try:
                os.rmdir(directory)
            except OSError:
                continue


# Descriptor-relative calls LocalIO needs (os.replace takes the same dir_fd arguments as os.rename).
_AT_CALLS = (
    all(hasattr(os, flag) for flag in ("O_DIRECTORY", "O_NOFOLLOW", "O_CLOEXEC"))
    and {os.open, os.stat, os.mkdir, os.rmdir, os.unlink, os.rename, os.link} <= os.supports_dir_fd
    and os.link in os.supports_follow_symlinks  # a temporary file swapped for a symlink is linked as the symlink
    and hasattr(os, "fwalk")
)
# O_PATH (Linux): walking a directory needs only search permission on it, as path resolution does, and a symlink
# opens as itself, so fstat tells a symlink from a file without a second look that a swap could race. Elsewhere
# O_DIRECTORY | O_NOFOLLOW fails on a symlink (ELOOP).
_O_PATH = getattr(os, "O_PATH", 0)
_DIRECTORY_FLAGS = getattr(os, "O_NOFOLLOW", 0) | (_O_PATH or os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
# O_NONBLOCK: opening a FIFO planted under a result's name must not hang the reader (it is then refused).
_FILE_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_SYMLINK_REFUSED = "The path of this result passes through a symlink; refusing to follow it."


def _open_directory(path: str, *, create: bool = False) -> int:
    """
    Open the directory `path` (absolute) from ``/``, one component at a time, never following a symlink.

    :param path: The directory.
    :param create: Create missing directories on the way.
    :returns: A descriptor of the directory; the caller closes it.
    :raises InvalidReferenceError: If a component is a symlink (or ``.``/``..``).
    :raises FileNotFoundError: If a component is missing (and `create` is false).
    """
    descriptor = os.open("/", _DIRECTORY_FLAGS | os.O_CLOEXEC)
    try:
        for name in path.split("/"):
            if not name:
                continue
            if name in {".", ".."}:
                raise InvalidReferenceError("A local path must not contain '.' or '..' components.")
            child = _open_child_directory(descriptor, name, create=create)
            os.close(descriptor)
            descriptor = child
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _open_child_directory(parent: int, name: str, *, create: bool) -> int:
    try:
        return _open_directory_at(parent, name)
    except FileNotFoundError:
        if not create:
            raise
    with contextlib.suppress(FileExistsError):  # another writer made it first
        os.mkdir(name, dir_fd=parent)
    return _open_directory_at(parent, name)  # checked again: it may have been swapped since the mkdir


def _open_directory_at(parent: int, name: str) -> int:
    try:
        descriptor = os.open(name, _DIRECTORY_FLAGS | os.O_CLOEXEC, dir_fd=parent)
    except OSError as error:
        _refuse_symlink(parent, name, error)
        raise
    if _O_PATH:
        # O_PATH opened whatever the name is: a symlink itself, a file, a directory. Only a directory goes on.
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISDIR(mode):
            os.close(descriptor)
            if stat.S_ISLNK(mode):
                raise InvalidReferenceError(_SYMLINK_REFUSED)
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), name)
    return descriptor


def _refuse_symlink(directory: int, name: str, error: OSError) -> None:
    """Raise `InvalidReferenceError` from `error` when `name` is a symlink: what ``O_NOFOLLOW`` just refused."""
    if error.errno == errno.ELOOP:
        raise InvalidReferenceError(_SYMLINK_REFUSED) from error
    try:
        status = os.stat(name, dir_fd=directory, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISLNK(status.st_mode):
        raise InvalidReferenceError(_SYMLINK_REFUSED) from error


def _open_file(path: str) -> BinaryIO:
    """
    Open a file for reading without following a symlink anywhere along `path`, and check what was opened.

    :param path: The file's absolute path.
    :returns: The open file.
    :raises InvalidReferenceError: If the path passes through a symlink, or the file is not a regular file with one
        link (see `LocalIO`).
    :raises FileNotFoundError: If there is no such file.
    """
    directory, name = os.path.split(path)
    parent = _open_directory(directory)
    try:

        def opener(file: str, flags: int) -> int:
            try:
                return os.open(file, flags | _FILE_FLAGS, dir_fd=parent)
            except OSError as error:
                _refuse_symlink(parent, file, error)
                raise

        file = open(name, "rb", opener=opener)  # noqa: SIM115 - returned to the caller, who closes it
        try:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise InvalidReferenceError("This result is not a regular file; refusing to read it.")
            _check_links(file.fileno(), parent, status)
        except BaseException:
            file.close()
            raise
    finally:
        os.close(parent)
    return file


def _check_links(descriptor: int, directory: int, status: os.stat_result) -> None:
    """Refuse a hard-linked file, unless its only other link is a conditional create's temporary file beside it."""
    if status.st_nlink == 1:
        return
    # Publishing: put_exclusive links its temporary file into place, then unlinks it. Look for that temporary file,
    # and if it is gone, ask again: its unlink may have happened since the first look.
    if status.st_nlink == 2 and (_has_temporary_twin(directory, status) or os.fstat(descriptor).st_nlink == 1):
        return
    raise InvalidReferenceError("This result is a hard link to another file; refusing to read it.")


def _has_temporary_twin(directory: int, status: os.stat_result) -> bool:
    listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=directory)
    try:
        names = os.listdir(listing)
    finally:
        os.close(listing)
    for name in names:
        if not is_temporary_name(name):
            continue
        try:
            other = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if (other.st_dev, other.st_ino) == (status.st_dev, status.st_ino):
            return True
    return False


def _write_temporary(directory: int, chunks: Iterable[Chunk]) -> str:
    """Write `chunks` to a fresh temporary file in `directory` and return its name."""
    # A leading dot keeps the temporary file out of listings: it is not a valid result name.
    name = new_temporary_name()

    def opener(file: str, flags: int) -> int:
        return os.open(file, flags | _FILE_FLAGS, 0o666, dir_fd=directory)

    try:
        with open(name, "xb", opener=opener) as file:
            for chunk in chunks:
                file.write(chunk)
    except BaseException:
        _unlink_quietly(directory, name)
        raise
    return name


def _read_and_close(file: BinaryIO) -> bytes:
    with file:
        return file.read()


def _unlink_quietly(directory: int, name: str) -> None:
    # After a rename there is nothing left to remove; after a link or a failure there is.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=directory)


def _remove_empty_directory(path: str) -> None:
    parent_path, name = os.path.split(path)
    try:
        parent = _open_directory(parent_path)
    except (OSError, InvalidReferenceError):
        return
    try:
        os.rmdir(name, dir_fd=parent)  # fails on a symlink or a directory that is not empty: both are kept
    except OSError:
        pass
    finally:
        os.close(parent)


@contextlib.contextmanager
def _temporary_beside(path: str, chunks: Iterable[Chunk]) -> Iterator[str]:
    """Write `chunks` to a fresh temporary file in `path`'s directory, yield its name, and remove it afterwards."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    _refuse_redirected(directory)
    temporary = os.path.join(directory, new_temporary_name())
    try:
        with open(temporary, "xb") as file:
            for chunk in chunks:
                file.write(chunk)
        yield temporary
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def descriptor_calls_available() -> bool:
    """Whether this OS has the descriptor-relative calls `LocalIO` needs (else `PathCheckedLocalIO` serves)."""
    return _AT_CALLS


def _refuse_redirected(path: str) -> None:
    """Refuse a local path that a symlink anywhere along it sends elsewhere (the root itself is already real)."""
    if os.path.realpath(path) != path:
        raise InvalidReferenceError(_SYMLINK_REFUSED)
