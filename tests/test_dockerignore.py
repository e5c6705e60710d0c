"""
`.dockerignore` (the build context of `app/deploy/Dockerfile`, the checkout's root): what the image's COPY needs goes
in, and neither `.git` nor tox's envs, virtual environments or caches do. Matched as Docker matches: the last pattern
that matches a path or one of its parent folders decides, ``!`` lets back in, ``**`` spans folders.
"""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCKERIGNORE = ROOT / ".dockerignore"
DOCKERFILE = ROOT / "app" / "deploy" / "Dockerfile"


def _regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _rules() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        rules.append((keep, _regex(line.removeprefix("!").strip("/"))))
    return rules


def _sent(path: str) -> bool:
    """Whether Docker sends `path` (relative to the context) to the builder."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    sent = True
    for keep, regex in _rules():
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            sent = keep
    return sent


def _copied() -> list[str]:
    sources: list[str] = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            words = line.split()[1:]
            words = json.loads(line[5:]) if line[5:].lstrip().startswith("[") else words
            sources += [word for word in words[:-1] if not word.startswith("--")]
    return sources


def test_what_the_image_copies_is_sent() -> None:
    assert _copied() == ["pyproject.toml", "README.md", "LICENSE", "src", "app"]
    # Every file of those folders but the leftovers of a build or a test run (which the other test leaves out).
    leftovers = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build", "dist"}
    tracked = [
        path.relative_to(ROOT).as_posix()
        for source in _copied()
        for path in ([ROOT / source] if (ROOT / source).is_file() else (ROOT / source).rglob("*"))
        if path.is_file() and not leftovers & set(path.parts) and not any(p.endswith(".egg-info") for p in path.parts)
    ]
    assert len(tracked) > 50
    assert [path for path in tracked if not _sent(path)] == []


def test_history_envs_and_caches_are_not_sent() -> None:
    left_out = [
        ".git/HEAD",
        ".tox/py311/lib/python3.11/site-packages/x.py",
        ".tox/.pkg/x",
        ".venv/bin/python",
        "venv/bin/python",
        ".mypy_cache/3.11/x.json",
        ".pytest_cache/v/cache",
        "src/haystack_integrations/offload/__pycache__/cli.cpython-311.pyc",
        "app/src/offload_haystack_app/__pycache__/x.pyc",
        "app/src/offload_haystack_app.egg-info/PKG-INFO",
        "app/build/lib/x.py",
        "tests/conftest.py",
        "docs/index.md",
        "offload-demo-results/acme/x",
    ]
    assert [path for path in left_out if _sent(path)] == []
