"""
The ``offload-haystack`` command line.

- ``demo``: the scripted multi-tenant demo (the README's first command); ``serve``: the reference server and its page;
- operator commands over any store URL: ``ls`` (the tenant/session tree with sizes), ``cat`` (one result), ``du``
  (usage per tenant and session), ``purge`` (a session, a tenant, or results and inactive sessions older than an age),
  ``audit`` (a session's approval record). Each takes ``--json`` for scripts.

The logic lives in `demo`, `server` and `operations`; this module only parses arguments and prints.
"""

import argparse
import json
import os
import secrets
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from haystack_integrations.offload.demo.model import SCRIPTED_MODEL_LABEL
from haystack_integrations.offload.errors import StoragePermissionError

DEFAULT_DEMO_STORE = "./offload-demo-results"
DEMO_TENANTS = ("acme", "globex")
EXIT_FAILED_CHECKS = 1
EXIT_ERROR = 2


class CommandError(Exception):
    """An error the command reports in one line, without a traceback."""


# Shared helpers


def _options(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        options = json.loads(text)
    except json.JSONDecodeError as error:
        raise CommandError(f"--storage-options is not valid JSON: {error.msg} (at character {error.pos}).") from error
    if not isinstance(options, dict):
        raise CommandError('--storage-options must be a JSON object, e.g. {"endpoint_url": "http://127.0.0.1:5000"}.')
    return options


def _shown(url: str) -> str:
    return str(Path(url).resolve()) if "://" not in url else url


def _root(arguments: argparse.Namespace) -> Any:
    from haystack_integrations.offload.stores import FsspecToolResultStore

    url: str = arguments.url
    try:
        root = FsspecToolResultStore(url, storage_options=_options(arguments.storage_options))
    except ValueError as error:
        raise CommandError(f"Invalid store URL {url!r}: {error}") from error
    if "://" not in url or url.startswith("file://"):
        directory = url.removeprefix("file://")
        if not Path(directory).is_dir():
            raise CommandError(f"No store at {_shown(directory)}: the directory does not exist.")
    return root


def _progress(total: int, unit: str, quiet: bool, description: str) -> Any:
    from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]  # tqdm ships no type information

    # disable=None: a bar on a terminal, nothing when stderr is a pipe or a file.
    return tqdm(total=total, unit=unit, desc=description, disable=True if quiet else None, file=sys.stderr)


def _size(count: int) -> str:
    size = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"  # pragma: no cover - the loop returns at GB


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(row[column])) for row in [header, *rows]) for column in range(len(header))]
    line = "  ".join(f"{title:<{widths[0]}}" if i == 0 else f"{title:>{widths[i]}}" for i, title in enumerate(header))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(f"{cell:<{widths[0]}}" if i == 0 else f"{cell:>{widths[i]}}" for i, cell in enumerate(row)))


# demo


