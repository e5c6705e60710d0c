"""
Every ```python block in ``docs/`` runs here, so the documentation cannot drift from the code.

A page's blocks run in order in one namespace, the way a reader follows the page. Two markers, written as an HTML
comment on the line before a block (invisible on the site), change that:

- ``<!-- docs-test: skip REASON -->``: the block is not run (it needs a real cloud account or an API key). A reason
  is required and shows up in the test report.
- ``<!-- docs-test: requires MODULE[,MODULE] -->``: the block needs an optional package (FastAPI, hayhooks). It must
  be self-contained: it runs as a test of its own, in a fresh namespace, and is skipped, naming the missing module,
  where that package is not installed. The page's other blocks never depend on it.
"""

import importlib.util
import re
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

DOCS_DIR = Path(__file__).resolve().parents[2] / "docs"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\n]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<directive>[a-z]+)\s*(?P<argument>.*?)\s*-->\s*$")
_PYTHON = {"python", "py", "python3"}


class DocExampleError(AssertionError):
    """A documentation example failed; the message names the page and line of the block."""


@dataclass(frozen=True)
class Example:
    """One fenced Python block of a documentation page."""

    page: str
    line: int
    code: str
    skip: str | None = None
    requires: tuple[str, ...] = ()


def extract_examples(text: str, page: str) -> list[Example]:
    """
    Find the fenced Python blocks in a Markdown page, with the marker (if any) on the line before each.

    :param text: The page's Markdown.
    :param page: The page's name, for messages.
    :returns: The blocks in page order.
    :raises ValueError: If a marker is unknown or has no argument, or a fence is never closed.
    """
    lines = text.splitlines()
    examples = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        language = opening["info"].split(maxsplit=1)[0].strip("{}.").lower() if opening["info"].strip() else ""
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            closing = _FENCE.match(lines[end])
            if (
                closing
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end].lstrip())
            end += 1
        else:
            raise ValueError(f"{page}:{index + 1}: the code fence is never closed.")
        if language in _PYTHON:
            skip, requires = _marker(lines, index, page)
            examples.append(Example(page, index + 2, "\n".join(body) + "\n", skip, requires))
        index = end + 1
    return examples


def _marker(lines: list[str], fence_index: int, page: str) -> tuple[str | None, tuple[str, ...]]:
    previous = fence_index - 1
    while previous >= 0 and not lines[previous].strip():
        previous -= 1
    if previous < 0:
        return None, ()
    marker = _MARKER.match(lines[previous])
    if marker is None:
        if "docs-test" in lines[previous]:
            raise ValueError(f"{page}:{previous + 1}: malformed docs-test marker {lines[previous].strip()!r}.")
        return None, ()
    directive, argument = marker["directive"], marker["argument"].lstrip("-—: ").strip()
    if not argument:
        raise ValueError(f"{page}:{previous + 1}: 'docs-test: {directive}' needs a reason or a module list.")
    if directive == "skip":
        return argument, ()
    if directive == "requires":
        return None, tuple(name.strip() for name in argument.split(",") if name.strip())
    raise ValueError(f"{page}:{previous + 1}: unknown docs-test directive {directive!r} (use skip or requires).")


def run_examples(examples: list[Example]) -> int:
    """
    Run one page's blocks in order in a fresh namespace.

    :param examples: The page's blocks.
    :returns: How many blocks ran.
    :raises DocExampleError: If a block raises; the message has the page, line and traceback.
    """
    namespace: dict[str, object] = {"__name__": "__docs_example__"}
    ran = 0
    for example in examples:
        if example.skip is not None or example.requires:
            continue
        code = compile(example.code, f"{example.page}:{example.line}", "exec")
        try:
            exec(code, namespace)  # noqa: S102 - running our own documentation is the point
        except BaseException as error:
            details = "".join(traceback.format_exception(error))
            raise DocExampleError(f"The example at {example.page}:{example.line} failed:\n{details}") from error
        ran += 1
    return ran


_SNIPPET = re.compile(r'^[ \t]*--8<--[ \t]+"(?P<path>[^"]+)"[ \t]*$', re.MULTILINE)


def expand_snippets(text: str) -> str:
    """
    Inline the files a page includes with pymdownx.snippets (``--8<-- "infra/README.md"``), as the site build does.

    :param text: The page's Markdown.
    :returns: The Markdown with every include replaced by the included file, relative to the repository root.
    """
    return _SNIPPET.sub(lambda match: (DOCS_DIR.parent / match["path"]).read_text(encoding="utf-8"), text)


def _pages() -> list[Path]:
    return sorted(DOCS_DIR.rglob("*.md"))


def _page_id(page: Path) -> str:
    return str(page.relative_to(DOCS_DIR))


