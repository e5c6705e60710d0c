"""
app/README.md is where a team copying the app starts: its reading order names files that exist, the example and the
Agent first, and every module of the production server somewhere.
"""

import re
from pathlib import Path

APP = Path(__file__).parents[2] / "app"
PACKAGE = APP / "src" / "offload_haystack_app"


def _reading_order() -> str:
    text = (APP / "README.md").read_text()
    assert "## Reading order" in text
    return text.split("## Reading order", 1)[1]


def test_the_reading_order_names_files_that_exist() -> None:
    named = re.findall(r"`((?:server|demo|deploy)/[\w./]*|commands\.py)`", _reading_order())
    assert named, "the reading order names the app's files"
    missing = [name for name in named if not ((PACKAGE / name).exists() or (APP / name).exists())]
    assert missing == []


def test_it_starts_with_the_target_pattern_then_the_agent() -> None:
    steps = re.findall(r"^\d+\. `([^`]+)`", _reading_order(), flags=re.MULTILINE)
    assert steps[:2] == ["demo/example.py", "server/agent.py"]


def test_every_server_module_is_in_it() -> None:
    order = _reading_order()
    modules = sorted(path.name for path in (PACKAGE / "server").glob("*.py") if path.name != "__init__.py")
    assert [name for name in modules if f"server/{name}" not in order] == []