def _demo(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.demo.runner import STEPS, run_demo

    options = _options(arguments.storage_options)
    tenants = tuple(tenant.strip() for tenant in arguments.tenants.split(",") if tenant.strip())
    store = arguments.store
    if not arguments.json:
        print(f"offload-haystack demo: {len(tenants)} tenants x {arguments.sessions} sessions, one shared Agent")
        print(f"  model: {SCRIPTED_MODEL_LABEL}")
        print(f"  store: {_shown(store)}")
        print("  hooks: OffloadHook, OffloadCompactionHook, ApprovalHook (send_invoice asks a person)")
    bar = _progress(len(tenants) * arguments.sessions * len(STEPS), "step", arguments.json, "sessions")
    try:
        report = run_demo(
            store,
            storage_options=options,
            tenants=tenants,
            sessions_per_tenant=arguments.sessions,
            on_progress=lambda tenant, session, step: bar.update(1),
            run_id=arguments.run_id,
        )
    finally:
        bar.close()
    rows = []
    summary = []
    for tenant, outcomes in report.by_tenant().items():
        figures = {
            "tenant": tenant,
            "sessions": len(outcomes),
            "results_offloaded": sum(o.results_offloaded for o in outcomes),
            "results_compacted": sum(o.results_compacted for o in outcomes),
            "bytes_stored": sum(o.bytes_stored for o in outcomes),
            "context_chars_saved": sum(o.context_chars_saved for o in outcomes),
            "approvals_asked": sum(o.approvals_asked for o in outcomes),
            "approvals_granted": sum(o.approvals_granted for o in outcomes),
            "isolation_checks_passed": sum(o.isolation_checks for o in outcomes),
            "other_checks_passed": sum(o.checks_passed for o in outcomes),
            "failures": [f"{o.session}: {failure}" for o in outcomes for failure in o.failures],
        }
        summary.append(figures)
        rows.append(
            [
                tenant,
                str(figures["sessions"]),
                f"{figures['results_offloaded']} ({figures['results_compacted']} by compaction)",
                f"{figures['bytes_stored']:,}",
                f"{figures['context_chars_saved']:,}",
                f"{figures['approvals_asked']}/{figures['approvals_granted']}",
                str(figures["isolation_checks_passed"]),
                "FAILED" if figures["failures"] else "ok",
            ]
        )
    if arguments.json:
        _print_json({"store": _shown(store), "model": SCRIPTED_MODEL_LABEL, "ok": report.ok, "tenants": summary})
    else:
        print()
        header = ["tenant", "sessions", "results offloaded", "bytes stored", "context chars saved"]
        _table(rows, [*header, "approvals asked/granted", "isolation checks passed", "checks"])
        print()
        print("Where each tenant's results went:")
        for tenant, outcomes in report.by_tenant().items():
            print(f"  {_shown(store).rstrip('/')}/{tenant}/  ({', '.join(o.session for o in outcomes)})")
    failures = [f"{o.tenant}/{o.session}: {failure}" for o in report.outcomes for failure in o.failures]
    if failures:
        print("\nFAILED checks:", file=sys.stderr)
        for failure in failures:
            print(f"  {failure}", file=sys.stderr)
        return EXIT_FAILED_CHECKS
    if not arguments.json:
        print(
            "\nAll checks passed: every result is stored byte for byte in its own session, approved calls ran exactly "
            "once and denied ones never, and no session could see another's results, approvals or messages."
        )
    return 0


# serve


def _serve(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.server._extra import SERVER_EXTRA_HINT

    try:
        import uvicorn

        from haystack_integrations.offload.server.settings import ServerSettings
    except ImportError as error:
        raise CommandError(f"{SERVER_EXTRA_HINT} ({error})") from error
    overrides: dict[str, Any] = {
        name: value
        for name, value in {
            "store": arguments.store,
            "storage_options": _options(arguments.storage_options),
            "tokens_file": arguments.tokens_file,
            "model": arguments.model,
            "openai_base_url": arguments.openai_base_url,
            "openai_model": arguments.openai_model,
        }.items()
        if value is not None
    }
    from pydantic import ValidationError

    try:
        settings = ServerSettings(**overrides)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in error.errors())
        raise CommandError(f"Invalid server settings: {problems}") from error
    base = f"http://{arguments.host}:{arguments.port}/"
    made: dict[str, str] = {}
    if not settings.tokens:
        made = {secrets.token_urlsafe(24): tenant for tenant in DEMO_TENANTS}
        settings = settings.model_copy(update={"tokens": made})
    print(f"offload-haystack serve: {base}  ({arguments.workers} worker process(es))")
    print(f"  model: {settings.model_label()}")
    print(f"  store: {_shown(settings.store)}")
    if made:
        print("  demo tokens, made for this run (set OFFLOAD_SERVER_TOKENS or --tokens-file to use your own):")
        for token, tenant in made.items():
            print(f"    {tenant:<8} {base}#token={token}")
    sys.stdout.flush()
    # Worker processes build their app from the environment, so every worker gets the same settings and tokens.
    os.environ.update(settings.environment())
    uvicorn.run(
        "haystack_integrations.offload.server.app:app_from_environment",
        factory=True,
        host=arguments.host,
        port=arguments.port,
        workers=arguments.workers,
        log_level=arguments.log_level,
        log_config=_log_config(arguments.log_level),
    )
    return 0


def _log_config(level: str) -> dict[str, Any]:
    from uvicorn.config import LOGGING_CONFIG

    config: dict[str, Any] = json.loads(json.dumps(LOGGING_CONFIG))
    config["loggers"]["haystack_integrations.offload.server"] = {
        "handlers": ["default"],
        "level": level.upper(),
        "propagate": False,
    }
    return config


# Operator commands


def _ls(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.operations import scan, usage

    root = _root(arguments)
    objects = scan(root, tenant=arguments.tenant, session=arguments.session)
    found = usage(objects)
    if arguments.json:
        payload = found.to_dict()
        if arguments.session is not None or arguments.recursive:
            payload["objects"] = [
                {
                    "path": item.path,
                    "kind": item.kind,
                    "size": item.size,
                    "namespace": item.namespace,
                    "tool_name": item.tool_name,
                    "created": item.created.isoformat() if item.created else None,
                }
                for item in objects
            ]
        _print_json(payload)
        return 0
    scope = "/".join(part for part in (arguments.tenant, arguments.session) if part)
    print(
        f"{_shown(arguments.url).rstrip('/')}/{scope + '/' if scope else ''}  "
        f"{len(found.tenants)} tenant(s), {sum(len(t.sessions) for t in found.tenants.values())} session(s), "
        f"{found.total.results} result(s), {_size(found.total.total_bytes)}"
    )
    listing = arguments.session is not None or arguments.recursive
    for tenant_name, tenant in sorted(found.tenants.items()):
        print(f"  {tenant_name}/  {tenant.total.results} results, {_size(tenant.total.total_bytes)}")
        for session_name, session in sorted(tenant.sessions.items()):
            if arguments.tenant is None and not listing:
                continue
            print(
                f"    {session_name}/  {session.results} results ({_size(session.result_bytes)}), "
                f"{session.documents} documents ({_size(session.document_bytes)})"
            )
            if not listing:
                continue
            for item in objects:
                if item.tenant == tenant_name and item.session == session_name and item.kind != "other":
                    detail = f"  {item.tool_name or '-'}  {item.created:%Y-%m-%d %H:%M:%S}" if item.created else ""
                    print(f"      {item.path.split('/', 2)[2]}  {_size(item.size)}{detail}")
    if found.other_objects:
        print(f"  (and {found.other_objects} object(s), {_size(found.other_bytes)}, not written by this library)")
    return 0


def _du(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.operations import scan, usage

    found = usage(scan(_root(arguments), tenant=arguments.tenant))
    if arguments.json:
        _print_json(found.to_dict())
        return 0
    rows = []
    for tenant_name, tenant in sorted(found.tenants.items()):
        rows.append(_usage_row(tenant_name, tenant.total))
        for session_name, session in sorted(tenant.sessions.items()):
            rows.append(_usage_row(f"  {session_name}", session))
    rows.append(_usage_row("total", found.total))
    _table(rows, ["tenant / session", "results", "result bytes", "documents", "document bytes", "total"])
    return 0


def _usage_row(name: str, figures: Any) -> list[str]:
    return [
        name,
        str(figures.results),
        f"{figures.result_bytes:,}",
        str(figures.documents),
        f"{figures.document_bytes:,}",
        _size(figures.total_bytes),
    ]


def _cat(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.errors import InvalidReferenceError, ResultNotFoundError
    from haystack_integrations.offload.operations import read_object

    root = _root(arguments)
    path = arguments.reference
    if arguments.tenant or arguments.session:
        if not (arguments.tenant and arguments.session):
            raise CommandError("Give both --tenant and --session, or a reference of the form tenant/session/name.")
        path = f"{arguments.tenant}/{arguments.session}/{arguments.reference}"
    chunk = 1024 * 1024
    end = None if arguments.length is None else arguments.offset + arguments.length
    position = arguments.offset
    output = open(arguments.output, "wb") if arguments.output else sys.stdout.buffer  # noqa: SIM115 - closed below
    try:
        data, total = read_object(root, path, position, min(position + chunk, end if end is not None else 2**63))
        stop = total if end is None else min(end, total)
        with _progress(max(stop - position, 0), "B", arguments.output is None, "cat") as bar:
            while data:
                output.write(data)
                bar.update(len(data))
                position += len(data)
                if position >= stop:
                    break
                data, _ = read_object(root, path, position, min(position + chunk, stop))
    except (InvalidReferenceError, ResultNotFoundError) as error:
        raise CommandError(f"No result {path!r} in this store ({error}).") from error
    finally:
        if arguments.output:
            output.close()
        else:
            output.flush()
    return 0


def _purge(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.operations import delete, parse_age, scan, select_older_than, select_scope

    if arguments.session and not arguments.tenant:
        raise CommandError("--session needs --tenant.")
    if not arguments.tenant and not arguments.older_than:
        raise CommandError("Say what to purge: --tenant T [--session S], and/or --older-than AGE (e.g. 30d).")
    root = _root(arguments)
    objects = scan(root, tenant=arguments.tenant, session=arguments.session)
    if arguments.older_than:
        try:
            age = parse_age(arguments.older_than)
        except ValueError as error:
            raise CommandError(str(error)) from error
        plan = select_older_than(objects, age, now=datetime.now(UTC), root=root)
        what = f"results older than {arguments.older_than}, and documents of sessions inactive that long"
    else:
        plan = select_scope(objects)
        what = "results and documents"
    scope = "/".join(part for part in (arguments.tenant, arguments.session) if part) or "every tenant"
    summary = {
        "scope": scope,
        "selection": what,
        "results": plan.results,
        "documents": plan.documents,
        "bytes": plan.bytes,
        "sessions": plan.sessions(),
        "dry_run": arguments.dry_run,
        "deleted": 0,
    }
    if not arguments.json:
        print(
            f"purge {scope}: {what}: {plan.results} result(s) and {plan.documents} document(s), {_size(plan.bytes)}, "
            f"in {len(plan.sessions())} session(s)"
        )
    if arguments.dry_run or not plan.objects:
        if arguments.json:
            _print_json(summary)
        elif arguments.dry_run:
            print("dry run: nothing was deleted")
        return 0
    if not arguments.yes and not _confirmed(f"Delete {len(plan.objects)} object(s)?"):
        raise CommandError("Nothing deleted: confirm with --yes (or preview with --dry-run).")
    with _progress(len(plan.objects), "obj", arguments.json, "deleting") as bar:
        summary["deleted"] = delete(root, plan.objects, on_batch=bar.update)
    if arguments.json:
        _print_json(summary)
    else:
        print(f"deleted {summary['deleted']} object(s)")
    return 0


def _confirmed(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in {"y", "yes"}


def _audit(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.approvals import read_audit

    root = _root(arguments)
    events = read_audit(root.for_session(arguments.tenant, arguments.session))
    if arguments.json:
        _print_json([event.model_dump(mode="json") for event in events])
        return 0
    if not events:
        print(f"No approval events in {arguments.tenant}/{arguments.session}.")
        return 0
    rows = [
        [
            f"{event.at:%Y-%m-%d %H:%M:%S}",
            event.event,
            event.actor or "-",
            event.tool_name or "-",
            _detail(event.detail),
        ]
        for event in events
    ]
    _table(rows, ["time (UTC)", "event", "actor", "tool", "detail"])
    return 0


def _detail(detail: dict[str, Any]) -> str:
    shown = {key: value for key, value in detail.items() if value not in (None, "", {}, [])}
    return ", ".join(f"{key}={value}" for key, value in shown.items())[:80] or "-"


# Parser


def _store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", help="store URL: a directory, file://..., memory://... or s3://bucket/prefix")
    parser.add_argument("--storage-options", help='fsspec options as JSON, e.g. {"endpoint_url": "http://..."}')
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of text")


def build_parser() -> argparse.ArgumentParser:
    """
    Build the argument parser for the ``offload-haystack`` command.

    :returns: The parser.
    """
    parser = argparse.ArgumentParser(prog="offload-haystack", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run a scripted multi-tenant demo against an embedded store")
    demo.add_argument("--store", default=DEFAULT_DEMO_STORE, help="store URL or directory (default: %(default)s)")
    demo.add_argument("--storage-options", help="fsspec storage options as JSON, e.g. an S3 endpoint_url")
    demo.add_argument("--tenants", default="acme,globex,initech", help="comma-separated tenant ids")
    demo.add_argument("--sessions", type=int, default=4, help="concurrent sessions per tenant (default: %(default)s)")
    demo.add_argument("--run-id", help="name the sessions chat-<run-id>-<n> (default: random, so runs never mix)")
    demo.add_argument("--json", action="store_true", help="print the per-tenant figures as JSON")
    demo.set_defaults(handler=_demo)

    serve = commands.add_parser("serve", help="run the reference multi-tenant server and its web page")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    serve.add_argument("--workers", type=int, default=1, help="worker processes (default: %(default)s)")
    serve.add_argument("--store", help="store URL (default: $OFFLOAD_SERVER_STORE or ./offload-server-results)")
    serve.add_argument("--storage-options", help="fsspec storage options as JSON")
    serve.add_argument("--tokens-file", help="JSON file of bearer token -> tenant (default: demo tokens)")
    serve.add_argument("--model", choices=["scripted", "openai"], help="scripted (default) or an OpenAI-compatible API")
    serve.add_argument("--openai-base-url", help="OpenAI-compatible endpoint (key: $OFFLOAD_SERVER_OPENAI_API_KEY)")
    serve.add_argument("--openai-model", help="model name at that endpoint")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(handler=_serve)

    ls = commands.add_parser("ls", help="the tenant/session tree with sizes")
    _store_arguments(ls)
    ls.add_argument("--tenant", help="list this tenant's sessions")
    ls.add_argument("--session", help="list this session's results and documents (needs --tenant)")
    ls.add_argument("-R", "--recursive", action="store_true", help="list every result and document")
    ls.set_defaults(handler=_ls)

    du = commands.add_parser("du", help="usage per tenant and session")
    _store_arguments(du)
    du.add_argument("--tenant", help="only this tenant")
    du.set_defaults(handler=_du)

    cat = commands.add_parser("cat", help="print one stored result (bytes as stored)")
    _store_arguments(cat)
    cat.add_argument("reference", help="tenant/session/name as `ls` shows it, or a name with --tenant and --session")
    cat.add_argument("--tenant")
    cat.add_argument("--session")
    cat.add_argument("--offset", type=int, default=0, help="first byte (default: 0)")
    cat.add_argument("--length", type=int, help="bytes to print (default: to the end)")
    cat.add_argument("-o", "--output", help="write to this file instead of standard output")
    cat.set_defaults(handler=_cat)

    purge = commands.add_parser("purge", help="delete a session, a tenant, or results older than an age")
    _store_arguments(purge)
    purge.add_argument("--tenant", help="purge this tenant (every session, results and documents)")
    purge.add_argument("--session", help="purge only this session of --tenant")
    purge.add_argument(
        "--older-than",
        help="purge results older than this age (e.g. 90m, 12h, 30d, 2w), and documents of sessions inactive as long",
    )
    purge.add_argument("--dry-run", action="store_true", help="show what would be deleted, delete nothing")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    purge.set_defaults(handler=_purge)

    audit = commands.add_parser("audit", help="a session's approval audit record")
    _store_arguments(audit)
    audit.add_argument("--tenant", required=True)
    audit.add_argument("--session", required=True)
    audit.set_defaults(handler=_audit)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run the ``offload-haystack`` command.

    :param argv: Arguments (default: ``sys.argv[1:]``).
    :returns: The process exit code: 0, 1 when demo checks failed, 2 on errors.
    """
    arguments = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = arguments.handler
    try:
        return int(handler(arguments))
    except BrokenPipeError:
        # The reader went away (`offload-haystack ls ... | head`): stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except CommandError as error:
        print(f"offload-haystack: error: {error}", file=sys.stderr)
    except StoragePermissionError as error:
        print(
            f"offload-haystack: error: {error} Check the credentials (--storage-options key/secret, or the "
            "AWS_* environment variables) and the bucket policy.",
            file=sys.stderr,
        )
    except (ValueError, OSError, ImportError) as error:
        print(f"offload-haystack: error: {error}{_cause(error)}", file=sys.stderr)
    return EXIT_ERROR


def _cause(error: BaseException) -> str:
    cause = error.__cause__
    if cause is None or str(cause) in str(error):
        return ""
    text = str(cause).splitlines()[0][:200] if str(cause) else type(cause).__name__
    return f" ({type(cause).__name__}: {text})"


if __name__ == "__main__":
    sys.exit(main())