def _examples(page: Path) -> list[Example]:
    return extract_examples(expand_snippets(page.read_text(encoding="utf-8")), _page_id(page))


PAGES_WITH_EXAMPLES = [page for page in _pages() if any(not example.requires for example in _examples(page))]
OPTIONAL_EXAMPLES = [example for page in _pages() for example in _examples(page) if example.requires]


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=_page_id)
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    examples = _examples(page)
    # Examples that write to a local directory write into the test's own.
    monkeypatch.chdir(tmp_path)
    runnable = [example for example in examples if example.skip is None and not example.requires]
    assert run_examples(examples) == len(runnable)


@pytest.mark.parametrize("example", OPTIONAL_EXAMPLES, ids=lambda example: f"{example.page}:{example.line}")
def test_optional_package_examples_run(example: Example, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = [module for module in example.requires if not _importable(module)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}, which is not installed here")
    monkeypatch.chdir(tmp_path)
    assert run_examples([Example(example.page, example.line, example.code)]) == 1


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def test_most_examples_run_and_every_skip_says_why() -> None:
    examples = [example for page in _pages() for example in _examples(page)]
    skipped = [example for example in examples if example.skip is not None]
    assert examples, "no ```python blocks found under docs/"
    assert all(example.skip for example in skipped)  # extract_examples refuses an empty reason
    # Skipping is for what a CI machine cannot have (a cloud account, an API key), not a way out of testing.
    assert len(skipped) * 4 <= len(examples), [f"{example.page}:{example.line}" for example in skipped]


def test_extractor_reads_markers_and_nested_fences() -> None:
    page = "\n".join(
        [
            "Intro",
            "```python",
            "x = 1",
            "```",
            "",
            "<!-- docs-test: skip needs an OpenAI API key -->",
            "```python",
            "import openai_only",
            "```",
            '!!! tip "In an admonition"',
            "    <!-- docs-test: requires fastapi, httpx -->",
            '    ```py title="app.py"',
            "    if x:",
            "        y = x + 1",
            "    ```",
            "```bash",
            "pip install offload-haystack",
            "```",
            "````markdown",
            "```python",
            "not_code = True",
            "```",
            "````",
        ]
    )
    first, skipped, nested = extract_examples(page, "page.md")

    assert (first.line, first.code, first.skip) == (3, "x = 1\n", None)
    assert skipped.skip == "needs an OpenAI API key"
    assert nested.requires == ("fastapi", "httpx")
    assert nested.code == "if x:\n    y = x + 1\n"


@pytest.mark.parametrize(
    "marker",
    ["<!-- docs-test: skip -->", "<!-- docs-test: ignore because -->", "<!-- docs-test skip reason -->"],
)
def test_extractor_refuses_bad_markers(marker: str) -> None:
    with pytest.raises(ValueError, match=r"page\.md:1"):
        extract_examples(f"{marker}\n```python\npass\n```\n", "page.md")


def test_a_failing_example_fails_with_its_page_and_line() -> None:
    examples = extract_examples("```python\nvalue = 41\n```\n\n```python\nassert value == 42\n```\n", "broken.md")
    with pytest.raises(DocExampleError, match=r"broken\.md:6"):
        run_examples(examples)


def test_blocks_share_one_namespace_per_page_only() -> None:
    assert run_examples(extract_examples("```python\nshared = 1\n```\n```python\nassert shared == 1\n```\n", "a.md"))
    with pytest.raises(DocExampleError, match="NameError"):
        run_examples(extract_examples("```python\nshared\n```\n", "b.md"))


def test_included_files_are_tested_too() -> None:
    # docs/infrastructure.md is one include line; its examples come from infra/README.md.
    examples = _examples(DOCS_DIR / "infrastructure.md")
    assert any("LocalS3Server" in example.code for example in examples)
    assert expand_snippets('--8<-- "infra/README.md"\n').startswith("# Infrastructure and local S3")


def _hayhooks_example() -> Example:
    [example] = [
        example
        for example in OPTIONAL_EXAMPLES
        if example.page == "multi-user.md" and "hayhooks" in example.requires and "def run_api_async" in example.code
    ]
    return example


@pytest.fixture
def hayhooks_client() -> Iterator[Any]:
    """
    The hayhooks example of docs/multi-user.md deployed the way hayhooks deploys a pipeline_wrapper.py, on an app of
    its own: the file is the block up to its "Try it" part, and requests go through hayhooks' own /<name>/run route.
    """
    pytest.importorskip("hayhooks")
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from hayhooks.server.utils.deploy_utils import deploy_pipeline_files, undeploy_pipeline

    code = _hayhooks_example().code.split("# Try it in-process:")[0]
    app = FastAPI()
    name = f"docs-assistant-{uuid.uuid4().hex[:8]}"
    deploy_pipeline_files(name, {"pipeline_wrapper.py": code}, app=app, save_files=False)
    try:
        with TestClient(app) as client:
            yield lambda headers, session="chat-42": client.post(
                f"/{name}/run", json={"question": "hi", "session_id": session}, headers=headers
            )
    finally:
        undeploy_pipeline(name, app)


def test_the_hayhooks_example_answers_a_tenants_request(hayhooks_client: Any) -> None:
    response = hayhooks_client({"X-Tenant-Id": "acme"})
    assert response.status_code == 200 and response.json() == {"result": "Hello!"}


@pytest.mark.parametrize("headers", [{}, {"X-Tenant-Id": ""}, {"X-Tenant-Id": "   "}], ids=["none", "empty", "blank"])
def test_the_hayhooks_example_refuses_a_request_without_a_tenant_with_401(
    hayhooks_client: Any, headers: dict[str, str]
) -> None:
    response = hayhooks_client(headers)
    assert response.status_code == 401, response.text  # not 500, and no shared "anonymous" tenant
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("tenant", "session", "field"),
    [
        ("../globex", "chat-42", "tenant"),
        ("acme/globex", "chat-42", "tenant"),
        ("..", "chat-42", "tenant"),
        ("acme", "../chat-1", "session"),
    ],
    ids=["traversal", "separator", "dot-dot", "bad session"],
)
def test_the_hayhooks_example_refuses_a_malformed_id_with_400(
    hayhooks_client: Any, tenant: str, session: str, field: str
) -> None:
    response = hayhooks_client({"X-Tenant-Id": tenant}, session)
    assert response.status_code == 400, response.text
    assert f"{field} id" in response.json()["detail"]


