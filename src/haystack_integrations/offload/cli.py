"""The ``offload-haystack`` command line: ``demo`` today; operator commands build on the same entry point."""

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from haystack_integrations.offload.demo.model import SCRIPTED_MODEL_LABEL

DEFAULT_DEMO_STORE = "./offload-demo-results"


def _demo(arguments: argparse.Namespace) -> int:
    from haystack_integrations.offload.demo.runner import SessionOutcome, run_demo

    options = json.loads(arguments.storage_options) if arguments.storage_options else None
    tenants = tuple(arguments.tenants.split(","))
    total = len(tenants) * arguments.sessions
    done = 0

    def progress(outcome: SessionOutcome) -> None:
        nonlocal done
        done += 1
        print(f"  [{done}/{total}] {outcome.tenant}/{outcome.session}: {outcome.results_offloaded} results offloaded")

    store = arguments.store
    shown = str(Path(store).resolve()) if "://" not in store else store
    print(f"offload-haystack demo: {len(tenants)} tenants x {arguments.sessions} sessions, one shared Agent")
    print(f"  model: {SCRIPTED_MODEL_LABEL}")
    print(f"  store: {shown}")
    report = run_demo(
        store,
        storage_options=options,
        tenants=tenants,
        sessions_per_tenant=arguments.sessions,
        on_session_done=progress,
    )

    print()
    header = f"{'tenant':<12} {'sessions':>8} {'offloaded':>9} {'bytes stored':>12} {'context saved':>13} {'checks':>7}"
    print(header)
    print("-" * len(header))
    for tenant, outcomes in report.by_tenant().items():
        print(
            f"{tenant:<12} {len(outcomes):>8} {sum(o.results_offloaded for o in outcomes):>9} "
            f"{sum(o.bytes_stored for o in outcomes):>12,} {sum(o.context_chars_saved for o in outcomes):>13,} "
            f"{sum(o.checks_passed for o in outcomes):>7}"
        )
    print()
    print("Where each tenant's results went:")
    for tenant, outcomes in report.by_tenant().items():
        print(f"  {shown.rstrip('/')}/{tenant}/  ({', '.join(o.session for o in outcomes)})")
    failures = [f"{o.tenant}/{o.session}: {failure}" for o in report.outcomes for failure in o.failures]
    if failures:
        print("\nFAILED checks:", file=sys.stderr)
        for failure in failures:
            print(f"  {failure}", file=sys.stderr)
        return 1
    print("\nAll checks passed: every result is stored byte for byte in its own session and unreadable from others.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """
    Build the argument parser for the ``offload-haystack`` command.

    :returns: The parser.
    """
    parser = argparse.ArgumentParser(prog="offload-haystack", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="run a scripted multi-tenant demo against an embedded store")
    demo.add_argument("--store", default=DEFAULT_DEMO_STORE, help="store URL or directory (default: %(default)s)")
    demo.add_argument("--storage-options", help="fsspec storage options as JSON, e.g. an S3 endpoint_url")
    demo.add_argument("--tenants", default="acme,globex,initech", help="comma-separated tenant ids")
    demo.add_argument("--sessions", type=int, default=4, help="concurrent sessions per tenant (default: %(default)s)")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """
    Run the ``offload-haystack`` command.

    :param argv: Arguments (default: ``sys.argv[1:]``).
    :returns: The process exit code.
    """
    arguments = build_parser().parse_args(argv)
    try:
        return int(arguments.handler(arguments))
    except (ValueError, OSError) as error:
        print(f"offload-haystack: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
