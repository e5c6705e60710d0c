"""
The ``offload-haystack`` command line: the operator commands ``ls``, ``cat``, ``du``, ``purge``, ``audit`` and
``doctor`` over any store URL, and the commands other distributions add (the reference app's ``demo`` and ``serve``).

The logic lives in `operations`; the commands (`operator_commands`) parse and print. A distribution adds a command
through the ``offload_haystack.commands`` entry point group: each entry names a function that takes the subcommand
parsers and adds one (with ``set_defaults(handler=...)``), using the helpers exported here (`toolkit`).
"""

import argparse
import atexit
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any, NoReturn

from haystack_integrations.offload.cli.operator_commands import (
    audit_command,
    cat_command,
    doctor_command,
    du_command,
    ls_command,
    purge_command,
)
from haystack_integrations.offload.cli.toolkit import (
    COMMANDS_GROUP,
    EXIT_ERROR,
    EXIT_FAILED_CHECKS,
    EXIT_INTERRUPTED,
    CommandError,
    CommandParser,
    Handler,
    add_progress_argument,
    add_s3_arguments,
    add_store_arguments,
    applied_s3_choices,
    cause_of,
    operator_command,
    parse_storage_options,
    print_error,
    print_json,
    print_table,
    progress_bar,
    s3_choices,
    shown_url,
    storage_options_from,
    stored_at,
    version,
    whole_number,
)
from haystack_integrations.offload.errors import StorageError, StoragePermissionError

__all__ = [
    "EXIT_FAILED_CHECKS",
    "CommandError",
    "add_s3_arguments",
    "applied_s3_choices",
    "build_parser",
    "main",
    "parse_storage_options",
    "print_json",
    "print_table",
    "progress_bar",
    "run",
    "s3_choices",
    "shown_url",
    "storage_options_from",
    "stored_at",
    "whole_number",
]


