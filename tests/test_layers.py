"""
The package's parts import downward only, in the order CONTRIBUTING's module map draws them: a part never imports
one drawn above it, not even for type checking or inside a function, so there is no cycle between parts to untie.
"""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "src" / "haystack_integrations" / "offload"
CONTRIBUTING = Path(__file__).parents[1] / "CONTRIBUTING.md"

# Bottom first. A part may import the parts listed before it, never one listed after it.
LAYERS = [
    "metrics",
    "constants",
    "errors",
    "compat",
    "leases",
    "sync_calls",
    "testing",
    "stores",
    "types",
    "context",
    "hooks",
    "tools",
    "approvals",
    "operations",
    "sessions",
    "cli",
    "__init__",
]


def _part_of(module: tuple[str, ...]) -> str:
    return module[0]


def _module_of(path: Path) -> tuple[str, ...]:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts


def _imported_parts(path: Path) -> set[str]:
    module = _module_of(path)
    package = module if path.name == "__init__.py" and module != ("__init__",) else module[:-1]
    parts = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - node.level + 1]
            heads = [node.module.split(".")[0]] if node.module else [alias.name for alias in node.names]
            parts.update((*base, head)[0] for head in heads)
            continue
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("haystack_integrations.offload."):
            target = tuple(node.module.split(".")[2:])  # type: ignore[union-attr]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.startswith("haystack_integrations.offload.")]
            parts.update(name.split(".")[2] for name in names)
            continue
        else:
            continue
        parts.add(target[0])
    return parts - {_part_of(module)}


def _files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_part_has_a_layer() -> None:
    parts = {_part_of(_module_of(path)) for path in _files()}
    assert parts == set(LAYERS)


@pytest.mark.parametrize("path", _files(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_module_imports_only_parts_drawn_below_its_own(path: Path) -> None:
    own = LAYERS.index(_part_of(_module_of(path)))
    upward = sorted(part for part in _imported_parts(path) if LAYERS.index(part) > own)
    assert upward == [], f"{path.relative_to(PACKAGE)} imports {upward}, drawn above {LAYERS[own]}"


def test_the_module_map_draws_the_parts_in_this_order() -> None:
    section = CONTRIBUTING.read_text().split("## Where things live", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)(?:\.py|/)?`", section, flags=re.MULTILINE)
    drawn = [row for row in rows if row in LAYERS]
    assert drawn == list(reversed(LAYERS))


# The reference app and the web stack it is built on: the library imports none of them, anywhere.
APPLICATION_MODULES = ("offload_haystack_app", "fastapi", "starlette", "uvicorn", "pydantic_settings")


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("path", _files(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_the_library_never_imports_the_app(path: Path) -> None:
    imported = {name for name in _imported_modules(path) if name.split(".")[0] in APPLICATION_MODULES}
    assert imported == set(), f"{path.relative_to(PACKAGE)} imports {sorted(imported)}"


def test_the_installed_library_holds_no_page_or_app_code() -> None:
    import haystack_integrations.offload as installed

    root = Path(installed.__file__).parent
    shipped = {path.suffix for path in root.rglob("*") if path.is_file() and "__pycache__" not in path.parts}
    assert shipped <= {".py", ".typed"}, shipped
    assert not (root / "server").exists() and not (root / "demo").exists()
