"""Every module says in a few lines what it is for; the reasoning behind it lives in docs/design.md."""

import ast
from pathlib import Path

import pytest

import haystack_integrations.offload as library
import offload_haystack_app as app

# The library's modules and the reference app's.
MODULES = sorted([*Path(library.__path__[0]).rglob("*.py"), *Path(app.__path__[0]).rglob("*.py")])
LONGEST = 8


@pytest.mark.parametrize("path", MODULES, ids=lambda path: "/".join(path.parts[-3:]))
def test_the_module_docstring_is_short(path: Path) -> None:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
    assert docstring, "every module opens with a docstring saying what it is for"
    lines = len(docstring.strip("\n").splitlines())
    assert lines <= LONGEST, f"{lines} lines: move the design reasoning to docs/design.md"


def test_every_module_is_found() -> None:
    # Both packages are walked, down to their subpackages (a wrong path would find nothing and pass every test above).
    found = {"/".join(path.parts[-3:]) for path in MODULES}
    expected = {"offload/stores/fsspec_store.py", "offload/approvals/hook.py", "offload_haystack_app/server/app.py"}
    assert expected <= found
    assert len(MODULES) > 80
