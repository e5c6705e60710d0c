"""
The reference app's commands, ``offload-haystack demo`` and ``offload-haystack serve``.

They reach the library's ``offload-haystack`` command through its ``offload_haystack.commands`` entry point group
(this distribution's ``pyproject.toml``), and use the library's helpers for the store and S3 arguments.
"""

import argparse
import json
import math
import os
import secrets
import shlex
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from haystack_integrations.offload.cli import (
    EXIT_FAILED_CHECKS,
    CommandError,
    add_s3_arguments,
    applied_s3_choices,
    parse_storage_options,
    print_json,
    print_table,
    progress_bar,
    s3_choices,
    shown_url,
    storage_options_from,
    stored_at,
    whole_number,
)
from offload_haystack_app.demo.scripted_model import SCRIPTED_MODEL_LABEL

if TYPE_CHECKING:
    from offload_haystack_app.demo.runner import DemoReport

DEFAULT_DEMO_STORE = "./offload-demo-results"
DEMO_TENANTS = ("acme", "globex")
MAX_DEMO_SESSIONS = 1000
"""Sessions per tenant the demo runs at most: they all run at once, in this process."""


def demo(commands: Any) -> None:
    """
    Add ``demo``: a scripted multi-tenant demo against an embedded store.

    :param commands: The ``offload-haystack`` subcommand parsers.
    """
    demo = commands.add_parser(
        "demo",
        help="run a scripted multi-tenant demo against an embedded store",
        description="Run concurrent sessions of several tenants through one shared Agent with a scripted model: "
        "offload large results, ask and decide approvals, read results back, and check that every result is stored "
        "byte for byte in its own session and that no session sees another's. Exit status 0 when every check passes.",
    )
    demo.add_argument("--store", default=DEFAULT_DEMO_STORE, help="store URL or directory (default: %(default)s)")
    demo.add_argument("--storage-options", help="fsspec storage options as JSON, e.g. an S3 endpoint_url")
    demo.add_argument("--tenants", default="acme,globex,initech", help="comma-separated tenant ids")
    demo.add_argument(
        "--sessions",
        type=whole_number(1, MAX_DEMO_SESSIONS),
        default=4,
        help=f"concurrent sessions per tenant, 1 to {MAX_DEMO_SESSIONS} (default: %(default)s)",
    )
    demo.add_argument("--run-id", help="name the sessions chat-<run-id>-<n> (default: random, so runs never mix)")
    demo.add_argument("--json", action="store_true", help="print the per-tenant figures as JSON")
    add_s3_arguments(demo)
    demo.set_defaults(handler=_demo)


def serve(commands: Any) -> None:
    """
    Add ``serve``: the reference multi-tenant server and its web page.

    :param commands: The ``offload-haystack`` subcommand parsers.
    """
    serve = commands.add_parser(
        "serve",
        help="run the reference multi-tenant server and its web page",
        description="Run the reference server (FastAPI under uvicorn, one or more worker processes) and its page, "
        "configured by OFFLOAD_SERVER_* variables and these flags over them; prints a login link per demo tenant "
        "when no tokens are configured. Stops with Ctrl-C.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    serve.add_argument("--port", type=whole_number(1, 65535), default=8000, help="port (default: %(default)s)")
    serve.add_argument("--workers", type=whole_number(1), default=1, help="worker processes (default: %(default)s)")
    serve.add_argument("--store", help="store URL (default: $OFFLOAD_SERVER_STORE or ./offload-server-results)")
    serve.add_argument("--storage-options", help="fsspec storage options as JSON")
    serve.add_argument("--tokens-file", help="JSON file of bearer token -> tenant (default: demo tokens)")
    serve.add_argument("--model", choices=["scripted", "openai"], help="scripted (default) or an OpenAI-compatible API")
    serve.add_argument("--openai-base-url", help="OpenAI-compatible endpoint (key: $OFFLOAD_SERVER_OPENAI_API_KEY)")
    serve.add_argument("--openai-model", help="model name at that endpoint")
    serve.add_argument(
        "--metrics-port",
        type=whole_number(1, 65535),
        help="serve GET /metrics from this port on, one port per worker (default: $OFFLOAD_SERVER_METRICS_PORT; none)",
    )
    serve.add_argument("--metrics-host", help="interface of the metrics ports (default: 127.0.0.1)")
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's and the server's log level (default: %(default)s)",
    )
    add_s3_arguments(serve)
    serve.set_defaults(handler=_serve)


