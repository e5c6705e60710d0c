"""Which engine serves a store's requests: obstore for ``s3://`` and ``az://`` where it can, else fsspec."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.asyn import AsyncFileSystem
from fsspec.core import split_protocol

from haystack_integrations.offload.stores.async_fsspec_io import AZURE_PROTOCOLS, AsyncFilesystemIO
from haystack_integrations.offload.stores.io import Engine, SyncFilesystemIO, protocols_of
from haystack_integrations.offload.stores.local_io import LocalIO, PathCheckedLocalIO, descriptor_calls_available
from haystack_integrations.offload.stores.s3fs_io import S3IO, close_s3_io_async

__all__ = ["DEFAULT_ENGINE", "ENGINES", "EngineChoice", "choose_engine", "close_engine_async", "engine_for"]

logger = logging.getLogger(__name__)

ENGINES = ("auto", "fsspec", "obstore")
DEFAULT_ENGINE = "auto"

_S3_PROTOCOLS = frozenset({"s3", "s3a"})
_OBSTORE_PROTOCOLS = _S3_PROTOCOLS | AZURE_PROTOCOLS
_fallbacks_logged: set[tuple[str, str]] = set()
_logged_lock = threading.Lock()


@dataclass(frozen=True)
class EngineChoice:
    """
    The engine a store resolved, and why.

    :param engine: ``"obstore"`` or ``"fsspec"``.
    :param reason: One sentence, for logs, ``doctor`` and health pages.
    """

    engine: str
    reason: str


def choose_engine(
    engine: str, url: str, storage_options: Mapping[str, Any] | None, filesystem: AbstractFileSystem | None
) -> EngineChoice:
    """
    Resolve the engine a store asked for (no I/O).

    ``"auto"`` (the default) picks obstore for an ``s3://`` or Azure (``az://``, ``abfs://``, ``abfss://``) URL when
    obstore is installed and understands every storage option, and otherwise fsspec's backend (s3fs, adlfs), logging
    why once per URL. A named engine is taken as asked, or refused if it cannot serve the store.

    :param engine: ``"auto"``, ``"fsspec"`` or ``"obstore"``.
    :param url: The store's root URL.
    :param storage_options: The options the store was given.
    :param filesystem: The filesystem object the store was given, if any.
    :returns: The engine and the reason.
    :raises ValueError: If `engine` is unknown, or is ``"obstore"`` and cannot serve the store.
    """
    if engine not in ENGINES:
        raise ValueError(f"Unknown engine {engine!r}: use one of {', '.join(map(repr, ENGINES))}.")
    if engine == "fsspec":
        return EngineChoice("fsspec", 'engine="fsspec" was asked for')
    protocol = split_protocol(url)[0]
    served = filesystem is None and protocol in _OBSTORE_PROTOCOLS
    if not served:
        if engine == "obstore":
            raise ValueError(
                'engine="obstore" serves s3:// URLs only, besides Azure\'s az:// and abfs:// (not a filesystem '
                'object); use engine="fsspec".'
            )
        what = "a filesystem object" if filesystem is not None else f"{protocol or 'file'}:// URLs"
        return EngineChoice("fsspec", f"{what} are served by fsspec; obstore serves s3:// only, besides Azure's az://")
    if engine == "obstore":
        unsupported = _unsupported_options(protocol, storage_options or {})  # ImportError names the extra to install
        if unsupported:
            raise ValueError(
                f"Storage option(s) {', '.join(unsupported)} not supported by the obstore engine: leave them out, or "
                'use engine="fsspec" (or "auto", which falls back to it).'
            )
        return EngineChoice("obstore", 'engine="obstore" was asked for')
    try:
        unsupported = _unsupported_options(protocol, storage_options or {})
    except ImportError:
        extra = (
            'pip install "offload-haystack[azure]"'
            if protocol in AZURE_PROTOCOLS
            else 'pip install "offload-haystack[s3]"'
        )
        problem = f"obstore is not installed ({extra})"
    else:
        if not unsupported:
            served_as = "s3://" if protocol in _S3_PROTOCOLS else f"{protocol}://"
            return EngineChoice("obstore", f"{served_as} with options the obstore engine serves")
        problem = f"storage option(s) {', '.join(unsupported)} have no obstore counterpart"
    _log_once(url, problem)
    return EngineChoice("fsspec", f"the obstore engine cannot serve this store: {problem}")


def _unsupported_options(protocol: str | None, storage_options: Mapping[str, Any]) -> list[str]:
    if protocol in AZURE_PROTOCOLS:
        from haystack_integrations.offload.stores.obstore_azure import unsupported_azure_options

        return unsupported_azure_options(storage_options)
    from haystack_integrations.offload.stores.obstore_io import unsupported_options

    return unsupported_options(storage_options)


def _log_once(url: str, problem: str) -> None:
    with _logged_lock:
        if (url, problem) in _fallbacks_logged:
            return
        _fallbacks_logged.add((url, problem))
    backend = "adlfs" if split_protocol(url)[0] in AZURE_PROTOCOLS else "s3fs"
    logger.info("The store %s uses the fsspec engine (%s): %s.", url, backend, problem)


def engine_for(fs: AbstractFileSystem) -> Engine:
    """
    The fsspec engine for a filesystem: s3fs's, any other async one's, local disk's, or the synchronous one.

    :param fs: An fsspec filesystem.
    :returns: The `Engine` that serves it.
    """
    protocols = protocols_of(fs)
    if "s3" in protocols:
        return S3IO(fs)
    if isinstance(fs, AsyncFileSystem):
        return AsyncFilesystemIO(fs)
    if "file" in protocols or "local" in protocols:
        return LocalIO(fs) if descriptor_calls_available() else PathCheckedLocalIO(fs)
    return SyncFilesystemIO(fs)


async def close_engine_async(io: Engine) -> None:
    """
    Close an engine its store is done with (a tenant's client, evicted or replaced by renewed credentials), so its
    connection pools go now rather than whenever the garbage collector finds them (s3fs's then warn, unclosed).

    s3fs's clients are closed (`close_s3_io_async`); obstore's buckets are dropped (object_store has no close: a store
    goes with its last reference), with the s3fs fallback it may have made. Other engines hold nothing to close.

    :param io: The engine, with no request of its store still using it.
    """
    if isinstance(io, S3IO):
        await close_s3_io_async(io)
        return
    obstore_io = sys.modules.get("haystack_integrations.offload.stores.obstore_io")  # loaded if `io` is obstore's
    if obstore_io is not None and isinstance(io, obstore_io.ObstoreIO):
        made = getattr(io.fallback, "made", None)  # `FilesystemHandle`'s lazily made s3fs fallback
        if isinstance(made, Engine):
            await close_engine_async(made)
        io.drop_stores()
