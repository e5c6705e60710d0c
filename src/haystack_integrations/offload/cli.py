"""
The ``offload-haystack`` command line: the operator commands ``ls``, ``cat``, ``du``, ``purge``, ``audit`` and
``doctor`` over any store URL, and the commands other distributions add (the reference app's ``demo`` and ``serve``).

The logic lives in `operations`; this module parses arguments and prints. A distribution adds a command through the
``offload_haystack.commands`` entry point group: each entry names a function that takes the subcommand parsers and
adds one (with ``set_defaults(handler=...)``), using the helpers below for the store and S3 arguments.
"""

import argparse
import atexit
import base64
import importlib.util
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, NoReturn

from haystack_integrations.offload.errors import OffloadError, StorageError, StoragePermissionError

EXIT_FAILED_CHECKS = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
S3_PROTOCOLS = frozenset({"s3", "s3a"})
S3_ENVIRONMENT = {
    "endpoint_url": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
    "profile": ("AWS_PROFILE",),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
}
"""Where each S3 flag's default comes from, first set variable first (the service-specific endpoint before the global
one, as the AWS CLI reads them)."""
ENGINES = ("auto", "fsspec", "obstore")
COMMANDS_GROUP = "offload_haystack.commands"
"""The entry point group through which other distributions add commands (the reference app: ``demo``, ``serve``)."""
PROGRESS_DELAY = 1.0
"""Seconds a listing runs before its progress line appears on a terminal (with ``--progress``: at once)."""
PROGRESS_INTERVAL = 0.5
"""Seconds between updates of a listing's progress line on a terminal."""
OPERATOR_RETRY_DEADLINE = 10.0
"""
Seconds after a request's first attempt in which the operator commands start another (the store's default: 30). Quick
transient failures (a 503, a reset) are still retried as often as the default policy does; an attempt that waits out
the read timeout (15 s by default) is not repeated, so a store that never answers ends a command in one timeout.
"""


Handler = Callable[[argparse.Namespace], int]  # a subcommand: the parsed command line in, the exit code out


class CommandError(OffloadError):
    """An error the command reports in one line, without a traceback."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (argparse prints the usage first), exiting 2 as argparse does."""

    def error(self, message: str) -> NoReturn:
        hint = f"see {self.prog} --help"
        if message.startswith("argument command: invalid choice: ") and ("'demo'" in message or "'serve'" in message):
            hint = "demo and serve come with the reference app: pip install ./app from a checkout"
        self.exit(EXIT_ERROR, f"{self.prog}: error: {_one_line(message)} ({hint})\n")


def _one_line(text: str) -> str:
    return " ".join(text.split())


# Shared helpers


