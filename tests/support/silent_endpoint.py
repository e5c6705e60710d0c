"""A TCP port that accepts connections and never answers: an S3 endpoint a client cannot get an answer from."""

import contextlib
import socket
import threading
import time
from types import TracebackType


class SilentEndpoint:
    """Accepts every connection and reads nothing, writes nothing; `accepted` shows the client did connect."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.accepted: list[socket.socket] = []
        self._arrived = threading.Condition()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # the listener closed
            while True:
                connection = self._listener.accept()[0]
                with self._arrived:
                    self.accepted.append(connection)
                    self._arrived.notify_all()

    def wait_for_connections(self, count: int, patience: float = 10.0) -> int:
        """
        Wait until `count` connections were accepted, or `patience` seconds passed.

        The kernel completes a connection before this endpoint's thread accepts it, so a client can time out on a
        connection not yet in `accepted`: count them after waiting here, not straight after the client gave up.

        :param count: The connections expected.
        :param patience: The longest wait, in seconds: a bound, never the measure of the test.
        :returns: How many were accepted by then (more than `count` if more came).
        """
        deadline = time.monotonic() + patience
        with self._arrived:
            while len(self.accepted) < count and (left := deadline - time.monotonic()) > 0:
                self._arrived.wait(left)
            return len(self.accepted)

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
