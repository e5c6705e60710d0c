"""
The reference app is the example a team copies: it imports the library's public names (a package's ``__all__``), so
whatever it does, an app of their own can do without reaching into private modules.
"""

import ast
import importlib
from pathlib import Path

APP = Path(__file__).parents[2] / "app" / "src"
# The packages (and the one module, `metrics`) whose `__all__` is the library's public surface.
PUBLIC_MODULES = ["haystack_integrations.offload"] + [
    f"haystack_integrations.offload.{name}"
    for name in ("approvals", "cli", "hooks", "metrics", "operations", "sessions", "stores", "testing", "tools")
]


def _library_imports() -> set[tuple[str, str]]:
    found = set()
    for path in APP.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("haystack_integrations.offload"):
                found.update((str(node.module), alias.name) for alias in node.names)
    return found


def _public(module: str, name: str) -> bool:
    return module in PUBLIC_MODULES and name in getattr(importlib.import_module(module), "__all__", [])


def test_the_app_imports_public_names_only() -> None:
    # 33 names no `__all__` listed when issue 45 was filed, 11 before this round, none since.
    private = {(module, name) for module, name in _library_imports() if not _public(module, name)}
    assert private == set(), "import these from a package that exports them (or let the app own them)"


def test_the_check_sees_imports_of_every_form() -> None:
    # The check reads `from ... import ...` lines: the app imports library names in no other form.
    plain = [
        alias.name
        for path in APP.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith("haystack_integrations")
    ]
    assert plain == []
    assert _library_imports(), "the app imports the library: the check must find those imports"
