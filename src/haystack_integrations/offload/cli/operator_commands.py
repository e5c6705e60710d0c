"""
The operator commands: ``ls``, ``du``, ``cat``, ``purge``, ``audit`` and ``doctor`` over any store URL.

The logic lives in `operations`; these parse what the parser gave them, call it, and print.
"""

import argparse
import base64
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from haystack_integrations.offload.cli.toolkit import (
    CommandError,
    ListingProgress,
    print_json,
    print_table,
    progress_bar,
    root_store,
    show_progress,
    shown_url,
    size_text,
)

# Operator commands


def _scan(arguments: argparse.Namespace, root: Any, tenant: str | None, session: str | None = None) -> list[Any]:
    """`operations.scan` with a progress line on standard error (see `ListingProgress`)."""
    from haystack_integrations.offload.operations import scan

    with ListingProgress(_scoped_url(arguments.url, tenant, session), show_progress(arguments)) as progress:
        objects = scan(root, tenant=tenant, session=session)
        progress.found(len(objects))
    return objects


def _scoped_url(url: str, tenant: str | None, session: str | None) -> str:
    """The store URL down to the tenant and session a listing is limited to, as its progress line and `ls` show it."""
    scope = "/".join(part for part in (tenant, session) if part)
    return f"{shown_url(url).rstrip('/')}/{scope + '/' if scope else ''}"