def parse_storage_options(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        options = json.loads(text)
    except json.JSONDecodeError as error:
        raise CommandError(f"--storage-options is not valid JSON: {error.msg} (at character {error.pos}).") from error
    if not isinstance(options, dict):
        raise CommandError('--storage-options must be a JSON object, e.g. {"endpoint_url": "http://127.0.0.1:5000"}.')
    return options


def _is_s3(url: str) -> bool:
    return "://" in url and url.split("://", 1)[0].lower() in S3_PROTOCOLS


def s3_choices(arguments: argparse.Namespace, url: str) -> dict[str, tuple[str, str]]:
    """
    The S3 flags given, else their defaults from the environment, each with where it came from.

    :param arguments: The parsed command line.
    :param url: The store URL.
    :returns: ``{option: (value, flag or variable name)}`` for ``endpoint_url``, ``profile`` and ``region``.
    :raises CommandError: If a flag is given for a store that is not on S3, or a value is malformed.
    """
    flags: dict[str, str | None] = {name: getattr(arguments, name, None) for name in S3_ENVIRONMENT}
    if not _is_s3(url):
        given = [f"--{name.replace('_', '-')}" for name, value in flags.items() if value is not None]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise CommandError(f"{' and '.join(given)} only {verb} to s3:// stores, and {shown_url(url)!r} is not one.")
        return {}  # the AWS variables are for S3: with them set, a local or memory store still just works
    chosen: dict[str, tuple[str, str]] = {}
    for name, variables in S3_ENVIRONMENT.items():
        flag = flags[name]
        if flag is not None:
            chosen[name] = (flag, f"--{name.replace('_', '-')}")
        elif variable := next((variable for variable in variables if os.environ.get(variable)), None):
            chosen[name] = (os.environ[variable], variable)
    from haystack_integrations.offload.stores.options import check_endpoint_url, check_region

    checks = {"endpoint_url": check_endpoint_url, "region": check_region, "profile": _check_profile}
    for name, (value, source) in chosen.items():
        try:
            checks[name](value, source)
        except ValueError as error:
            raise CommandError(str(error)) from error
    return chosen


def _check_profile(value: str, source: str) -> None:
    if not value.strip() or value != value.strip():
        raise ValueError(f"{source} is not a profile name: {value!r}.")


def applied_s3_choices(options: dict[str, Any], chosen: dict[str, tuple[str, str]]) -> dict[str, str]:
    """The S3 choices that apply over s3fs storage options: a flag over what is there, a variable only into a gap."""
    present = {
        "endpoint_url": "endpoint_url" in options,
        "profile": "profile" in options,
        "region": "region_name" in (options.get("client_kwargs") or {}),
    }
    return {name: value for name, (value, source) in chosen.items() if source.startswith("--") or not present[name]}


def storage_options_from(arguments: argparse.Namespace, url: str) -> dict[str, Any] | None:
    """
    ``--storage-options`` with the S3 flags over it and the AWS variables under it.

    :param arguments: The parsed command line.
    :param url: The store URL.
    :returns: The store's fsspec options, or None when there are none.
    :raises CommandError: If the JSON is not an object, or an S3 flag or variable is malformed or misplaced.
    """
    from haystack_integrations.offload.stores.options import with_s3_choices

    options = parse_storage_options(arguments.storage_options) or {}
    return with_s3_choices(options, **applied_s3_choices(options, s3_choices(arguments, url))) or None


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"{value} is out of range: give {bounds}")
        return value

    return parse


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("offload-haystack")
    except PackageNotFoundError:  # a source tree on sys.path that was never installed
        return "(not installed)"


def shown_url(url: str) -> str:
    """A store URL as the commands print it: a local path made absolute, credentials in a URL hidden."""
    from haystack_integrations.offload.stores.options import redacted_url

    return str(Path(url).resolve()) if "://" not in url else redacted_url(url)


def _root(arguments: argparse.Namespace) -> Any:
    from haystack_integrations.offload.stores import FsspecToolResultStore

    url: str = arguments.url
    engine: str = arguments.engine
    options = storage_options_from(arguments, url)
    if engine == "obstore":
        _check_obstore(url)
    from haystack_integrations.offload.stores.retry import RetryPolicy

    retry = RetryPolicy(deadline=OPERATOR_RETRY_DEADLINE)  # the default policy, bar its deadline
    try:
        root = FsspecToolResultStore(
            url, storage_options=options, engine=engine, retry=retry, **_tenant_isolation(arguments)
        )
    except ValueError as error:
        what = "Cannot use --engine obstore for" if engine == "obstore" else "Cannot open the store"
        raise CommandError(f"{what} {shown_url(url)!r}: {error}") from error
    if "://" not in url or url.startswith("file://"):
        directory = url.removeprefix("file://")
        if not Path(directory).is_dir():
            raise CommandError(f"No store at {shown_url(directory)}: the directory does not exist.")
    return root


def _tenant_isolation(arguments: argparse.Namespace) -> dict[str, Any]:
    """The store's keys per tenant (every command over a store takes them) and credentials per tenant (`doctor`)."""
    isolation: dict[str, Any] = {}
    if getattr(arguments, "tenant_role_arn", None):
        from haystack_integrations.offload.stores import AssumeRoleCredentials

        isolation["credentials"] = AssumeRoleCredentials(
            arguments.tenant_role_arn, sts_endpoint_url=arguments.sts_endpoint_url
        )
    variable = getattr(arguments, "sse_c_master_key_env", None)
    if variable:
        from haystack.utils import Secret

        from haystack_integrations.offload.stores import TenantKeys

        if not os.environ.get(variable):
            raise CommandError(f"--sse-c-master-key-env names {variable}, which is not set.")
        isolation["encryption"] = TenantKeys(Secret.from_env_var(variable))
    return isolation


