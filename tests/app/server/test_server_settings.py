"""`ServerSettings` (pydantic-settings) and `TokenTable`: configuration from the environment, validated at start-up."""

import json
from pathlib import Path

import pytest
from haystack.components.generators.chat import MockChatGenerator, OpenAIChatGenerator
from haystack.utils import Secret
from pydantic import ValidationError

from haystack_integrations.offload import FsspecToolResultStore, RetryPolicy, StorageUnavailableError
from offload_haystack_app.server import ServerSettings, TokenTable, create_app
from support.silent_endpoint import SilentEndpoint

TOKEN = "a-long-enough-token-0001"  # noqa: S105 - a test token, never used against a real service


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("OFFLOAD_SERVER_") or name == "OPENAI_API_KEY":
            monkeypatch.delenv(name)


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OFFLOAD_SERVER_STORE", "s3://acme-results/prod")
    monkeypatch.setenv("OFFLOAD_SERVER_TOKENS", json.dumps({TOKEN: "acme"}))
    monkeypatch.setenv("OFFLOAD_SERVER_S3_ENDPOINT_URL", "http://127.0.0.1:9000")
    monkeypatch.setenv("OFFLOAD_SERVER_S3_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("OFFLOAD_SERVER_S3_SECRET_ACCESS_KEY", "secret-example")
    monkeypatch.setenv("OFFLOAD_SERVER_S3_REGION", "eu-west-1")
    monkeypatch.setenv("OFFLOAD_SERVER_STORAGE_OPTIONS", json.dumps({"config_kwargs": {"max_pool_connections": 64}}))
    settings = ServerSettings()
    assert settings.tokens == {TOKEN: "acme"}
    assert settings.resolved_storage_options() == {
        "config_kwargs": {"max_pool_connections": 64},
        "endpoint_url": "http://127.0.0.1:9000",
        "key": "AKIDEXAMPLE",
        "secret": "secret-example",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    assert TOKEN not in repr(settings) and "secret-example" not in repr(settings)
    # Worker processes rebuild the same settings from the variables the parent exports.
    monkeypatch.delenv("OFFLOAD_SERVER_TOKENS")
    for name, value in settings.environment().items():
        monkeypatch.setenv(name, value)
    rebuilt = ServerSettings()
    assert rebuilt.tokens == settings.tokens
    assert rebuilt.resolved_storage_options() == settings.resolved_storage_options()


def test_a_region_setting_is_checked_as_the_store_and_the_cli_check_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_SERVER_STORE", "s3://acme-results/prod")
    monkeypatch.setenv("OFFLOAD_SERVER_S3_REGION", "bad region")
    with pytest.raises(ValidationError, match=r"OFFLOAD_SERVER_S3_REGION is not a region name \(such as eu-west-1\)"):
        ServerSettings()


def test_tokens_file_adds_tokens_and_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"globex-token-0000000001": "globex", "globex-token-0000000002": "globex"}))
    settings = ServerSettings(tokens={TOKEN: "acme"}, tokens_file=path)
    assert TokenTable(settings.tokens).tenants() == {"acme", "globex"}

    path.write_text(json.dumps({TOKEN: "globex"}))
    with pytest.raises(ValidationError, match="another tenant"):
        ServerSettings(tokens={TOKEN: "acme"}, tokens_file=path)
    path.write_text("[1, 2]")
    with pytest.raises(ValidationError, match="JSON object of token -> tenant"):
        ServerSettings(tokens_file=path)
    with pytest.raises(ValidationError, match="cannot be read"):
        ServerSettings(tokens_file=tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ({"short": "acme"}, "at least 16 characters"),
        ({"a token with spaces 123": "acme"}, "spaces"),
        ({TOKEN: "../globex"}, "tenant id"),
        ({TOKEN: ""}, "tenant id must not be empty"),
    ],
)
def test_bad_tokens_and_tenants_are_refused(tokens: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ServerSettings(tokens=tokens)


@pytest.mark.parametrize(("store", "message"), [("s3://", "has no path"), ("s4://bucket/x", "s4")])
def test_bad_store_urls_are_refused(store: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ServerSettings(store=store, tokens={TOKEN: "acme"})


def test_the_scripted_model_is_the_default_and_says_so() -> None:
    settings = ServerSettings(tokens={TOKEN: "acme"})
    assert settings.scripted and "scripted" in settings.model_label()
    assert isinstance(settings.chat_generator(), MockChatGenerator)
    assert settings.resolved_system_prompt() is None


def test_an_openai_compatible_model_needs_a_key_and_is_built_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="needs an API key"):
        ServerSettings(tokens={TOKEN: "acme"}, model="openai")
    settings = ServerSettings(
        tokens={TOKEN: "acme"},
        model="openai",
        openai_base_url="http://127.0.0.1:11434/v1",
        openai_model="llama3.1",
        openai_api_key="sk-local",
    )
    generator = settings.chat_generator()
    assert isinstance(generator, OpenAIChatGenerator)
    assert (generator.model, generator.api_base_url) == ("llama3.1", "http://127.0.0.1:11434/v1")
    assert settings.model_label() == "llama3.1 at http://127.0.0.1:11434/v1"
    assert settings.resolved_context_window() == 128_000
    assert "read_tool_result" in (settings.resolved_system_prompt() or "")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    assert isinstance(ServerSettings(tokens={TOKEN: "acme"}, model="openai").chat_generator(), OpenAIChatGenerator)


def test_the_app_refuses_to_start_without_tokens() -> None:
    with pytest.raises(ValueError, match="No bearer tokens"):
        create_app(ServerSettings(store="memory://no-tokens"))


def test_token_table_maps_bearer_headers_to_callers() -> None:
    table = TokenTable({TOKEN: "acme"})
    caller = table.caller(f"Bearer {TOKEN}")
    assert caller is not None and caller.tenant == "acme" and TOKEN not in caller.actor
    assert table.caller(f"bearer   {TOKEN}  ") == caller
    for header in (None, "", "Bearer", f"Token {TOKEN}", f"Bearer {TOKEN.upper()}", TOKEN):
        assert table.caller(header) is None


def test_the_engine_and_the_resume_lease_come_from_the_environment_and_serialize(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    defaults = ServerSettings(tokens={TOKEN: "acme"})
    assert (defaults.engine, defaults.resume_lease) == ("auto", 120.0)
    monkeypatch.setenv("OFFLOAD_SERVER_STORE", "s3://acme-results/prod")
    monkeypatch.setenv("OFFLOAD_SERVER_ENGINE", "obstore")
    monkeypatch.setenv("OFFLOAD_SERVER_RESUME_LEASE", "45.5")
    settings = ServerSettings(tokens={TOKEN: "acme"})
    assert (settings.engine, settings.resume_lease) == ("obstore", 45.5)
    exported = settings.environment()
    assert exported["OFFLOAD_SERVER_ENGINE"] == "obstore"
    assert exported["OFFLOAD_SERVER_RESUME_LEASE"] == "45.5"
    for name in ("OFFLOAD_SERVER_ENGINE", "OFFLOAD_SERVER_RESUME_LEASE"):
        monkeypatch.delenv(name)
    for name, value in exported.items():
        monkeypatch.setenv(name, value)
    rebuilt = ServerSettings()
    assert (rebuilt.engine, rebuilt.resume_lease) == ("obstore", 45.5)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"resume_lease": 0}, "resume_lease"),
        ({"resume_lease": -1}, "resume_lease"),
        ({"engine": "boto"}, "engine"),
        ({"engine": "obstore", "store": "memory://results"}, "serves s3:// stores only"),
    ],
)
def test_bad_engines_and_resume_leases_are_refused(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ServerSettings(tokens={TOKEN: "acme"}, **values)


@pytest.mark.parametrize("store", ["az://results/prod", "abfs://results/prod", "s3://bucket/prod"])
def test_the_obstore_engine_is_a_setting_for_azure_as_for_s3(store: str) -> None:
    # obstore serves Azure Blob Storage too: the settings no longer refuse it there.
    assert ServerSettings(tokens={TOKEN: "acme"}, engine="obstore", store=store).engine == "obstore"


def test_the_app_passes_the_engine_and_the_resume_lease_on(tmp_path: Path) -> None:
    settings = ServerSettings(store=str(tmp_path / "results"), tokens={TOKEN: "acme"}, resume_lease=7.0)
    app = create_app(settings)
    assert (app.state.root.engine, app.state.root.resolved_engine) == ("auto", "fsspec")  # a directory
    assert app.state.service.resume_lease == 7.0


def test_the_s3_timeouts_are_settings_the_store_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_SERVER_S3_CONNECT_TIMEOUT", "2")
    monkeypatch.setenv("OFFLOAD_SERVER_S3_READ_TIMEOUT", "0.5")
    with SilentEndpoint() as silent:
        settings = ServerSettings(store="s3://bucket/prod", s3_endpoint_url=silent.url, s3_region="us-east-1")
        options = {**settings.resolved_storage_options(), "key": "k", "secret": "s"}
        # Counted in attempts, not wall time (see tests/stores/test_timeouts_and_location.py): no attempt starts past
        # the deadline, which a 0.5 s read timeout leaves room for twice over and the default 15 s does not.
        policy = RetryPolicy(attempts=2, base_delay=0, max_delay=0, deadline=10, attempt_timeout=20)
        store = FsspecToolResultStore(settings.store, storage_options=options, retry=policy)
        with pytest.raises(StorageUnavailableError) as raised:
            store.list()
    assert raised.value.attempts == 2
    with pytest.raises(ValidationError, match="s3_read_timeout"):
        ServerSettings(store="s3://bucket/prod", s3_read_timeout=0)


def test_a_master_key_gives_the_store_a_key_per_tenant_serialized_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from haystack_integrations.offload.stores import TenantKeys

    master = "a master secret for these tests, 40 chars"
    monkeypatch.setenv("OFFLOAD_SERVER_STORE", "s3://bucket/prod")
    monkeypatch.setenv("OFFLOAD_SERVER_S3_SSE_C_MASTER_KEY", master)
    store = ServerSettings().results_store()
    assert isinstance(store.encryption, TenantKeys)
    assert store.encryption.key_for("acme") == TenantKeys(Secret.from_token(master)).key_for("acme")
    assert master not in json.dumps(store.to_dict())
    assert master not in repr(ServerSettings())
    with pytest.raises(ValidationError, match="at least 32 characters"):
        ServerSettings(store="s3://bucket/prod", s3_sse_c_master_key="short")
    with pytest.raises(ValidationError, match="s3:// stores only"):
        ServerSettings(store="./results", s3_sse_c_master_key=master)
