"""
The reference server's scrape endpoint: ``GET /metrics`` in Prometheus' text format, on a port of its own per worker.

Each worker process sets up the OpenTelemetry SDK once (the server is the application here: the library uses only the
API) and serves its own figures from a small thread, on the first free port of ``[metrics_port, metrics_port + N)``
for N workers: a scrape never lands on a random worker's counters, and the tenants' API port never serves them.
"""

import errno
import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import metrics as otel_metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from haystack_integrations.offload.metrics import label_tenants
from offload_haystack_app.server.auth import TokenTable
from offload_haystack_app.server.startup import ServerStartupError

if TYPE_CHECKING:
    from offload_haystack_app.server.settings import ServerSettings

logger = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
WORKERS_VARIABLE = "WEB_CONCURRENCY"
"""How many worker processes share the server (uvicorn's and gunicorn's variable; ``serve`` sets it): the size of the
range of metrics ports. Unset: one."""
SERVICE_NAME = "offload-haystack"
MAX_SCRAPE_CONNECTIONS = 16
"""Connections a metrics port serves at once (a scraper needs one); more are closed as they come."""
SCRAPE_TIMEOUT_SECONDS = 10.0
"""How long a connection may be silent (sending its request, or taking the answer) before it is closed."""

_provider_lock = threading.Lock()
_provider_checked = False


