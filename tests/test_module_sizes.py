"""
No library module grows past 800 lines: a module that long holds more than one concern (issue 45 split the store,
the resume procedure and the command line along their seams); split it where its concerns part.
"""

from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "src" / "haystack_integrations" / "offload"
MOST_LINES = 800


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_a_library_module_stays_under_800_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MOST_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines: split it along a seam"
