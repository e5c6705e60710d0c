"""
The demo's stand-ins (the scripted model and the demo tools) live in `offload_haystack_app.demo`, apart from the
production server, which takes them in two places only: its default tools and its default model.
"""

import ast
from pathlib import Path

SERVER = Path(__file__).parents[2] / "app" / "src" / "offload_haystack_app" / "server"


def _app_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}


def test_the_server_takes_the_stand_ins_in_two_places_only() -> None:
    importers = {
        path.name: sorted(module for module in _app_imports(path) if module.startswith("offload_haystack_app.demo"))
        for path in SERVER.glob("*.py")
    }
    assert {name: modules for name, modules in importers.items() if modules} == {
        "agent.py": ["offload_haystack_app.demo.tools"],  # build_agent's default tools
        "settings.py": ["offload_haystack_app.demo.scripted_model"],  # the model when no endpoint is configured
    }


def test_the_server_defines_no_tool_and_no_scripted_model() -> None:
    for path in SERVER.glob("*.py"):
        text = path.read_text()
        assert "Tool(" not in text and "MockChatGenerator(" not in text, path.name
