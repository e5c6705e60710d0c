"""The engine for memory and any other synchronous fsspec filesystem: each call runs the filesystem's sync method."""

from fsspec import AbstractFileSystem

from haystack_integrations.offload.stores.io import SyncBackedIO

# fsspec protocols served in this process: no network between the store and its bytes, so no transient failures.
IN_PROCESS_PROTOCOLS = frozenset({"memory", "file", "local"})


class SyncFilesystemIO(SyncBackedIO):
    """In-memory and other synchronous filesystems (a remote one, such as sftp, is retried: `remote`)."""

    def __init__(self, fs: AbstractFileSystem) -> None:
        """
        :param fs: The fsspec filesystem to use.
        """
        super().__init__(fs)
        protocols = protocols_of(fs)
        # fsspec's memory filesystem is a dict: calling it inline is cheaper than a thread hop.
        self.uses_worker_threads = "memory" not in protocols
        self.remote = not set(protocols) <= IN_PROCESS_PROTOCOLS


def protocols_of(fs: AbstractFileSystem) -> tuple[str, ...]:
    """The protocols an fsspec filesystem answers to (``fs.protocol`` is a string or a tuple)."""
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
