"""
The start-up check of an OpenAI-compatible model endpoint: one cheap request before the server takes any traffic.

``GET {base_url}/models`` with the key, with a short timeout. Without it, a wrong URL, a refused key or a model name
with a typo gives a server that starts, shows its page, and fails every user's first message with a 502.
"""

import httpx

from haystack_integrations.offload import OffloadError

OPENAI_BASE_URL = "https://api.openai.com/v1"
DEFAULT_CHECK_TIMEOUT = 5.0
MAX_MODELS_NAMED = 5


class ModelEndpointError(OffloadError, ValueError):
    """The model endpoint cannot serve: unreachable, the key refused, or the model not among those it lists."""


def check_openai_endpoint(
    base_url: str | None, *, api_key: str, model: str, timeout: float = DEFAULT_CHECK_TIMEOUT
) -> None:
    """
    Ask the endpoint for its models, once, and stop at the first sign it cannot serve `model` with `api_key`.

    ```python
    from offload_haystack_app.server.model_check import check_openai_endpoint

    check_openai_endpoint("http://127.0.0.1:11434/v1", api_key="unused", model="llama3.1")   # an Ollama server
    ```

    An endpoint without a model list (404, 405 or 501 to ``/models``, or another body than ``{"data": [...]}``) passes:
    many OpenAI-compatible servers do not implement it, and the first message will tell.

    :param base_url: The endpoint, as ``OpenAIChatGenerator`` takes it; None for OpenAI's.
    :param api_key: The key, sent as a bearer token (never shown in a message).
    :param model: The model the server will ask for.
    :param timeout: Seconds to wait for the endpoint.
    :raises ModelEndpointError: In one line: the endpoint is unreachable or too slow, refuses the key (401, 403),
        answers with another error, or lists models but not `model`.
    """
    url = f"{(base_url or OPENAI_BASE_URL).rstrip('/')}/models"
    shown = _shown(url)
    try:
        response = httpx.get(url, headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout)
    except httpx.TimeoutException as error:
        raise ModelEndpointError(f"The model endpoint {shown} did not answer within {timeout:g} s.") from error
    except httpx.HTTPError as error:
        raise ModelEndpointError(f"Cannot reach the model endpoint {shown}: {error}") from error
    if response.status_code in (401, 403):
        raise ModelEndpointError(
            f"The model endpoint {shown} refused the API key (HTTP {response.status_code}): check "
            "OFFLOAD_SERVER_OPENAI_API_KEY or OPENAI_API_KEY."
        )
    if response.status_code in (404, 405, 501):
        return  # no model listing at this endpoint
    if response.status_code >= 400:
        raise ModelEndpointError(f"The model endpoint {shown} answered HTTP {response.status_code}.")
    listed = _model_ids(response)
    if listed and model not in listed:
        named = ", ".join(sorted(listed)[:MAX_MODELS_NAMED]) + (", ..." if len(listed) > MAX_MODELS_NAMED else "")
        raise ModelEndpointError(
            f"The model endpoint {shown} does not list the model {model!r} (it lists {len(listed)}: {named}); "
            "set OFFLOAD_SERVER_OPENAI_MODEL or --openai-model."
        )


def _model_ids(response: httpx.Response) -> set[str] | None:
    try:
        data = response.json()["data"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(data, list):
        return None
    return {str(item["id"]) for item in data if isinstance(item, dict) and "id" in item}


def _shown(url: str) -> str:
    # Credentials in the URL stay out of logs and error lines.
    parsed = httpx.URL(url)
    return str(parsed.copy_with(username=None, password=None)) if parsed.userinfo else url
