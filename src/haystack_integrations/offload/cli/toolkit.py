"""
What every ``offload-haystack`` command shares, and what a distribution adding one uses: store and S3 arguments,
storage options, progress, tables and JSON, errors in one line.
"""

import argparse
import importlib.util
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from haystack_integrations.offload.errors import OffloadError

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


class CommandParser(argparse.ArgumentParser):
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


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("offload-haystack")
    except PackageNotFoundError:  # a source tree on sys.path that was never installed
        return "(not installed)"


def shown_url(url: str) -> str:
    """A store URL as the commands print it: a local path made absolute, credentials in a URL hidden."""
    from haystack_integrations.offload.stores.options import redacted_url

    return str(Path(url).resolve()) if "://" not in url else redacted_url(url)


def root_store(arguments: argparse.Namespace) -> Any:
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
    if getattr(arguments, "downscoped_credentials", False):
        if "credentials" in isolation:
            raise CommandError("Give --tenant-role-arn (s3://) or --downscoped-credentials (gs://), not both.")
        from haystack_integrations.offload.stores import DownscopedCredentials

        isolation["credentials"] = DownscopedCredentials(sts_endpoint_url=arguments.sts_endpoint_url)
    if getattr(arguments, "directory_sas", False):
        if "credentials" in isolation:
            raise CommandError(
                "Give one of --tenant-role-arn (s3://), --downscoped-credentials (gs://) and --directory-sas "
                "(az://), not two."
            )
        from haystack_integrations.offload.stores import DirectorySasCredentials

        isolation["credentials"] = DirectorySasCredentials()
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

    :raises CommandError: If the store is not on S3 or Azure, or obstore is not installed.
    """
    if not _is_s3(url) and not ("://" in url and url.split("://", 1)[0].lower() in {"az", "abfs", "abfss"}):
        raise CommandError(
            f"--engine obstore serves s3:// stores only (and Azure's az://), and {shown_url(url)!r} is not one: use "
            "--engine fsspec."
        )
    if importlib.util.find_spec("obstore") is None:
        raise CommandError(
            '--engine obstore needs obstore, which is not installed: install the "s3" extra (pip install ".[s3]" '
            "in a checkout, or a built wheel with [s3]), or use --engine fsspec."
        )


def show_progress(arguments: argparse.Namespace) -> bool | None:
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


class ListingProgress:
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

    def __enter__(self) -> "ListingProgress":
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


def size_text(count: int) -> str:
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


# Parser


def add_s3_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("S3", "for s3:// stores; each defaults to the environment, as in the AWS CLI")
    group.add_argument(
        "--endpoint-url",
        help="S3 endpoint, e.g. http://127.0.0.1:5000 (default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL)",
    )
    group.add_argument("--profile", help="profile of ~/.aws/config and ~/.aws/credentials (default: $AWS_PROFILE)")
    group.add_argument("--region", help="region of the bucket (default: $AWS_REGION, $AWS_DEFAULT_REGION)")


def add_store_arguments(parser: argparse.ArgumentParser, *, url_flag: bool = False) -> None:
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
        help="the environment variable holding the master secret of a store with keys per tenant (the server's "
        "OFFLOAD_SERVER_S3_SSE_C_MASTER_KEY): each tenant's objects are read with its key (S3's SSE-C; on gs:// and "
        "az://, the customer-supplied or customer-provided key derived from the same secret)",
    )


def operator_command(commands: Any, name: str, handler: Handler, **texts: str) -> argparse.ArgumentParser:
    """An operator command over a store URL: its store arguments come first, then the ones the caller adds."""
    texts.setdefault("description", texts["help"][:1].upper() + texts["help"][1:] + ".")  # its own --help says it too
    parser: argparse.ArgumentParser = commands.add_parser(name, **texts)
    add_store_arguments(parser)
    parser.set_defaults(handler=handler)
    return parser


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show progress on standard error even when it is not a terminal (--no-progress: never); "
        "by default, only on a terminal and not with --json",
    )


def print_error(message: str) -> None:
    print(f"offload-haystack: error: {_one_line(message)}", file=sys.stderr)


def stored_at(error: BaseException) -> str:
    """
    Which store a storage error came from, as a sentence to append: `` Store: s3://bucket at http://host:9000.``

    :param error: Any error; only a storage error that names its store (its ``location``) gives a sentence.
    :returns: The sentence, or ``""``.
    """
    location = getattr(error, "location", "")
    return f" Store: {location}." if isinstance(location, str) and location else ""


def cause_of(error: BaseException) -> str:
    cause = error.__cause__
    if cause is None or str(cause) in str(error):
        return ""
    text = str(cause).splitlines()[0][:200] if str(cause) else type(cause).__name__
    return f" ({type(cause).__name__}: {text})"
