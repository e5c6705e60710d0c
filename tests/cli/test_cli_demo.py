"""The README's main-job command: ``offload-haystack demo`` on the embedded default, a local directory and S3."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.local_s3 import LocalS3Server


def test_demo_on_the_embedded_default_as_a_real_process(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "haystack_integrations.offload.cli", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert "All checks passed" in completed.stdout
    assert "scripted model" in completed.stdout
    for tenant in ("acme", "globex", "initech"):
        assert f"offload-demo-results/{tenant}/" in completed.stdout
    # The results really are on disk, where the demo said, one directory per tenant and session.
    store = FsspecToolResultStore(str(tmp_path / "offload-demo-results"))
    tree = {record.reference.rsplit("/", 1)[0] for record in store.list()}
    assert len(tree) == 12
    assert {path.split("/")[0] for path in tree} == {"acme", "globex", "initech"}


def test_demo_reports_per_tenant_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--store", str(tmp_path / "r"), "--tenants", "a,b", "--sessions", "2"]) == 0
    output = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in output.splitlines() if line.startswith(("a ", "b "))}
    assert set(rows) == {"a", "b"}
    for row in rows.values():
        sessions, offloaded, stored, saved, checks = row[1:]
        assert (int(sessions), int(offloaded)) == (2, 4)
        assert int(stored.replace(",", "")) > 100_000
        assert int(saved.replace(",", "")) > 100_000
        assert int(checks) > 4


@pytest.mark.s3
def test_demo_against_s3(s3_server: LocalS3Server, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"{s3_server.bucket_url}/demo"
    options = json.dumps(s3_server.storage_options())
    assert main(["demo", "--store", url, "--storage-options", options, "--sessions", "2"]) == 0
    assert "All checks passed" in capsys.readouterr().out
    assert len(FsspecToolResultStore(url, storage_options=s3_server.storage_options()).list()) == 12


def test_demo_with_a_bad_store_url_fails_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--store", "s3://"]) == 2
    assert "has no path" in capsys.readouterr().err
