"""The public surface of `haystack_integrations.offload`: pinned, importable, lazily loaded and typed."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import haystack_integrations.offload as offload

PUBLIC_NAMES = [
    "APPROVAL_CHANNEL_KEY",
    "APPROVAL_REQUIRED",
    "ApprovalAlreadyDecidedError",
    "ApprovalClaimedError",
    "ApprovalExpiredError",
    "ApprovalHook",
    "ApprovalNotFoundError",
    "ApprovalPendingError",
    "ApprovalRecordError",
    "ApprovalRequest",
    "AskOncePerSession",
    "AskWhen",
    "CallbackApprovals",
    "CreateOutcomeUnknownError",
    "Decision",
    "DocumentExistsError",
    "DurableApprovals",
    "ExclusiveCreatesUnsupportedError",
    "FsspecToolResultStore",
    "InvalidApprovalEditError",
    "InvalidReferenceError",
    "InvalidScopeIdError",
    "ListToolResults",
    "OffloadCompactionHook",
    "OffloadError",
    "OffloadHook",
    "Quota",
    "QuotaExceededError",
    "ReadBackToolError",
    "ReadToolResult",
    "ResultExpiredError",
    "ResultNotFoundError",
    "ResumeConversationError",
    "ResumeInterruptedError",
    "Retention",
    "RetryPolicy",
    "StorageError",
    "StoragePermissionError",
    "StorageUnavailableError",
    "decide",
    "decide_async",
    "end_session",
    "end_session_async",
    "list_tool_results",
    "offload_context",
    "pending_approvals",
    "pending_approvals_async",
    "read_audit",
    "read_audit_async",
    "read_tool_result",
    "resume",
    "resume_async",
]


def test_all_is_pinned() -> None:
    # A name added or removed here is a change to the public API: make it on purpose, with docs.
    assert offload.__all__ == PUBLIC_NAMES


# Each subpackage's own surface, pinned as the top level's is. 132 distinct names with the top level's: 88 before this
# round's audit repair and the reference app built on public names only (issue 45: the CLI toolkit, meta keys, progress
# hooks, the settings checks, the serving helpers).
SUBPACKAGE_NAMES = {
    "approvals": [
        "APPROVAL_CHANNEL_KEY",
        "APPROVAL_DENIED",
        "APPROVAL_EXPIRED",
        "APPROVAL_INVALID",
        "APPROVAL_REQUIRED",
        "APPROVAL_REQUIRED_META_KEY",
        "ApprovalAlreadyDecidedError",
        "ApprovalCallback",
        "ApprovalClaimedError",
        "ApprovalDecision",
        "ApprovalExpiredError",
        "ApprovalNotFoundError",
        "ApprovalPendingError",
        "ApprovalRecordError",
        "ApprovalRequest",
        "AskOncePerSession",
        "AskWhen",
        "AuditEvent",
        "CallOutcome",
        "CallbackApprovals",
        "DEFAULT_RESUME_LEASE",
        "Decision",
        "DurableApprovals",
        "InvalidApprovalEditError",
        "META_KEY",
        "ResumeConversationError",
        "ResumeInterruptedError",
        "decide",
        "decide_async",
        "pending_approvals",
        "pending_approvals_async",
        "read_audit",
        "read_audit_async",
        "repair_audit",
        "repair_audit_async",
        "resume",
        "resume_async",
    ],
    # The command line's toolkit, for distributions that add commands (the reference app's `demo` and `serve`).
    "cli": [
        "CommandError",
        "EXIT_FAILED_CHECKS",
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
    ],
    "hooks": ["COMPACTION_META_KEY", "OFFLOADED_META_KEY", "OffloadCompactionHook", "OffloadHook"],
    # A module, not a package: what an application calls of it (issue 45, the reference app's `--metrics-tenants`).
    "metrics": ["label_tenants"],
    "operations": [
        "PurgePlan",
        "Usage",
        "delete",
        "parse_age",
        "read_inside_layout",
        "read_object",
        "scan",
        "select_older_than",
        "select_scope",
        "summarize_root",
        "summarize_tenant",
        "usage",
    ],
    "sessions": [
        "ApprovalAlreadyDecidedError",
        "ApprovalExpiredError",
        "ApprovalPendingConflict",
        "ChatService",
        "ConversationCache",
        "DEFAULT_PAGE_BYTES",
        "DecisionOutcome",
        "InvalidApprovalEditError",
        "InvalidMessageError",
        "MAX_PAGE_BYTES",
        "NotFoundError",
        "NothingToResumeError",
        "OffloadProgressHook",
        "ResultPage",
        "RunFailedError",
        "SessionBusyError",
        "SessionHistory",
        "SessionSummary",
        "ToolCallProgressHook",
        "ToolResultProgressHook",
        "Transcript",
        "TurnAbandonedError",
        "TurnOutcome",
        "TurnProgress",
        # Serving a stored result (issue 45: the reference app's views).
        "media_type_of",
        "record_named",
    ],
    "stores": [
        "AssumeRoleCredentials",
        "DEFAULT_S3_MAX_POOL_CONNECTIONS",
        "DirectorySasCredentials",
        "DownscopedCredentials",
        "ExclusiveCreateCheck",
        "FsspecToolResultStore",
        "MIN_MASTER_SECRET_CHARACTERS",
        "MarkedUsage",
        "PendingWrite",
        "Quota",
        "Retention",
        "RetryPolicy",
        "RetryStats",
        "ScopeChildren",
        "SessionDocuments",
        "StoredResult",
        "TenantKeys",
        "check_region",
        "end_session",
        "end_session_async",
        "redacted_url",
        "validate_scope_id",
        "with_s3_choices",
        "with_timeouts",
    ],
    "tools": [
        "ListToolResults",
        "ReadBackTool",
        "ReadBackToolError",
        "ReadToolResult",
        "list_tool_results",
        "read_tool_result",
    ],
}


@pytest.mark.parametrize("package", sorted(SUBPACKAGE_NAMES))
def test_each_subpackage_surface_is_pinned(package: str) -> None:
    module = importlib.import_module(f"{offload.__name__}.{package}")
    assert sorted(module.__all__) == SUBPACKAGE_NAMES[package]
    for name in module.__all__:
        assert getattr(module, name) is not None, name


def test_every_public_name_resolves() -> None:
    for name in PUBLIC_NAMES:
        assert getattr(offload, name) is not None, name


def test_type_checkers_see_the_same_names() -> None:
    # The TYPE_CHECKING block is what mypy and IDEs read; it must list exactly the lazily exported names.
    tree = ast.parse(Path(offload.__file__).read_text())
    typed = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 1
        for alias in node.names
    }
    assert typed == set(PUBLIC_NAMES)


def test_importing_the_package_does_not_import_backends_or_the_server() -> None:
    code = (
        "import sys, haystack_integrations.offload as o\n"
        "o.FsspecToolResultStore\n"
        "print(sorted(m for m in ('s3fs', 'moto', 'fastapi', 'uvicorn') if m in sys.modules))\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert completed.stdout.strip() == "[]"


def test_the_package_ships_type_information() -> None:
    assert (Path(offload.__file__).parent / "py.typed").is_file()
