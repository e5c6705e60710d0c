"""
Every module imports on its own, as a deployment's import string loads it first
(``uvicorn offload_haystack_app.server.app:app_from_environment``): a cycle that works only in the "right" order
fails here. The library's modules and the reference app's are each imported first in a state where none of ours is
loaded yet.

One fresh interpreter loads the third-party packages we build on (Haystack, pydantic, fsspec, FastAPI), none of ours,
then forks a child per module that imports just that module: each child starts from the same clean state of our
packages as a fresh interpreter would, at a fraction of the cost of starting ~110 interpreters.
"""

import json
import pkgutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

import haystack_integrations.offload as library
import offload_haystack_app as app

MODULES = sorted(
    module.name
    for package in (library, app)
    for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
)
OURS = (library.__name__, app.__name__)
# Loaded before the forks: heavy, none of them imports a module of ours, and all come with the test extras. Each one
# here is imported once instead of once per child that needs it (the S3 clients and moto: 17 s -> 10 s here).
THIRD_PARTY = [
    *("haystack", "haystack.components.agents", "haystack.tools", "pydantic", "fsspec", "jsonschema"),
    *("botocore.session", "boto3", "aiobotocore.session", "s3fs", "obstore", "moto", "moto.server"),
    *("fastapi", "starlette", "uvicorn", "httpx", "opentelemetry.metrics"),
]

_FORKING = """
import importlib, json, os, sys, threading, traceback
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
ours = tuple(json.loads(sys.argv[2]))
assert not [name for name in sys.modules if name.startswith(ours)], "a third-party import loaded one of ours"
# A fork is a clean copy only of a process with one thread.
assert threading.active_count() == 1, [thread.name for thread in threading.enumerate()]
results = {}
for module in json.loads(sys.argv[3]):
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            message = ""
        except BaseException as error:  # report it, whatever it is
            message = traceback.format_exception_only(error)[-1].strip() or type(error).__name__
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    _, status = os.waitpid(child, 0)
    results[module] = message if os.waitstatus_to_exitcode(status) == 0 else f"child exited with {status}"
print(json.dumps(results))
"""


@cache
def _imported_alone() -> dict[str, str]:
    completed = subprocess.run(
        [sys.executable, "-c", _FORKING, json.dumps(THIRD_PARTY), json.dumps(OURS), json.dumps(MODULES)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    results: dict[str, str] = json.loads(completed.stdout.strip().splitlines()[-1])
    return results


@pytest.mark.parametrize("module", MODULES)
def test_the_module_imports_alone(module: str) -> None:
    assert _imported_alone()[module] == ""


def test_a_cycle_is_caught(tmp_path: Path) -> None:
    # The forking runner must fail a module that only imports in the "right" order, as a fresh interpreter would.
    package = tmp_path / "cyclic_example"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclic_example.b import B\nA = 1\n")
    (package / "b.py").write_text("from cyclic_example.a import A\nB = 2\n")
    completed = subprocess.run(
        [sys.executable, "-c", _FORKING, "[]", '["cyclic_example"]', '["cyclic_example.a", "cyclic_example.b"]'],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=tmp_path,
    )
    results = json.loads(completed.stdout.strip().splitlines()[-1])
    assert "ImportError" in results["cyclic_example.a"] and "ImportError" in results["cyclic_example.b"]


def test_every_module_is_found() -> None:
    assert "haystack_integrations.offload.sessions.service" in MODULES
    assert "offload_haystack_app.server.app" in MODULES and len(MODULES) > 80
