"""Subpackages import lazily, like the top level: importing one module loads what it needs, not its whole package."""

import subprocess
import sys

import pytest

PACKAGE = "haystack_integrations.offload"


def _loaded_after(statement: str) -> set[str]:
    script = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    return {name for name in run.stdout.split() if name.startswith(PACKAGE)}


@pytest.mark.parametrize(
    ("statement", "not_loaded"),
    [
        (f"import {PACKAGE}.stores.names", f"{PACKAGE}.stores.fsspec_store"),
        (f"import {PACKAGE}.stores.io", f"{PACKAGE}.stores.fsspec_store"),
        (f"import {PACKAGE}.hooks.write_behind", f"{PACKAGE}.approvals"),
        (f"import {PACKAGE}.hooks.policies", f"{PACKAGE}.hooks.compaction"),
        (f"import {PACKAGE}.sessions.history", f"{PACKAGE}.sessions.service"),
    ],
)
def test_importing_one_module_does_not_load_its_package(statement: str, not_loaded: str) -> None:
    loaded = _loaded_after(statement)
    assert not {name for name in loaded if name == not_loaded or name.startswith(f"{not_loaded}.")}


@pytest.mark.parametrize(
    ("package", "name"),
    [
        ("stores", "FsspecToolResultStore"),
        ("stores", "end_session"),
        ("hooks", "OffloadHook"),
        ("sessions", "ChatService"),
    ],
)
def test_the_package_still_hands_out_its_names(package: str, name: str) -> None:
    assert f"{PACKAGE}.{package}" in _loaded_after(f"from {PACKAGE}.{package} import {name}")