class MetricsEndpoint:
    """One worker's running ``/metrics`` server: its address, and `stop`."""

    def __init__(self, server: "_ScrapeServer") -> None:
        """
        :param server: The bound HTTP server; it is served from a daemon thread until `stop`.
        """
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="offload-metrics", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The port this worker's metrics are served on."""
        return int(self._server.server_address[1])

    def stop(self) -> None:
        """Stop serving and close the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@contextmanager
def metrics_served(settings: "ServerSettings", *, worker: str) -> Iterator[MetricsEndpoint | None]:
    """
    Serve this worker's metrics while the block runs, when `settings.metrics_port` is set (else yield None).

    :param settings: The server's settings (``metrics_*``).
    :param worker: This worker's name (``host:pid``), the ``service.instance.id`` of its series.
    :yields: The running endpoint, or None when metrics are off.
    :raises ServerStartupError: If every port of this server's range is taken.
    """
    endpoint = start_metrics_endpoint(settings, worker=worker)
    try:
        yield endpoint
    finally:
        if endpoint is not None:
            endpoint.stop()


def start_metrics_endpoint(settings: "ServerSettings", *, worker: str) -> MetricsEndpoint | None:
    """
    Set up this process's MeterProvider (once) and serve ``GET /metrics`` on the first free port of its range.

    :param settings: The server's settings.
    :param worker: This worker's name.
    :returns: The running endpoint, or None when `settings.metrics_port` is unset.
    :raises ServerStartupError: If every port of the range is taken.
    """
    if settings.metrics_tenants:
        label_tenants(settings.metrics_tenants)
    if settings.metrics_port is None:
        return None
    install_meter_provider(worker)
    token = settings.metrics_token.get_secret_value() if settings.metrics_token is not None else None
    if token is None and not _loopback(settings.metrics_host):
        logger.warning(
            "The metrics ports listen on %s without a token: set OFFLOAD_SERVER_METRICS_TOKEN.", settings.metrics_host
        )
    server = _bind_first_free(settings.metrics_host, metrics_ports(settings.metrics_port), token)
    endpoint = MetricsEndpoint(server)
    logger.info(
        "Worker %s serves its metrics at http://%s:%d%s", worker, settings.metrics_host, endpoint.port, METRICS_PATH
    )
    return endpoint


def metrics_ports(first: int) -> range:
    """
    The ports this server's workers serve their metrics on: one per worker, from `first`.

    :param first: The ``metrics_port`` setting.
    :returns: ``range(first, first + workers)``, workers from `WORKERS_VARIABLE`.
    """
    return range(first, first + worker_count())


def worker_count() -> int:
    """:returns: The worker processes of this server, from `WORKERS_VARIABLE` (1 when unset or not a number)."""
    text = os.environ.get(WORKERS_VARIABLE, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else 1


def install_meter_provider(worker: str) -> None:
    """
    Set the process's global MeterProvider: the SDK's, with `PrometheusMetricReader` on prometheus_client's registry.

    Once per process; when the application (or ``OTEL_PYTHON_METER_PROVIDER``) already set one, that one stays, and
    ``/metrics`` serves whatever its readers put on the default registry.

    :param worker: This worker's name, its ``service.instance.id``.
    """
    global _provider_checked  # one global provider per process, as OpenTelemetry has it
    with _provider_lock:
        if _provider_checked:
            return
        _provider_checked = True
        resource = Resource.create({"service.name": SERVICE_NAME, "service.instance.id": worker})
        # A pull reader has nothing to flush at exit; and one refused below is shut down here, once.
        provider = MeterProvider(metric_readers=[PrometheusMetricReader()], resource=resource, shutdown_on_exit=False)
        otel_metrics.set_meter_provider(provider)  # refused (OpenTelemetry logs a warning) when one is already set
        if otel_metrics.get_meter_provider() is not provider:
            provider.shutdown()  # takes its reader off the registry again
            logger.info("A MeterProvider was already set in this process: /metrics serves what its readers registered.")


class _ScrapeServer(ThreadingHTTPServer):
    """The HTTP server of one worker's metrics port: at most `MAX_SCRAPE_CONNECTIONS` at once, each bounded in time."""

    daemon_threads = True
    # SO_REUSEPORT would let two workers bind one port (and the kernel split scrapes between them): never.
    allow_reuse_port = False
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], token: str | None) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.scrapers = TokenTable({token: "metrics"}) if token is not None else None
        self._slots = threading.BoundedSemaphore(MAX_SCRAPE_CONNECTIONS)
        super().__init__(address, _ScrapeHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve a connection in a thread of its own, or close it at once when every slot is taken."""
        if not self._slots.acquire(blocking=False):
            # Idle or slow connections past the cap get no thread: they cannot pile up in the worker's process.
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Serve the connection, then give its slot back."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _ScrapeHandler(BaseHTTPRequestHandler):
    """Answers ``GET /metrics`` only; with a token set, only to a scrape that sends it."""

    server: _ScrapeServer
    # Seconds a connection may take to send its request (and to take the answer): an idle one is closed after that.
    timeout = SCRAPE_TIMEOUT_SECONDS

    def do_GET(self) -> None:
        """Serve one scrape."""
        scrapers = self.server.scrapers
        if scrapers is not None and scrapers.caller(self.headers.get("Authorization")) is None:
            self._answer(
                401, b"A bearer token is required.\n", "text/plain; charset=utf-8", {"WWW-Authenticate": "Bearer"}
            )
        elif urlsplit(self.path).path != METRICS_PATH:
            self._answer(404, b"Not found: the metrics are at /metrics.\n", "text/plain; charset=utf-8")
        else:
            # The format the scraper accepts (Prometheus' text format, or OpenMetrics), as prometheus_client serves it.
            encoder, media_type = choose_encoder(self.headers.get("Accept", ""))
            self._answer(200, encoder(REGISTRY), media_type)

    def _answer(self, status: int, body: bytes, media_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", media_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("metrics %s: " + format, self.address_string(), *args)


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bind_first_free(host: str, ports: range, token: str | None) -> _ScrapeServer:
    # Binding is the claim: of several workers starting at once, each gets another port (no SO_REUSEPORT).
    for port in ports:
        try:
            return _ScrapeServer((host, port), token)
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise ServerStartupError(f"The metrics port {port} on {host} cannot be served: {error}.") from error
    raise ServerStartupError(
        f"Every port of {ports.start}-{ports.stop - 1} on {host} is taken, so this worker cannot serve its metrics: "
        f"give --metrics-port (OFFLOAD_SERVER_METRICS_PORT) the first of {len(ports)} free port(s), one per worker."
    )
