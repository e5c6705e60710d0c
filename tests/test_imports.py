"""
Every module imports on its own, in a fresh interpreter, as a deployment's import string loads it first
(``uvicorn offload_haystack_app.server.app:app_from_environment``): a cycle that works only in the "right"
order fails here.
"""

import pkgutil
import subprocess
import sys

import pytest

import haystack_integrations.offload as package

MODULES = sorted(module.name for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."))


@pytest.mark.parametrize("module", MODULES)
def test_the_module_imports_alone_in_a_fresh_interpreter(module: str) -> None:
    imported = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    assert imported.returncode == 0, imported.stderr.strip().splitlines()[-1:]


def test_every_module_is_found() -> None:
    assert "haystack_integrations.offload.sessions.service" in MODULES and len(MODULES) > 50
