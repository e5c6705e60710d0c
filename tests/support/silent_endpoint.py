"""A TCP port that accepts connections and never answers: an S3 endpoint a client cannot get an answer from."""

import contextlib
import socket
import threading
from types import TracebackType


class SilentEndpoint:
    """Accepts every connection and reads nothing, writes nothing; `accepted` shows the client did connect."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # the listener closed
            while True:
                self.accepted.append(self._listener.accept()[0])

    def close(self) -> None:
        """Stop listening and drop every connection."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread's accept, which close alone leaves waiting
        self._listener.close()
        self._thread.join(timeout=5)
        for connection in self.accepted:
            connection.close()

    def __enter__(self) -> "SilentEndpoint":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