def ls_command(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.operations import summarize_root, summarize_tenant, usage
    from haystack_integrations.offload.operations.inventory import roots_below

    root = root_store(arguments)
    if arguments.session is None and not (arguments.recursive or arguments.exact):
        if arguments.tenant is not None:
            summary = summarize_tenant(root, arguments.tenant)
            if summary is not None:
                return _print_tenant_summary(arguments, summary)
        else:
            summarized = summarize_root(root)
            if summarized is not None:
                return _print_root_summary(arguments, summarized)
    objects = _scan(arguments, root, arguments.tenant, arguments.session)
    reading = _inside_layout(arguments, objects)
    if reading is not None:
        objects = reading.objects
    found = usage(objects)
    listing = arguments.session is not None or arguments.recursive
    if arguments.json:
        payload = found.to_dict()
        if reading is not None:
            payload["listed_as"] = {"root": reading.root_url, "tenant": reading.tenant, "session": reading.session}
        if listing:
            payload["objects"] = [_listed_object(item) for item in objects]
        print_json(payload)
        return 0
    if reading is not None:
        what = f"session {reading.session!r} of tenant" if reading.session else "tenant"
        print(
            f"listing {what} {reading.tenant!r} of root {shown_url(reading.root_url)} (as a root, the URL holds "
            "nothing of this library's; paths below are relative to that root)"
        )
    sessions = sum(len(t.sessions) for t in found.tenants.values())
    counts = f"{len(found.tenants)} tenant(s), {sessions} session(s), " if arguments.tenant is None else ""
    if arguments.tenant is not None and arguments.session is None:
        counts = f"{sessions} session(s), "
    print(f"{_scoped_url(arguments.url, arguments.tenant, arguments.session)}  {counts}{_contents(found.total)}")
    # The first line is the URL's own scope: below it come its children only (a tenant's URL lists its sessions, not
    # the tenant again), so each level is indented once more than its parent.
    tenant_indent = "  "
    session_indent = tenant_indent if arguments.tenant is not None else tenant_indent * 2
    object_indent = session_indent if arguments.session is not None else session_indent + "  "
    for tenant_name, tenant in sorted(found.tenants.items()):
        if arguments.tenant is None:
            print(f"{tenant_indent}{tenant_name}/  {_contents(tenant.total)}")
        for session_name, session in sorted(tenant.sessions.items()):
            if arguments.tenant is None and not listing:
                continue
            if arguments.session is None:
                print(
                    f"{session_indent}{session_name}/  {session.results} results ({size_text(session.result_bytes)}), "
                    f"{session.documents} documents ({size_text(session.document_bytes)})"
                )
            if not listing:
                continue
            for item in objects:
                if item.tenant == tenant_name and item.session == session_name and item.kind != "other":
                    detail = f"  {item.tool_name or '-'}  {item.created:%Y-%m-%d %H:%M:%S}" if item.created else ""
                    # The whole path, as `cat` takes it.
                    print(f"{object_indent}{item.path}  {size_text(item.size)}{detail}")
    if found.other_objects:
        print(f"  (and {found.other_objects} object(s), {size_text(found.other_bytes)}, not written by this library)")
        roots = roots_below(objects)
        if roots:  # a bucket or prefix above the roots: their objects are the library's, one level too high up
            listed = ", ".join(_scoped_url(arguments.url, None, None) + root for root in roots)
            print(f"  Some of these lie in what look like roots below this URL; list one of them: {listed}")
    return 0


def _print_tenant_summary(arguments: argparse.Namespace, summary: Any) -> int:
    """A tenant's sessions by name and its totals from its usage mark: no walk of its objects."""
    marked = summary.marked
    reconciled = marked.reconciled.strftime("%Y-%m-%d %H:%M:%S UTC") if marked.reconciled else "never"
    if arguments.json:
        print_json({**_marked_json(summary.tenant, marked), "sessions": summary.sessions})
        return 0
    print(
        f"{_scoped_url(arguments.url, arguments.tenant, None)}  {len(summary.sessions)} session(s), "
        f"{marked.results} result(s), {size_text(marked.size)} of results and documents"
    )
    for session in summary.sessions:
        print(f"  {session}/")
    print(
        f"Totals from the tenant's usage mark #{marked.mark} (last reconciled with a listing: {reconciled}); "
        "--exact lists every object and counts each session."
    )
    return 0


def _print_root_summary(arguments: argparse.Namespace, summary: Any) -> int:
    """Every tenant from its usage mark, or walked where it keeps none: no walk of the whole root."""
    if arguments.json:
        tenants = [_tenant_summary_json(summary, name) for name in summary.tenants]
        print_json(
            {"source": "usage_marks", "results": summary.results, "total_bytes": summary.size, "tenants": tenants}
        )
        return 0
    print(
        f"{_scoped_url(arguments.url, None, None)}  {len(summary.tenants)} tenant(s), {summary.results} result(s), "
        f"{size_text(summary.size)} of results and documents"
    )
    for name in summary.tenants:
        mark = summary.marked.get(name)
        if mark is None:
            print(f"  {name}/  {_contents(summary.walked[name].total)}")
        else:
            marked = f"{mark.results} result(s), {size_text(mark.size)} of results and documents (mark #{mark.mark})"
            print(f"  {name}/  {marked}")
    print(
        f"{len(summary.marked)} of {len(summary.tenants)} tenant(s) from their usage marks (what quota'd writers had "
        "marked; deletes and expiry show after the next reconcile); --exact walks every object and counts each session."
    )
    return 0


def _tenant_summary_json(summary: Any, name: str) -> dict[str, Any]:
    """One tenant of ``ls --json``'s root summary: its mark's figures, or its walk's."""
    mark = summary.marked.get(name)
    if mark is None:
        return {"source": "listing", **summary.walked[name].to_dict()}
    return _marked_json(name, mark)


def _marked_json(tenant: str, marked: Any) -> dict[str, Any]:
    """A tenant's figures as its usage mark gives them, as ``du --json`` and ``ls --json`` print them."""
    return {
        "tenant": tenant,
        "source": "usage_mark",
        "results": marked.results,
        "total_bytes": marked.size,
        "mark": marked.mark,
        "reconciled": marked.reconciled.isoformat() if marked.reconciled else None,
    }


def _contents(figures: Any) -> str:
    """Results and documents, each with its bytes, then the total: documents are not results."""
    return (
        f"{figures.results} result(s) ({size_text(figures.result_bytes)}), {figures.documents} document(s) "
        f"({size_text(figures.document_bytes)}), {size_text(figures.total_bytes)} in all"
    )


def _listed_object(item: Any) -> dict[str, Any]:
    """One stored object as ``ls --json`` lists it."""
    fields = {name: getattr(item, name) for name in ("path", "kind", "size", "namespace", "tool_name")}
    return {**fields, "created": item.created.isoformat() if item.created else None}


def _inside_layout(arguments: argparse.Namespace, objects: list[Any]) -> Any:
    """
    `operations.read_inside_layout` for a URL given without ``--tenant``: a tenant's or session's prefix is listed as
    that tenant or session of the root above it (`arguments` then name that root and scope).
    """
    from haystack_integrations.offload.operations import read_inside_layout

    if arguments.tenant is not None or arguments.session is not None:
        return None  # explicit flags: the URL is the root, as given
    reading = read_inside_layout(arguments.url, objects)
    if reading is not None:
        arguments.url, arguments.tenant, arguments.session = reading.root_url, reading.tenant, reading.session
    return reading


def du_command(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.operations import usage

    root = root_store(arguments)
    if arguments.tenant is not None and not arguments.exact:
        marked = root.marked_usage(arguments.tenant)
        if marked is not None:
            return _print_marked_usage(arguments, marked)
    found = usage(_scan(arguments, root, arguments.tenant))
    if arguments.json:
        print_json(found.to_dict())
        return 0
    rows = []
    for tenant_name, tenant in sorted(found.tenants.items()):
        rows.append(_usage_row(tenant_name, tenant.total))
        for session_name, session in sorted(tenant.sessions.items()):
            rows.append(_usage_row(f"  {session_name}", session))
    rows.append(_usage_row("total", found.total))
    print_table(rows, ["tenant / session", "results", "result bytes", "documents", "document bytes", "total"])
    return 0


def _print_marked_usage(arguments: argparse.Namespace, marked: Any) -> int:
    """A tenant's usage from its newest usage mark: two requests at any size, instead of a walk of every object."""
    reconciled = marked.reconciled.strftime("%Y-%m-%d %H:%M:%S UTC") if marked.reconciled else None
    if arguments.json:
        print_json(_marked_json(arguments.tenant, marked))
        return 0
    print_table(
        [[arguments.tenant, str(marked.results), f"{marked.size:,}", size_text(marked.size)]],
        ["tenant", "results", "bytes (results and documents)", "total"],
    )
    print(
        f"From the tenant's usage mark #{marked.mark} (last reconciled with a listing: {reconciled or 'never'}). "
        "Not in it: each writer's writes since its last mark (at most its quota allowance), and deletes and expiry "
        "since the reconcile. --exact lists every object, per session."
    )
    return 0


def _usage_row(name: str, figures: Any) -> list[str]:
    return [
        name,
        str(figures.results),
        f"{figures.result_bytes:,}",
        str(figures.documents),
        f"{figures.document_bytes:,}",
        size_text(figures.total_bytes),
    ]


def cat_command(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.errors import ResultNotFoundError

    root = root_store(arguments)
    path = arguments.reference
    if arguments.tenant or arguments.session:
        if not (arguments.tenant and arguments.session):
            raise CommandError("Give both --tenant and --session, or a reference of the form tenant/session/name.")
        path = f"{arguments.tenant}/{arguments.session}/{arguments.reference}"
    start = arguments.offset
    end = None if arguments.length is None else start + arguments.length
    try:
        # The first piece is read here, before any output file is opened: a wrong path must not truncate the file.
        pieces, total, kind = _read_stored(root, path, start, end)
    except (ValueError, ResultNotFoundError) as error:  # ValueError: a refused reference, id or namespace
        raise CommandError(f"No result or document {path!r} in this store ({error}).") from error
    if arguments.json:
        return _cat_json(arguments.output, path, kind, total, start, b"".join(pieces))
    stop = total if end is None else min(end, total)
    output = open(arguments.output, "wb") if arguments.output else sys.stdout.buffer  # noqa: SIM115 - closed below
    try:
        # Not while the bytes go to standard output: on a terminal, the bar would mix with them.
        with progress_bar(max(stop - start, 0), "B", False if arguments.output is None else None, "cat") as bar:
            for piece in pieces:
                output.write(piece)
                bar.update(len(piece))
    finally:
        if arguments.output:
            output.close()
        else:
            output.flush()
    return 0


_CAT_CHUNK = 1024 * 1024


def _read_stored(root: Any, path: str, start: int, end: int | None) -> tuple[Iterator[bytes], int, str]:
    """
    Bytes ``[start, end)`` of a result (``tenant/session/name``) or a document (``tenant/session/.namespace/name``).

    :returns: The bytes in pieces (the first one already read), the object's size, and ``"result"`` or ``"document"``.
    """
    from haystack_integrations.offload.operations import read_object
    from haystack_integrations.offload.stores.compact_documents import decompress_document

    parts = path.split("/")
    if len(parts) == 4 and parts[2].startswith("."):
        # Through the session's documents API, which validates the ids, the namespace and the name.
        tenant, session, directory, name = parts
        stored = root.for_session(tenant, session).documents(directory[1:]).get(name)
        document = decompress_document(stored)  # a history document is stored gzipped; shown as written
        return iter([document[start:end]]), len(document), "document"
    first, total = read_object(root, path, start, start + _CAT_CHUNK if end is None else min(start + _CAT_CHUNK, end))
    stop = total if end is None else min(end, total)

    def rest() -> Iterator[bytes]:
        position = start + len(first)
        while position < stop:
            piece, _ = read_object(root, path, position, min(position + _CAT_CHUNK, stop))
            if not piece:
                return
            yield piece
            position += len(piece)

    return itertools.chain([first], rest()), total, "result"


def _cat_json(output: str | None, path: str, kind: str, total: int, start: int, data: bytes) -> int:
    from haystack_integrations.offload.stores.names import parse_object_name

    entry: dict[str, Any] = {"path": path, "kind": kind, "size": total, "offset": start, "length": len(data)}
    parsed = parse_object_name(path.rsplit("/", 1)[-1]) if kind == "result" else None
    if parsed is not None:
        entry.update(tool_name=parsed.tool_name, content_kind=parsed.kind, created=parsed.created.isoformat())
    if output:
        Path(output).write_bytes(data)
        entry["output"] = output
    else:
        # Text as it is when the bytes are UTF-8 (a range may cut a character: then base64, like any binary).
        try:
            entry.update(encoding="utf-8", content=data.decode("utf-8"))
        except UnicodeDecodeError:
            entry.update(encoding="base64", content=base64.b64encode(data).decode("ascii"))
    print_json(entry)
    return 0


def purge_command(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.operations import parse_age
    from haystack_integrations.offload.operations.purge import carry_out, plan_purge

    if arguments.session and not arguments.tenant:
        raise CommandError("--session needs --tenant.")
    if not arguments.tenant and arguments.older_than is None:
        raise CommandError("Say what to purge: --tenant T [--session S], and/or --older-than AGE (e.g. 30d).")
    age = None
    if arguments.older_than is not None:
        try:  # before the store is touched; ages past MAX_AGE (100 years) are refused, as the store refuses them
            age = parse_age(arguments.older_than)
        except ValueError as error:
            raise CommandError(str(error)) from error
    root = root_store(arguments)
    # The store's own purge chooses (one listing), with a progress line as `_scan` shows one.
    with ListingProgress(
        _scoped_url(arguments.url, arguments.tenant, arguments.session), show_progress(arguments)
    ) as progress:
        plan = plan_purge(root, tenant=arguments.tenant, session=arguments.session, older_than=age)
        progress.found(plan.selection.listed if plan.selection is not None else len(plan.objects))
    if age is not None:
        what = f"results older than {arguments.older_than}, and documents of sessions inactive that long"
    else:
        what = "results and documents"
    scope = "/".join(part for part in (arguments.tenant, arguments.session) if part) or "every tenant"
    figures = {name: getattr(plan, name) for name in ("results", "documents", "temporary_files", "bytes")}
    summary = {
        "scope": scope,
        "selection": what,
        **figures,
        "sessions": plan.sessions(),
        "dry_run": arguments.dry_run,
        "deleted": 0,
    }
    # Every purge also takes the temporary files of writers that died: it is the store's own purge.
    stale = f"{plan.temporary_files} stale temporary file(s)" if plan.temporary_files else ""
    if not arguments.json:
        print(
            f"purge {scope}: {what}: {plan.results} result(s) and {plan.documents} document(s)"
            f"{', and ' + stale if stale else ''}, "
            f"{size_text(plan.bytes)}, in {len(plan.sessions())} session(s)"
        )
    if arguments.dry_run:
        # What would go, one line each, as `aws s3 rm --dryrun` lists it: paths as `cat` and `ls -R` show them.
        if arguments.json:
            summary["objects"] = [{"path": item.path, "kind": item.kind, "size": item.size} for item in plan.objects]
        else:
            for item in plan.objects:
                print(f"(dry run) delete: {item.path}  {size_text(item.size)}")
    if plan.objects and not arguments.dry_run:
        if not arguments.yes and not _confirmed(f"Delete {len(plan.objects)} object(s)?"):
            raise CommandError("Nothing deleted: confirm with --yes (or preview with --dry-run).")
        with progress_bar(len(plan.objects), "obj", show_progress(arguments), "deleting") as bar:
            summary["deleted"] = carry_out(plan, on_batch=bar.update)
    if arguments.json:
        print_json(summary)
    elif arguments.dry_run:
        print("dry run: nothing was deleted")
    elif plan.objects:
        print(f"deleted {summary['deleted']} object(s)" + (f" ({stale} among them)" if stale else ""))
    return 0


def doctor_command(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.operations.conformance import CHECK_NAMES, CheckResult, run_conformance

    if arguments.url and arguments.store and arguments.url != arguments.store:
        raise CommandError(
            f"Give the store once: {shown_url(arguments.url)!r} and --store {shown_url(arguments.store)!r} differ."
        )
    arguments.url = arguments.store or arguments.url
    if not arguments.url:
        raise CommandError("Say which store to check: offload-haystack doctor --store URL.")
    root = root_store(arguments)
    if arguments.json:
        report = run_conformance(root)
        print_json(report.to_dict())
        return report.exit_status
    print(f"offload-haystack doctor: {shown_url(root.url)} (engine {root.resolved_engine})")
    print()
    # Each row as its check ends: a slow or silent store shows where it is, not a blank screen until the end.
    name_width = max(len(name) for name in CHECK_NAMES)
    verdict_width = max(len(verdict) for verdict in _VERDICTS)
    print(f"{'check':<{name_width}}  {'verdict':<{verdict_width}}  detail")
    print("-" * (name_width + verdict_width + 12))

    def row(check: CheckResult) -> None:
        print(f"{check.name:<{name_width}}  {check.verdict.upper():<{verdict_width}}  {check.detail}", flush=True)

    report = run_conformance(root, on_check=row)
    counts = {verdict: sum(check.verdict == verdict for check in report.checks) for verdict in _VERDICTS}
    print()
    print(f"checked below {report.prefix}/")
    print(
        ", ".join(f"{count} {verdict}" for verdict, count in counts.items() if count) + f"; exit {report.exit_status}"
    )
    return report.exit_status


_VERDICTS = ("pass", "warn", "skipped", "unknown", "fail")


def _confirmed(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    return input(f"{question} [y/N] ").strip().lower() in {"y", "yes"}


def audit_command(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.approvals import read_audit, repair_audit

    tenant, session = _audited_session(arguments)
    store = root_store(arguments).for_session(tenant, session)
    if arguments.repair:
        appended = repair_audit(store)
        print(f"Repaired {tenant}/{session}: appended {appended} audit event(s) its records prove.", file=sys.stderr)
    events = read_audit(store)
    if arguments.json:
        print_json([event.model_dump(mode="json") for event in events])
        return 0
    if not events:
        print(f"No approval events in {tenant}/{session}.")
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
    print_table(rows, ["time (UTC)", "event", "actor", "tool", "detail"], text_columns=5)
    return 0


def _audited_session(arguments: argparse.Namespace) -> tuple[str, str]:
    """
    The session `audit` reads: ``tenant/session`` as `ls` prints it (the path form `cat` takes), or the two flags.

    :raises CommandError: If neither or both forms are given, or the path is not ``tenant/session``.
    """
    path: str | None = arguments.session_path
    if path is not None:
        if arguments.tenant is not None or arguments.session is not None:
            raise CommandError("Give the session once: tenant/session, or --tenant and --session.")
        parts = path.strip("/").split("/")
        if len(parts) != 2 or not all(parts):
            raise CommandError(f"{path!r} is not a session: give tenant/session, as `ls` prints it (e.g. acme/chat-1).")
        return parts[0], parts[1]
    if arguments.tenant is None or arguments.session is None:
        raise CommandError("Say whose audit record: tenant/session (e.g. acme/chat-1), or --tenant and --session.")
    return arguments.tenant, arguments.session


_DETAIL_WIDTH = 80


def _detail(detail: dict[str, Any]) -> str:
    shown = {key: value for key, value in detail.items() if value not in (None, "", {}, [])}
    text = ", ".join(f"{key}={value}" for key, value in shown.items()) or "-"
    return text if len(text) <= _DETAIL_WIDTH else text[: _DETAIL_WIDTH - 3] + "..."  # cut, and says so
