"""The public surface of `haystack_integrations.offload`: pinned, importable, lazily loaded and typed."""

import ast
import subprocess
import sys
from pathlib import Path

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
    "PendingWrite",
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
    "SessionDocuments",
    "StorageError",
    "StoragePermissionError",
    "StorageUnavailableError",
    "StoredResult",
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
