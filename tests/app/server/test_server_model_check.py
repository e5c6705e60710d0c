"""
The start-up check of an OpenAI-compatible endpoint (``serve --model openai``), against a tiny local HTTP server.

The endpoint answers a model list, refuses the key, lists other models, has no list at all, or nobody listens; the
check passes or stops with one clear line, and ``serve`` exits non-zero with that line before it serves anything.
"""

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from server_processes import free_port

from offload_haystack_app.server import ServerSettings
from offload_haystack_app.server.model_check import ModelEndpointError, check_openai_endpoint

KEY = "sk-test-0123456789"
MODELS = {"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}, {"id": "llama3.1", "object": "model"}]}


class Endpoint(BaseHTTPRequestHandler):
    """``GET /v1/models``, answered as the test sets `status` and `body`; it records the requests it saw."""

    status = 200
    body: object = MODELS
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        data = json.dumps(self.body).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    """A local OpenAI-compatible endpoint's base URL (``.../v1``)."""
    Endpoint.status, Endpoint.body, Endpoint.seen = 200, MODELS, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_an_endpoint_that_lists_the_model_passes(endpoint: str) -> None:
    check_openai_endpoint(endpoint, api_key=KEY, model="llama3.1")
    assert Endpoint.seen == [("/v1/models", f"Bearer {KEY}")]  # one request, with the key


def test_a_refused_key_stops_with_one_line(endpoint: str) -> None:
    Endpoint.status, Endpoint.body = 401, {"error": {"message": "Incorrect API key provided"}}
    with pytest.raises(ModelEndpointError) as refused:
        check_openai_endpoint(endpoint + "/", api_key=KEY, model="gpt-4o-mini")
    message = str(refused.value)
    assert message == (
        f"The model endpoint {endpoint}/models refused the API key (HTTP 401): check OFFLOAD_SERVER_OPENAI_API_KEY "
        "or OPENAI_API_KEY."
    )
    assert KEY not in message and "\n" not in message


def test_a_model_the_endpoint_does_not_list_stops(endpoint: str) -> None:
    with pytest.raises(ModelEndpointError, match=r"does not list the model 'gpt-4o' \(it lists 2: gpt-4o-mini, llama"):
        check_openai_endpoint(endpoint, api_key=KEY, model="gpt-4o")


@pytest.mark.parametrize(("status", "body"), [(404, {"detail": "Not Found"}), (200, {"models": "elsewhere"})])
def test_an_endpoint_without_a_model_list_passes(endpoint: str, status: int, body: object) -> None:
    Endpoint.status, Endpoint.body = status, body
    check_openai_endpoint(endpoint, api_key=KEY, model="anything")


def test_an_endpoint_that_fails_stops(endpoint: str) -> None:
    Endpoint.status, Endpoint.body = 503, {"error": "overloaded"}
    with pytest.raises(ModelEndpointError, match=r"answered HTTP 503"):
        check_openai_endpoint(endpoint, api_key=KEY, model="gpt-4o-mini")


def test_an_unreachable_endpoint_stops() -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"  # nobody listens: connection refused
    with pytest.raises(ModelEndpointError, match=rf"^Cannot reach the model endpoint {base_url}/models: ") as failed:
        check_openai_endpoint(base_url, api_key=KEY, model="gpt-4o-mini", timeout=2)
    assert "\n" not in str(failed.value)


def test_credentials_in_the_url_are_not_shown() -> None:
    base_url = f"http://user:hunter2@127.0.0.1:{free_port()}/v1"
    with pytest.raises(ModelEndpointError) as failed:
        check_openai_endpoint(base_url, api_key=KEY, model="gpt-4o-mini", timeout=2)
    assert "hunter2" not in str(failed.value)


def test_settings_check_the_openai_model_only(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    ServerSettings(model="scripted", openai_base_url="http://127.0.0.1:1/v1").check_model()  # no request
    assert Endpoint.seen == []
    ServerSettings(model="openai", openai_base_url=endpoint, openai_model="llama3.1", openai_api_key=KEY).check_model()
    Endpoint.status = 403
    settings = ServerSettings(model="openai", openai_base_url=endpoint, openai_api_key=KEY)
    with pytest.raises(ModelEndpointError, match="HTTP 403"):
        settings.check_model()
    settings.model_copy(update={"openai_check_timeout": 0}).check_model()  # the check is switched off
    assert len(Endpoint.seen) == 2


def _serve(base_url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "haystack_integrations.offload.cli", "serve", "--port", str(free_port())]
    command += ["--store", str(tmp_path / "results"), "--model", "openai", "--openai-base-url", base_url]
    environment = {
        **{name: value for name, value in os.environ.items() if not name.startswith("OFFLOAD_SERVER_")},
        "OFFLOAD_SERVER_OPENAI_API_KEY": KEY,
    }
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120, check=False)


@pytest.mark.parametrize("answer", ["refused key", "unreachable"])
@pytest.mark.slow
def test_serve_stops_before_serving_when_the_check_fails(endpoint: str, tmp_path: Path, answer: str) -> None:
    if answer == "refused key":
        Endpoint.status, Endpoint.body = 401, {"error": "invalid key"}
        base_url, expected = endpoint, "refused the API key (HTTP 401)"
    else:
        base_url = f"http://127.0.0.1:{free_port()}/v1"
        expected = "Cannot reach the model endpoint"
    finished = _serve(base_url, tmp_path)
    assert finished.returncode == 2
    lines = finished.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("offload-haystack: error: ") and expected in lines[0], lines
    assert KEY not in finished.stderr
    assert "offload-haystack serve:" not in finished.stdout  # stopped before it announced anything