def _demo(arguments: argparse.Namespace) -> int:
    from offload_haystack_app.demo.runner import STEPS, demo_sessions, run_demo

    store = arguments.store
    options = storage_options_from(arguments, store)
    tenants = tuple(tenant.strip() for tenant in arguments.tenants.split(",") if tenant.strip())
    if "://" not in store or store.startswith("file://"):
        directory = Path(store.removeprefix("file://"))
        if directory.exists() and not directory.is_dir():
            raise CommandError(f"The demo's store {shown_url(store)} is a file: give a directory (made if missing).")
    # Every argument is checked before the banner: a bad one prints its error line and nothing else.
    run_id = arguments.run_id if arguments.run_id is not None else secrets.token_hex(4)
    demo_sessions(tenants, arguments.sessions, run_id)
    if not arguments.json:
        print(f"offload-haystack demo: {len(tenants)} tenants x {arguments.sessions} sessions, one shared Agent")
        print(f"  model: {SCRIPTED_MODEL_LABEL}")
        print(f"  store: {shown_url(store)}")
        print("  hooks: OffloadHook, OffloadCompactionHook, ApprovalHook (send_invoice asks a person)")
    steps = len(tenants) * arguments.sessions * len(STEPS)
    with progress_bar(steps, "step", False if arguments.json else None, "sessions") as bar:
        report = run_demo(
            store,
            storage_options=options,
            tenants=tenants,
            sessions_per_tenant=arguments.sessions,
            on_progress=lambda tenant, session, step: bar.update(1),
            run_id=run_id,
        )
    if arguments.json:
        figures = report.tenant_figures()
        print_json({"store": shown_url(store), "model": SCRIPTED_MODEL_LABEL, "ok": report.ok, "tenants": figures})
    else:
        _demo_table(report, store)
    if report.failures:
        print("\nFAILED checks:", file=sys.stderr)
        for failure in report.failures:
            print(f"  {failure}", file=sys.stderr)
        return EXIT_FAILED_CHECKS
    if not arguments.json:
        print(
            "\nAll checks passed: every result is stored byte for byte in its own session, approved calls ran exactly "
            "once and denied ones never, and no session could see another's results, approvals or messages."
        )
        print(_next_steps(store, given_options=arguments.storage_options is not None))
    return 0


def _next_steps(store: str, *, given_options: bool) -> str:
    """The demo's last line: the commands to try next on the store it filled (its options are not repeated)."""
    where = shlex.quote(shown_url(store))
    options = " with the same --storage-options" if given_options else ""
    return (
        f"Try next{options}: offload-haystack ls {where} -R (what it stored, per tenant and session); "
        f"offload-haystack serve --store {where} (the same Agent with a web page)."
    )


def _demo_table(report: "DemoReport", store: str) -> None:
    rows = [
        [
            tenant["tenant"],
            str(tenant["sessions"]),
            f"{tenant['results_offloaded']} ({tenant['results_compacted']} by compaction)",
            f"{tenant['bytes_stored']:,}",
            f"{tenant['context_chars_saved']:,}",
            f"{tenant['approvals_asked']}/{tenant['approvals_granted']}",
            str(tenant["isolation_checks_passed"]),
            "FAILED" if tenant["failures"] else "ok",
        ]
        for tenant in report.tenant_figures()
    ]
    print()
    header = ["tenant", "sessions", "results offloaded", "bytes stored", "context chars saved"]
    print_table(rows, [*header, "approvals asked/granted", "isolation checks passed", "checks"])
    print()
    print("Where each tenant's results went:")
    for tenant, outcomes in report.by_tenant().items():
        print(f"  {shown_url(store).rstrip('/')}/{tenant}/  ({', '.join(o.session for o in outcomes)})")


# The `ServerSettings` fields that serve's flags of the same names override (and --storage-options, parsed first).
_SERVE_SETTINGS = ("store", "tokens_file", "model", "openai_base_url", "openai_model", "metrics_port", "metrics_host")