def _check_obstore(url: str) -> None:
    """
    Refuse ``--engine obstore`` where it cannot work, in one line, before anything is built.

    :raises CommandError: If the store is not on S3 or obstore is not installed.
    """
    if not _is_s3(url):
        raise CommandError(
            f"--engine obstore serves s3:// stores only, and {shown_url(url)!r} is not one: use --engine fsspec."
        )
    if importlib.util.find_spec("obstore") is None:
        raise CommandError(
            '--engine obstore needs obstore, which is not installed: install the "s3" extra (pip install ".[s3]" '
            "in a checkout, or a built wheel with [s3]), or use --engine fsspec."
        )


def _show_progress(arguments: argparse.Namespace) -> bool | None:
    """``--progress``: True; ``--no-progress``: False; neither: None (on a terminal, and not with ``--json``)."""
    chosen: bool | None = getattr(arguments, "progress", None)
    if chosen is None and getattr(arguments, "json", False):
        return False
    return chosen


def progress_bar(total: int, unit: str, show: bool | None, description: str) -> Any:
    """
    A progress bar on standard error.

    :param show: True: always; False: never; None: when standard error is a terminal (not a pipe or a file).
    """
    from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]  # tqdm ships no type information

    return tqdm(total=total, unit=unit, desc=description, disable=None if show is None else not show, file=sys.stderr)


def _stderr_is_a_terminal() -> bool:
    return sys.stderr.isatty()


class _ListingProgress:
    """
    A progress line on standard error while a store is listed, then how many objects the listing found.

    The listing is one LIST, paginated inside the backend, so while it runs the line shows the time it has taken;
    the count comes when it ends. On a terminal the line appears once the listing has run `PROGRESS_DELAY` seconds
    (short listings show nothing) and is rewritten in place; forced (``--progress``), it shows from the start, as
    plain lines where standard error is not a terminal. Never on standard output, which scripts parse.
    """

    def __init__(self, label: str, show: bool | None) -> None:
        self._label = label
        self._terminal = _stderr_is_a_terminal()
        self._forced = show is True
        self._enabled = self._terminal if show is None else show
        self._started = time.monotonic()
        self._written = False  # anything at all
        self._open = False  # a line on the terminal, not ended yet
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> "_ListingProgress":
        if not self._enabled:
            return self
        if self._forced:
            self._write(f"listing {self._label} ...", end=not self._terminal)
        if self._terminal:
            self._ticker = threading.Thread(target=self._tick, name="offload-haystack-progress", daemon=True)
            self._ticker.start()
        return self

    def _tick(self) -> None:
        if self._stop.wait(0 if self._forced else PROGRESS_DELAY):
            return
        while True:
            with self._lock:
                if self._stop.is_set():
                    return
                self._write(f"listing {self._label} ... {time.monotonic() - self._started:.0f}s", end=False)
            if self._stop.wait(PROGRESS_INTERVAL):
                return

    def _write(self, text: str, *, end: bool) -> None:
        # On a terminal, back to the start of the line and clear it: each update replaces the one before.
        sys.stderr.write(f"\r\x1b[K{text}" if self._terminal else text)
        if end:
            sys.stderr.write("\n")
        sys.stderr.flush()
        self._written = True
        self._open = self._terminal and not end

    def _halt(self) -> None:
        with self._lock:
            self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None

    def found(self, count: int) -> None:
        """
        End the line with how many objects the listing found (when a line was shown: a long listing, or forced).

        :param count: The objects listed.
        """
        self._halt()
        if self._written:
            seconds = time.monotonic() - self._started
            self._write(f"listed {count:,} object(s) of {self._label} in {seconds:.1f}s", end=True)

    def __exit__(self, *failure: object) -> None:
        self._halt()
        if self._open:  # the listing failed: clear the line, so the error starts on a clean one
            self._write("", end=False)


