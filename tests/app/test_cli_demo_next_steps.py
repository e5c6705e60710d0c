"""The demo's last line says what to try next, with commands that work on the store it filled (issue 43)."""

import shlex
from pathlib import Path

import pytest

from haystack_integrations.offload.cli import main


def test_the_demos_last_line_gives_ls_and_serve_on_its_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "demo results"  # a space: the commands are quoted for the shell
    assert main(["demo", "--store", str(store), "--tenants", "acme", "--sessions", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    quoted = shlex.quote(str(store))
    assert f"offload-haystack ls {quoted} -R" in last and f"offload-haystack serve --store {quoted}" in last, last

    # The ls it suggests lists what the demo stored.
    ls = shlex.split(last.split("offload-haystack ", 1)[1].split(" (", 1)[0])
    assert main(ls) == 0
    listed = capsys.readouterr().out
    assert "acme/" in listed and "1 session(s)" in listed, listed