def build_parser() -> argparse.ArgumentParser:
    """
    Build the argument parser for the ``offload-haystack`` command.

    :returns: The parser (its errors are one line on standard error and exit 2).
    """
    parser = CommandParser(prog="offload-haystack", description="Look after offload-haystack stores, on any store URL.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
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
    ls = operator_command(
        commands,
        "ls",
        ls_command,
        help="the tenant/session tree with sizes",
        description="List a store's tenants, sessions, results and documents. A URL inside the layout, such as "
        "s3://bucket/prod/acme or s3://bucket/prod/acme/chat-1, is listed as that tenant or session of the root above "
        "it (and says so in its first line) when, read as a root, it holds nothing this library wrote but its objects "
        "fit a tenant's or a session's layout; a root with results of its own is always listed as a root. With "
        "--tenant or --session the URL is always the root.",
    )
    ls.add_argument(
        "--tenant",
        help="list this tenant's sessions (by name, with its usage mark's totals, where quota'd writers keep one)",
    )
    ls.add_argument("--session", help="list this session's results and documents (needs --tenant)")
    ls.add_argument("-R", "--recursive", action="store_true", help="list every result and document")
    ls.add_argument(
        "--exact",
        action="store_true",
        help="list every object and count each session, even where tenants' usage marks serve",
    )
    add_progress_argument(ls)

    du = operator_command(commands, "du", du_command, help="usage per tenant and session")
    du.add_argument(
        "--tenant", help="only this tenant: its usage mark's totals where quota'd writers keep one (two requests)"
    )
    du.add_argument("--exact", action="store_true", help="with --tenant: list every object, per session")
    add_progress_argument(du)

    cat = operator_command(
        commands,
        "cat",
        cat_command,
        help="print one stored result (bytes as stored) or document (decompressed where it is stored gzipped)",
    )
    cat.add_argument("reference", help="tenant/session/name as `ls` prints it, or a name with --tenant and --session")
    cat.add_argument("--tenant", help="the tenant, when the reference is a name alone (with --session)")
    cat.add_argument("--session", help="the session, when the reference is a name alone (with --tenant)")
    cat.add_argument("--offset", type=whole_number(0, 2**63 - 1), default=0, help="first byte (default: 0)")
    cat.add_argument("--length", type=whole_number(0, 2**63 - 1), help="bytes to print (default: to the end)")
    cat.add_argument("-o", "--output", help="write the bytes to this file instead of standard output")

    purge = operator_command(
        commands, "purge", purge_command, help="delete a session, a tenant, or results older than an age"
    )
    purge.add_argument("--tenant", help="purge this tenant (every session, results and documents)")
    purge.add_argument("--session", help="purge only this session of --tenant")
    purge.add_argument(
        "--older-than",
        help="purge results older than this age (e.g. 90m, 12h, 30d, 2w), and documents of sessions inactive as long",
    )
    purge.add_argument("--dry-run", action="store_true", help="show what would be deleted, delete nothing")
    purge.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_progress_argument(purge)

    audit = operator_command(commands, "audit", audit_command, help="a session's approval audit record")
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
        "refused, ranged reads carry the size, delimited listings page completely, batch deletes take missing keys, a "
        "large write reads back as the store's client sends it (S3 multipart, Azure staged blocks, GCS resumable "
        "upload) and its conditional form is refused, and, given credentials or keys per tenant, that the store "
        "refuses one tenant's objects to another's credentials (S3: --tenant-role-arn; GCS: --downscoped-credentials; "
        "Azure: --directory-sas, on an account with a hierarchical namespace) "
        "and an object written with a tenant's key to a read without it or with another tenant's (S3's SSE-C, GCS's "
        "and Azure's customer keys: --sse-c-master-key-env). A check that has no meaning on a store, or per-tenant "
        "isolation not configured, is skipped with what the store lacks. Exit status: 0 every check "
        "passed, warned or was skipped; 1 a check failed (a store that does not refuse a second exclusive create, "
        "which approvals and serve refuse, a missing bucket or refused credentials: each check names why); 2 the "
        "doctor could not run (a bad argument, no store URL, a local directory that does not exist); 3 no check "
        "failed but one could not tell (a transient error): run it again.",
    )
    add_store_arguments(doctor, url_flag=True)
    isolation = doctor.add_argument_group(
        "tenant isolation",
        "the tenant-isolation check's credentials per tenant, one kind at a time (keys: --sse-c-master-key-env)",
    )
    isolation.add_argument("--tenant-role-arn", help="s3://: the role assumed per tenant (AssumeRoleCredentials)")
    isolation.add_argument(
        "--downscoped-credentials",
        action="store_true",
        help="gs://: a token per tenant, the store's credentials downscoped to the tenant's prefix at Google's STS "
        "(DownscopedCredentials)",
    )
    isolation.add_argument(
        "--directory-sas",
        action="store_true",
        help="az://, abfs://, abfss://: a directory SAS (sr=d) per tenant on its own directory, signed with the "
        "account key or a user delegation key (DirectorySasCredentials); needs an account with a hierarchical "
        "namespace",
    )
    isolation.add_argument(
        "--sts-endpoint-url",
        help="the STS endpoint of either (default: the S3 endpoint, else AWS's; for gs://, Google's)",
    )
    doctor.set_defaults(handler=doctor_command)


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
        print_error("interrupted")
        return EXIT_INTERRUPTED
    except CommandError as error:
        print_error(str(error))
    except StorageError as error:
        from haystack_integrations.offload.stores.failures import no_answer_cause

        cause = no_answer_cause(error)
        # A store that gave no answer at all (a timeout, a refused connection) says so first: it is the endpoint, the
        # network or a firewall, not the data or the credentials.
        said = f"The store did not answer ({cause}): " if cause is not None else ""
        print_error(f"{said}{error}{cause_of(error)}{stored_at(error)}")
    except StoragePermissionError as error:
        print_error(
            f"{error}{stored_at(error)} Check the credentials (--profile, --storage-options key/secret, or the AWS_* "
            "environment variables) and the bucket policy."
        )
    except (ValueError, OSError, ImportError) as error:
        print_error(f"{error}{cause_of(error)}{stored_at(error)}")
    except Exception as error:
        # Whatever else a backend raises (botocore's own errors, an option s3fs does not take): still one line.
        if os.environ.get("OFFLOAD_HAYSTACK_TRACEBACK"):
            raise
        print_error(f"{type(error).__name__}: {error}{cause_of(error)}")
    return EXIT_ERROR


def run() -> NoReturn:
    """The ``offload-haystack`` console entry point: `main`, then its exit code, atexit's cleanups run first."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    # Leave before the interpreter tears itself down: obstore's Rust threads were seen aborting the process there
    # (SIGABRT after serve's one-line refusal, Python 3.13, once in four CI runs), which lost the exit code.
    os._exit(code)