def _serve(arguments: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from offload_haystack_app.server.metrics_endpoint import WORKERS_VARIABLE
    from offload_haystack_app.server.settings import ServerSettings

    given = {name: getattr(arguments, name) for name in _SERVE_SETTINGS}
    given["storage_options"] = parse_storage_options(arguments.storage_options)
    overrides = {name: value for name, value in given.items() if value is not None}
    try:
        settings = ServerSettings(**overrides)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in error.errors())
        raise CommandError(f"Invalid server settings: {problems}") from error
    settings = _serve_s3(settings, arguments)
    metrics_line = _metrics_ports(settings, arguments)
    _check_store(settings, arguments.workers)
    settings.check_model()  # --model openai: one request to the endpoint; a ModelEndpointError (ValueError) is one line
    settings.check_store()  # the store refuses a second exclusive create, or serve stops (ServerStartupError: one line)
    _check_port(arguments.host, arguments.port)  # before the login links: they would be the other server's
    base = f"http://{arguments.host}:{arguments.port}/"
    made: dict[str, str] = {}
    if not settings.tokens:
        made = {secrets.token_urlsafe(24): tenant for tenant in DEMO_TENANTS}
        settings = settings.model_copy(update={"tokens": made})
    print(f"offload-haystack serve: {base}  ({arguments.workers} worker process(es))")
    print(f"  model: {settings.model_label()}")
    print(f"  store: {shown_url(settings.store)}")
    if metrics_line:
        print(metrics_line)
    if made:
        print("  demo tokens, made for this run (set OFFLOAD_SERVER_TOKENS or --tokens-file to use your own):")
        for token, tenant in made.items():
            print(f"    {tenant:<8} {base}#token={token}")
    sys.stdout.flush()
    # Worker processes build their app from the environment, so every worker gets the same settings and tokens.
    os.environ.update(settings.environment())
    os.environ[WORKERS_VARIABLE] = str(arguments.workers)  # the length of the workers' range of metrics ports
    # uvicorn raises the stop signal again once it has drained; SIGTERM's default action would then end a clean drain
    # as "killed by SIGTERM" (-15). Kept here, a drained stop exits 0.
    signal.signal(signal.SIGTERM, lambda number, frame: None)
    uvicorn.run(
        "offload_haystack_app.server.app:app_from_environment",
        factory=True,
        host=arguments.host,
        port=arguments.port,
        workers=arguments.workers,
        log_level=arguments.log_level,
        log_config=_log_config(arguments.log_level),
        # On SIGTERM: running requests get this long, then are cancelled; the app's lifespan drains what is left.
        timeout_graceful_shutdown=max(1, math.ceil(settings.drain_seconds)),
    )
    return 0


def _metrics_ports(settings: Any, arguments: argparse.Namespace) -> str | None:
    """
    Check that every worker can have a metrics port of its own, apart from the API's; say where they are.

    :returns: The line ``serve`` prints about them, or None when metrics are off.
    """
    first = settings.metrics_port
    if first is None:
        return None
    last = first + arguments.workers - 1
    if last > 65535:
        raise CommandError(
            f"--metrics-port {first} with --workers {arguments.workers} needs ports up to {last}: give a lower one."
        )
    if first <= arguments.port <= last:
        raise CommandError(
            f"--port {arguments.port} is one of the metrics ports {first}-{last} (one per worker): keep them apart."
        )
    ports = f"port {first}" if first == last else f"ports {first}-{last}, one per worker"
    return f"  metrics: http://{settings.metrics_host}:{first}/metrics ({ports})"


def _check_store(settings: Any, workers: int) -> None:
    """
    Stop before serving a store the server cannot use, in one line: one cheap request (a listing of one empty scope).

    Otherwise a missing bucket or a wrong endpoint gives a server that answers every request 503, and ``memory://``
    with several workers gives each worker a store of its own, so sessions would lose their history between requests.
    """
    if workers > 1 and str(settings.store).startswith("memory://"):
        raise CommandError(
            f"memory:// lives in one process, and --workers {workers} starts {workers}: each would have its own store. "
            "Use a directory or s3:// for several workers."
        )
    from haystack_integrations.offload.stores import FsspecToolResultStore

    try:
        root = FsspecToolResultStore(settings.store, storage_options=settings.resolved_storage_options())
        root.for_session("offload-haystack", "serve-check").list()
    except Exception as error:
        raise CommandError(f"Cannot use the store {shown_url(settings.store)}: {error}{stored_at(error)}") from error


def _check_port(host: str, port: int) -> None:
    """
    Stop, in one line, when the address is taken, before serve prints anything: a login link printed for a port
    another server holds would sign its reader in to that server.

    The port is bound as uvicorn binds it (``SO_REUSEADDR``, so a port whose last server just stopped is free) and
    released at once; uvicorn binds it again straight after.

    :raises CommandError: If the address cannot be bound (taken, or not an address of this machine).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise CommandError(
                f"Cannot listen on {host}:{port}: {error.strerror or error} (another server there? use --port)."
            ) from error


def _serve_s3(settings: Any, arguments: argparse.Namespace) -> Any:
    # The server's own S3 settings (OFFLOAD_SERVER_S3_*) rank with --storage-options: below a flag, above AWS_*.
    applied = applied_s3_choices(settings.resolved_storage_options(), s3_choices(arguments, settings.store))
    fields = {"endpoint_url": "s3_endpoint_url", "region": "s3_region"}
    update: dict[str, Any] = {fields[name]: value for name, value in applied.items() if name in fields}
    if "profile" in applied:
        update["storage_options"] = {**settings.storage_options, "profile": applied["profile"]}
    return settings.model_copy(update=update) if update else settings


def _log_config(level: str) -> dict[str, Any]:
    from uvicorn.config import LOGGING_CONFIG

    config: dict[str, Any] = json.loads(json.dumps(LOGGING_CONFIG))
    # The server's own loggers, and the library's turn runner it calls (`sessions`), at the chosen level.
    for name in ("offload_haystack_app.server", "haystack_integrations.offload.sessions"):
        config["loggers"][name] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    return config