def _size(count: int) -> str:
    """A byte count in powers of 1024, labelled as such (KiB, MiB, GiB): a "KB" of 1024 bytes misleads."""
    size = float(count)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # the largest unit: a tebibyte shows as 1024.0 GiB


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def print_table(rows: list[list[str]], header: list[str], *, text_columns: int = 1) -> None:
    """
    Print `rows` under `header`, each column as wide as its widest cell.

    :param rows: The cells, as strings.
    :param header: The column titles.
    :param text_columns: How many leading columns hold text (left-aligned); the rest are figures (right-aligned).
    """
    widths = [max(len(str(row[column])) for row in [header, *rows]) for column in range(len(header))]

    def line(cells: list[str]) -> str:
        aligned = (
            f"{cell:<{widths[i]}}" if i < text_columns else f"{cell:>{widths[i]}}" for i, cell in enumerate(cells)
        )
        return "  ".join(aligned).rstrip()

    print(line(header))
    print("-" * len(line(["-" * width for width in widths])))
    for row in rows:
        print(line(row))


# Operator commands


def _scan(arguments: argparse.Namespace, root: Any, tenant: str | None, session: str | None = None) -> list[Any]:
    """`operations.scan` with a progress line on standard error (see `_ListingProgress`)."""
    from haystack_integrations.offload.operations import scan

    with _ListingProgress(_scoped_url(arguments.url, tenant, session), _show_progress(arguments)) as progress:
        objects = scan(root, tenant=tenant, session=session)
        progress.found(len(objects))
    return objects


def _scoped_url(url: str, tenant: str | None, session: str | None) -> str:
    """The store URL down to the tenant and session a listing is limited to, as its progress line and `ls` show it."""
    scope = "/".join(part for part in (tenant, session) if part)
    return f"{shown_url(url).rstrip('/')}/{scope + '/' if scope else ''}"


def _ls(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.operations import usage
    from haystack_integrations.offload.operations.inventory import roots_below

    objects = _scan(arguments, _root(arguments), arguments.tenant, arguments.session)
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
                    f"{session_indent}{session_name}/  {session.results} results ({_size(session.result_bytes)}), "
                    f"{session.documents} documents ({_size(session.document_bytes)})"
                )
            if not listing:
                continue
            for item in objects:
                if item.tenant == tenant_name and item.session == session_name and item.kind != "other":
                    detail = f"  {item.tool_name or '-'}  {item.created:%Y-%m-%d %H:%M:%S}" if item.created else ""
                    # The whole path, as `cat` takes it.
                    print(f"{object_indent}{item.path}  {_size(item.size)}{detail}")
    if found.other_objects:
        print(f"  (and {found.other_objects} object(s), {_size(found.other_bytes)}, not written by this library)")
        roots = roots_below(objects)
        if roots:  # a bucket or prefix above the roots: their objects are the library's, one level too high up
            listed = ", ".join(_scoped_url(arguments.url, None, None) + root for root in roots)
            print(f"  Some of these lie in what look like roots below this URL; list one of them: {listed}")
    return 0