def _multi_user_example(marker: str) -> Example:
    [example] = [example for example in OPTIONAL_EXAMPLES if example.page == "multi-user.md" and marker in example.code]
    return example


def test_the_sessions_example_answers_a_repeated_decision_with_409() -> None:
    # The FastAPI app of docs/multi-user.md built on ChatService: the same decision posted twice is a 409, not a 500.
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    code = _multi_user_example("service = ChatService(agent)  # one for every tenant").code
    namespace: dict[str, Any] = {"__name__": "chat_app"}
    exec(compile(code, "chat_app.py", "exec"), namespace)  # noqa: S102 - the page's own example
    with TestClient(namespace["app"], raise_server_exceptions=False) as client:
        acme = {"X-Tenant-Id": "acme"}
        held = client.post("/chats/repeat/messages", json={"text": "invoice Initech"}, headers=acme).json()
        [request] = held["pending"]
        decision = f"/chats/repeat/approvals/{request['id']}"
        first = client.post(decision, json={"approved": True}, headers=acme)
        again = client.post(decision, json={"approved": True}, headers=acme)

    assert first.status_code == 200, first.text
    assert again.status_code == 409, again.text


@pytest.fixture
def hayhooks_chat() -> Iterator[Any]:
    """
    The chat-completion wrapper of docs/multi-user.md deployed as hayhooks deploys it, behind hayhooks' own
    OpenAI-compatible router (``POST /v1/chat/completions``, model: the wrapper's name).
    """
    pytest.importorskip("hayhooks")
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from hayhooks.server.pipelines.registry import registry
    from hayhooks.server.routers.openai import create_openai_router
    from hayhooks.server.utils.deploy_utils import deploy_pipeline_files, undeploy_pipeline

    code = _multi_user_example("run_chat_completion_async").code.split("# Try it in-process:")[0]
    app = FastAPI()
    app.include_router(create_openai_router(registry))
    name = f"docs-chat-{uuid.uuid4().hex[:8]}"
    deploy_pipeline_files(name, {"pipeline_wrapper.py": code}, app=app, save_files=False)
    headers = {"X-Tenant-Id": "acme", "X-Chat-Id": f"chat-{uuid.uuid4().hex[:8]}"}
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            yield lambda text: client.post(
                "/v1/chat/completions",
                json={"model": name, "messages": [{"role": "user", "content": text}]},
                headers=headers,
            )
    finally:
        undeploy_pipeline(name, app)


def test_the_hayhooks_chat_wrapper_answers_a_repeated_decision_with_409(hayhooks_chat: Any) -> None:
    def reply(text: str) -> str:
        response = hayhooks_chat(text)
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["message"]["content"])

    assert reply("hi") == "Hello!"
    request_id = reply("invoice Initech").split("`/approve ")[1].split("`")[0]
    assert reply(f"/approve {request_id}") == "Done: Invoice for 1200 EUR sent to Initech."

    repeated = hayhooks_chat(f"/approve {request_id}")
    assert repeated.status_code == 409, repeated.text
    assert hayhooks_chat("/approve no-such-request").status_code == 404
