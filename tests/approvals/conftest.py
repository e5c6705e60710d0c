"""Fixtures for the approval tests: a per-test ledger that counts `send_invoice` executions, in any process."""

from pathlib import Path

import pytest
from approval_scenario import LEDGER_ENV


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file this test's `send_invoice` executions append to (also named in the environment for workers)."""
    path = tmp_path / "invoices.log"
    monkeypatch.setenv(LEDGER_ENV, str(path))
    return path