def _contents(figures: Any) -> str:
    """Results and documents, each with its bytes, then the total: documents are not results."""
    return (
        f"{figures.results} result(s) ({_size(figures.result_bytes)}), {figures.documents} document(s) "
        f"({_size(figures.document_bytes)}), {_size(figures.total_bytes)} in all"
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


def _du(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.operations import usage

    found = usage(_scan(arguments, _root(arguments), arguments.tenant))
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
    from haystack_integrations.offload.errors import ResultNotFoundError

    root = _root(arguments)
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

    parts = path.split("/")
    if len(parts) == 4 and parts[2].startswith("."):
        # Through the session's documents API, which validates the ids, the namespace and the name.
        tenant, session, directory, name = parts
        document = root.for_session(tenant, session).documents(directory[1:]).get(name)
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


def _purge(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.operations import delete, parse_age, select_older_than, select_scope

    if arguments.session and not arguments.tenant:
        raise CommandError("--session needs --tenant.")
    if not arguments.tenant and arguments.older_than is None:
        raise CommandError("Say what to purge: --tenant T [--session S], and/or --older-than AGE (e.g. 30d).")
    now = datetime.now(UTC)
    age = None
    if arguments.older_than is not None:
        try:  # before the store is touched; ages past MAX_AGE (100 years) are refused, as the store refuses them
            age = parse_age(arguments.older_than)
        except ValueError as error:
            raise CommandError(str(error)) from error
    root = _root(arguments)
    objects = _scan(arguments, root, arguments.tenant, arguments.session)
    if age is not None:
        plan = select_older_than(objects, age, now=now, root=root)
        what = f"results older than {arguments.older_than}, and documents of sessions inactive that long"
    else:
        plan = select_scope(objects, now=now)
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
    # Every purge also takes the temporary files of local writes whose writer died, as the store's own purge does.
    stale = f"{plan.temporary_files} stale temporary file(s)" if plan.temporary_files else ""
    if not arguments.json:
        print(
            f"purge {scope}: {what}: {plan.results} result(s) and {plan.documents} document(s)"
            f"{', and ' + stale if stale else ''}, "
            f"{_size(plan.bytes)}, in {len(plan.sessions())} session(s)"
        )
    if arguments.dry_run:
        # What would go, one line each, as `aws s3 rm --dryrun` lists it: paths as `cat` and `ls -R` show them.
        if arguments.json:
            summary["objects"] = [{"path": item.path, "kind": item.kind, "size": item.size} for item in plan.objects]
        else:
            for item in plan.objects:
                print(f"(dry run) delete: {item.path}  {_size(item.size)}")
    if plan.objects and not arguments.dry_run:
        if not arguments.yes and not _confirmed(f"Delete {len(plan.objects)} object(s)?"):
            raise CommandError("Nothing deleted: confirm with --yes (or preview with --dry-run).")
        with progress_bar(len(plan.objects), "obj", _show_progress(arguments), "deleting") as bar:
            summary["deleted"] = delete(root, plan.objects, on_batch=bar.update)
    if arguments.json:
        print_json(summary)
    elif arguments.dry_run:
        print("dry run: nothing was deleted")
    elif plan.objects:
        print(f"deleted {summary['deleted']} object(s)" + (f" ({stale} among them)" if stale else ""))
    return 0


def _doctor(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.operations.conformance import CHECK_NAMES, CheckResult, run_conformance

    if arguments.url and arguments.store and arguments.url != arguments.store:
        raise CommandError(
            f"Give the store once: {shown_url(arguments.url)!r} and --store {shown_url(arguments.store)!r} differ."
        )
    arguments.url = arguments.store or arguments.url
    if not arguments.url:
        raise CommandError("Say which store to check: offload-haystack doctor --store URL.")
    root = _root(arguments)
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


def _audit(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.approvals import read_audit, repair_audit

    tenant, session = _audited_session(arguments)
    store = _root(arguments).for_session(tenant, session)
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


# Parser


def add_s3_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("S3", "for s3:// stores; each defaults to the environment, as in the AWS CLI")
    group.add_argument(
        "--endpoint-url",
        help="S3 endpoint, e.g. http://127.0.0.1:5000 (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL)",
    )
    group.add_argument("--profile", help="profile of ~/.aws/config and ~/.aws/credentials (default: $AWS_PROFILE)")
    group.add_argument("--region", help="region of the bucket (default: $AWS_REGION, $AWS_DEFAULT_REGION)")


def _store_arguments(parser: argparse.ArgumentParser, *, url_flag: bool = False) -> None:
    where = "store URL: a directory, file://..., memory://... or s3://bucket/prefix"
    if url_flag:  # `doctor --store URL`, as `demo` and `serve` take it; the URL alone works too
        parser.add_argument("url", nargs="?", help=f"{where} (or --store)")
        parser.add_argument("--store", help=where)
    else:
        parser.add_argument("url", help=where)
    parser.add_argument("--storage-options", help='fsspec options as JSON, e.g. {"endpoint_url": "http://..."}')
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of text")
    add_s3_arguments(parser)
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="S3 client for s3:// stores: auto (the default: obstore where it serves the options), fsspec or obstore",
    )
    parser.add_argument(
        "--sse-c-master-key-env",
        metavar="VARIABLE",
        help="the environment variable holding the SSE-C master secret of a store with keys per tenant (the server's "
        "OFFLOAD_SERVER_S3_SSE_C_MASTER_KEY): each tenant's objects are read with its key",
    )


def _operator(commands: Any, name: str, handler: Handler, **texts: str) -> argparse.ArgumentParser:
    """An operator command over a store URL: its store arguments come first, then the ones the caller adds."""
    texts.setdefault("description", texts["help"][:1].upper() + texts["help"][1:] + ".")  # its own --help says it too
    parser: argparse.ArgumentParser = commands.add_parser(name, **texts)
    _store_arguments(parser)
    parser.set_defaults(handler=handler)
    return parser


def _progress_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show progress on standard error even when it is not a terminal (--no-progress: never); "
        "by default, only on a terminal and not with --json",
    )


def build_parser() -> argparse.ArgumentParser:
    """
    Build the argument parser for the ``offload-haystack`` command.

    :returns: The parser (its errors are one line on standard error and exit 2).
    """
    parser = _Parser(prog="offload-haystack", description="Look after offload-haystack stores, on any store URL.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")

    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda entry: entry.name):
        try:
            add_command = entry.load()
        except ImportError as error:  # a broken install of another distribution must not take the operator commands
            print(f"offload-haystack: warning: command {entry.name!r} did not load: {error}", file=sys.stderr)
            continue
        add_command(commands)
    _add_operator_commands(commands)
    return parser


def _add_operator_commands(commands: Any) -> None:
    """The commands over a store URL, in the order ``--help`` lists them."""
    ls = _operator(
        commands,
        "ls",
        _ls,
        help="the tenant/session tree with sizes",
        description="List a store's tenants, sessions, results and documents. A URL inside the layout, such as "
        "s3://bucket/prod/acme or s3://bucket/prod/acme/chat-1, is listed as that tenant or session of the root above "
        "it (and says so in its first line) when, read as a root, it holds nothing this library wrote but its objects "
        "fit a tenant's or a session's layout; a root with results of its own is always listed as a root. With "
        "--tenant or --session the URL is always the root.",
    )
    ls.add_argument("--tenant", help="list this tenant's sessions")
    ls.add_argument("--session", help="list this session's results and documents (needs --tenant)")
    ls.add_argument("-R", "--recursive", action="store_true", help="list every result and document")
    _progress_argument(ls)

    du = _operator(commands, "du", _du, help="usage per tenant and session")
    du.add_argument("--tenant", help="only this tenant")
    _progress_argument(du)

    cat = _operator(commands, "cat", _cat, help="print one stored result or document (bytes as stored)")
    cat.add_argument("reference", help="tenant/session/name as `ls` prints it, or a name with --tenant and --session")
    cat.add_argument("--tenant", help="the tenant, when the reference is a name alone (with --session)")
    cat.add_argument("--session", help="the session, when the reference is a name alone (with --tenant)")
    cat.add_argument("--offset", type=whole_number(0, 2**63 - 1), default=0, help="first byte (default: 0)")
    cat.add_argument("--length", type=whole_number(0, 2**63 - 1), help="bytes to print (default: to the end)")
    cat.add_argument("-o", "--output", help="write the bytes to this file instead of standard output")

    purge = _operator(commands, "purge", _purge, help="delete a session, a tenant, or results older than an age")
    purge.add_argument("--tenant", help="purge this tenant (every session, results and documents)")
    purge.add_argument("--session", help="purge only this session of --tenant")
    purge.add_argument(
        "--older-than",
        help="purge results older than this age (e.g. 90m, 12h, 30d, 2w), and documents of sessions inactive as long",
    )
    purge.add_argument("--dry-run", action="store_true", help="show what would be deleted, delete nothing")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _progress_argument(purge)

    audit = _operator(commands, "audit", _audit, help="a session's approval audit record")
    audit.add_argument(
        "session_path", nargs="?", metavar="tenant/session", help="the session, as `ls` prints it (or the flags)"
    )
    audit.add_argument("--tenant", help="the session's tenant (with --session, instead of tenant/session)")
    audit.add_argument("--session", help="the session whose audit record to print (with --tenant)")
    audit.add_argument(
        "--repair",
        action="store_true",
        help="first append the events a failed append lost (executed, denied, expired, ...), from the records",
    )

    doctor = commands.add_parser(
        "doctor",
        help="check that an object store keeps the promises this library relies on",
        description="Check, below one fresh prefix of the store (removed after), that a second exclusive create is "
        "refused, ranged reads carry the size, delimited listings page completely, batch deletes take missing keys, "
        "multipart writes read back, a conditional multipart completion is refused, and, given credentials or keys per "
        "tenant, that the store refuses one tenant's objects to another's credentials and an SSE-C object to a read "
        "without its key. Exit status: 0 every check "
        "passed, warned or was skipped; 1 a check failed (a store that does not refuse a second exclusive create, "
        "which approvals and serve refuse, a missing bucket or refused credentials: each check names why); 2 the "
        "doctor could not run (a bad argument, no store URL, a local directory that does not exist); 3 no check "
        "failed but one could not tell (a transient error): run it again.",
    )
    _store_arguments(doctor, url_flag=True)
    isolation = doctor.add_argument_group(
        "tenant isolation", "the tenant-isolation check's credentials per tenant (keys: --sse-c-master-key-env)"
    )
    isolation.add_argument("--tenant-role-arn", help="the role assumed per tenant (AssumeRoleCredentials)")
    isolation.add_argument("--sts-endpoint-url", help="its STS endpoint (default: the S3 endpoint, else AWS's)")
    doctor.set_defaults(handler=_doctor)


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run the ``offload-haystack`` command.

    Every failure is one line on standard error; set ``OFFLOAD_HAYSTACK_TRACEBACK=1`` to get the traceback of an
    unexpected one instead (for a bug report).

    :param argv: Arguments (default: ``sys.argv[1:]``).
    :returns: The process exit code: 0, 1 when demo checks failed, 2 on errors (bad arguments included), 130 when
        interrupted.
    """
    try:
        parser = build_parser()
        arguments, extra = parser.parse_known_args(argv)
        if getattr(arguments, "session_path", "") is None and len(extra) == 1 and not extra[0].startswith("-"):
            # `audit URL --storage-options ... acme/chat-1`: argparse fills an optional positional with nothing at the
            # first run of positionals (the URL alone), so one after the options comes back unclaimed: it is that one.
            arguments.session_path = extra.pop()
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as stop:  # --help, --version, or a bad argument (already reported in one line)
        return stop.code if isinstance(stop.code, int) else EXIT_ERROR if stop.code else 0
    handler: Handler = arguments.handler
    try:
        return int(handler(arguments))
    except BrokenPipeError:
        # The reader went away (`offload-haystack ls ... | head`): stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        _error("interrupted")
        return EXIT_INTERRUPTED
    except CommandError as error:
        _error(str(error))
    except StorageError as error:
        from haystack_integrations.offload.stores.failures import no_answer_cause

        cause = no_answer_cause(error)
        # A store that gave no answer at all (a timeout, a refused connection) says so first: it is the endpoint, the
        # network or a firewall, not the data or the credentials.
        said = f"The store did not answer ({cause}): " if cause is not None else ""
        _error(f"{said}{error}{_cause(error)}{stored_at(error)}")
    except StoragePermissionError as error:
        _error(
            f"{error}{stored_at(error)} Check the credentials (--profile, --storage-options key/secret, or the AWS_* "
            "environment variables) and the bucket policy."
        )
    except (ValueError, OSError, ImportError) as error:
        _error(f"{error}{_cause(error)}{stored_at(error)}")
    except Exception as error:
        # Whatever else a backend raises (botocore's own errors, an option s3fs does not take): still one line.
        if os.environ.get("OFFLOAD_HAYSTACK_TRACEBACK"):
            raise
        _error(f"{type(error).__name__}: {error}{_cause(error)}")
    return EXIT_ERROR


def _error(message: str) -> None:
    print(f"offload-haystack: error: {_one_line(message)}", file=sys.stderr)


def stored_at(error: BaseException) -> str:
    """
    Which store a storage error came from, as a sentence to append: `` Store: s3://bucket at http://host:9000.``

    :param error: Any error; only a storage error that names its store (its ``location``) gives a sentence.
    :returns: The sentence, or ``""``.
    """
    location = getattr(error, "location", "")
    return f" Store: {location}." if isinstance(location, str) and location else ""


def _cause(error: BaseException) -> str:
    cause = error.__cause__
    if cause is None or str(cause) in str(error):
        return ""
    text = str(cause).splitlines()[0][:200] if str(cause) else type(cause).__name__
    return f" ({type(cause).__name__}: {text})"


def run() -> NoReturn:
    """The ``offload-haystack`` console entry point: `main`, then its exit code, atexit's cleanups run first."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    # Leave before the interpreter tears itself down: obstore's Rust threads were seen aborting the process there
    # (SIGABRT after serve's one-line refusal, Python 3.13, once in four CI runs), which lost the exit code.
    os._exit(code)


if __name__ == "__main__":
    run()
