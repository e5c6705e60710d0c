"""What tests observe of an engine's clients: the aiohttp sessions s3fs opened, and whether they were closed."""

from typing import Any

from haystack_integrations.offload.stores.io import Engine


def aiohttp_sessions(io: Engine) -> list[Any]:
    """The aiohttp sessions an engine's s3fs clients opened (none for obstore's own requests)."""
    found: list[Any] = []
    clients = [entry.value for entry in getattr(getattr(io, "loop_clients", None), "_entries", {}).values()]
    for fs in [*clients, getattr(io, "async_fs", None)]:
        http = getattr(getattr(getattr(fs, "_s3", None), "_endpoint", None), "http_session", None)
        found.extend((getattr(http, "_sessions", None) or {}).values())
    return found


class Client:
    """A tenant's engine, with the aiohttp sessions its s3fs clients had opened when it was seen in use."""

    def __init__(self, io: Engine) -> None:
        self.io = io
        self.obstore = type(io).__name__ == "ObstoreIO"
        self.sessions = aiohttp_sessions(io)
        assert self.sessions or self.obstore

    def closed(self) -> bool:
        """Whether it is closed: every aiohttp session closed (s3fs), no bucket's store held (obstore)."""
        if self.obstore:
            return not self.io._stores  # type: ignore[attr-defined]
        return all(session.closed for session in self.sessions)
