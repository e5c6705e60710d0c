"""Every error the library raises is an `OffloadError`, keeps its built-in base, and is drawn in the design's tree."""

import importlib
import inspect
import pickle
import pkgutil
import re
from pathlib import Path

import pytest

import haystack_integrations.offload as package
from haystack_integrations.offload import (
    ApprovalAlreadyDecidedError,
    ApprovalNotFoundError,
    FsspecToolResultStore,
    OffloadError,
    QuotaExceededError,
    ResultNotFoundError,
    StorageUnavailableError,
)

DESIGN = Path(__file__).parent.parent / "docs" / "design.md"

# Each error and the built-in it subclassed before the root existed, which it must keep: an `except OSError` (or
# ValueError, ...) written against it still catches it. A new error gets a line here, and a place in the tree.
BUILT_IN_BASES: dict[str, type[Exception]] = {
    "errors.InvalidScopeIdError": ValueError,
    "errors.InvalidReferenceError": ValueError,
    "errors.StorageError": OSError,
    "errors.StorageUnavailableError": OSError,
    "errors.CreateOutcomeUnknownError": OSError,
    "errors.ExclusiveCreatesUnsupportedError": OSError,
    "errors.QuotaExceededError": OSError,
    "errors.ResultNotFoundError": FileNotFoundError,
    "errors.ResultExpiredError": FileNotFoundError,
    "errors.DocumentExistsError": FileExistsError,
    "errors.StoragePermissionError": PermissionError,
    "approvals.errors.ApprovalNotFoundError": LookupError,
    "approvals.errors.InvalidApprovalEditError": ValueError,
    "approvals.errors.ApprovalExpiredError": ValueError,
    "approvals.errors.ApprovalRecordError": ValueError,
    "approvals.errors.ResumeConversationError": ValueError,
    "approvals.errors.ApprovalPendingError": RuntimeError,
    "approvals.errors.ResumeInterruptedError": RuntimeError,
    "approvals.errors.ApprovalAlreadyDecidedError": FileExistsError,
    "approvals.errors.ApprovalClaimedError": FileExistsError,
    "tools.errors.ReadBackToolError": Exception,
    "sessions.errors.NotFoundError": LookupError,
    "sessions.errors.ApprovalPendingConflict": RuntimeError,
    "sessions.errors.NothingToResumeError": RuntimeError,
    "sessions.errors.RunFailedError": RuntimeError,
    "sessions.errors.InvalidMessageError": ValueError,
    "stores.failures.StorageRequestError": OSError,
    "stores.failures.MissingCredentialsError": PermissionError,
    "stores.failures.EncryptionKeyRefusedError": PermissionError,
    "stores.failures.EncryptionKeyMissingError": PermissionError,
    "cli.toolkit.CommandError": Exception,
    "sessions.errors.SessionBusyError": RuntimeError,
    "sessions.errors.StaleHistoryError": RuntimeError,
    "sessions.errors.TurnAbandonedError": RuntimeError,
    "sessions.errors.HistoryRecordError": ValueError,
}


def _package_errors() -> dict[str, type[BaseException]]:
    prefix = f"{package.__name__}."
    found: dict[str, type[BaseException]] = {}
    for module_info in pkgutil.walk_packages(package.__path__, prefix):
        module = importlib.import_module(module_info.name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__.startswith(package.__name__)
            ):
                found[f"{value.__module__.removeprefix(prefix)}.{value.__qualname__}"] = value
    return found


ERRORS = _package_errors()


def test_every_error_of_the_package_is_found() -> None:
    assert set(ERRORS) == set(BUILT_IN_BASES) | {"errors.OffloadError"}


@pytest.mark.parametrize("name", sorted(BUILT_IN_BASES))
def test_each_error_is_an_offload_error_and_keeps_its_built_in_base(name: str) -> None:
    error = ERRORS[name]
    assert issubclass(error, OffloadError)
    assert issubclass(error, BUILT_IN_BASES[name])


def test_the_root_is_a_plain_exception() -> None:
    assert OffloadError.__bases__ == (Exception,)
    assert OffloadError.__module__ == "haystack_integrations.offload.errors"


def test_specific_built_in_bases_hold() -> None:
    assert issubclass(ERRORS["errors.StorageError"], OSError)
    assert issubclass(ResultNotFoundError, FileNotFoundError)
    assert issubclass(ERRORS["errors.InvalidReferenceError"], ValueError)
    assert issubclass(ERRORS["errors.StoragePermissionError"], PermissionError)
    assert issubclass(ApprovalAlreadyDecidedError, ERRORS["errors.DocumentExistsError"])


def test_except_offload_error_catches_what_the_library_raises() -> None:
    session = FsspecToolResultStore("memory://error-root").for_session("t", "s")
    reference = session.write(key="gone.txt", content="soon gone")
    session.delete(reference)
    with pytest.raises(OffloadError) as caught:
        session.read(reference)
    assert isinstance(caught.value, ResultNotFoundError)
    # The built-in base still catches it, as it did before the root existed.
    with pytest.raises(FileNotFoundError):
        session.read(reference)


@pytest.mark.parametrize(
    "error",
    [
        StorageUnavailableError("gave up", attempts=3, causes=("HTTP 503", "timeout", "HTTP 503")),
        QuotaExceededError("over quota", tenant="acme", session="chat-1", scope="session", limit="bytes", allowed=9),
        ApprovalAlreadyDecidedError("decided", recorded=None, repeated=True),
        ResultNotFoundError("No stored result."),
        ApprovalNotFoundError("No approval request."),
    ],
    ids=lambda error: type(error).__name__,
)
def test_rooted_errors_still_pickle(error: OffloadError) -> None:
    restored = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own error, round-tripped in the test
    assert type(restored) is type(error)
    assert str(restored) == str(error)
    assert vars(restored) == vars(error)


def test_the_tree_in_the_design_names_every_rooted_error() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    section = re.search(r"^### `errors\.py`\n(.*?)^### ", text, re.S | re.M)
    assert section, "docs/design.md has a '### `errors.py`' section"
    drawn = set(re.findall(r"\b([A-Z]\w*(?:Error|Conflict))\b", section.group(1)))
    public = {name.rsplit(".", 1)[1] for name in BUILT_IN_BASES} - {
        "_PortTaken"
    }  # testing's own, never raised to users
    assert public | {"OffloadError"} <= drawn
