"""
The reference server's configuration: environment variables (``OFFLOAD_SERVER_*``), validated by pydantic-settings.

Everything a deployment changes is here: where results go (a directory, or S3 with its endpoint and credentials),
which bearer tokens map to which tenants (inline JSON or a JSON file), and which model answers (the built-in scripted
one, or any OpenAI-compatible endpoint). Invalid values fail at start-up with a message naming the setting, and
`ServerSettings.check_model` asks an OpenAI-compatible endpoint once whether it can serve before ``serve`` starts
(`ServerSettings.check_store`: whether the store refuses a second exclusive create).
"""

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from fsspec.core import split_protocol
from haystack.utils import Secret
from pydantic import Field, SecretStr, TypeAdapter, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from haystack_integrations.offload.approvals import DEFAULT_RESUME_LEASE
from haystack_integrations.offload.stores import (
    MIN_MASTER_SECRET_CHARACTERS,
    AssumeRoleCredentials,
    FsspecToolResultStore,
    Quota,
    TenantKeys,
    check_region,
    validate_scope_id,
    with_s3_choices,
    with_timeouts,
)
from offload_haystack_app.demo.scripted_model import (
    SCRIPTED_CONTEXT_WINDOW,
    SCRIPTED_MODEL_LABEL,
    scripted_generator,
)
from offload_haystack_app.server.model_check import DEFAULT_CHECK_TIMEOUT, check_openai_endpoint
from offload_haystack_app.server.startup import require_exclusive_creates

DEFAULT_SERVER_STORE = "./offload-server-results"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
MIN_TOKEN_LENGTH = 16
# What engine="obstore" serves (the store refuses the rest too, but only once the app is built).
_OBSTORE_PROTOCOLS = frozenset({"s3", "s3a", "az", "abfs", "abfss"})
_MASTER_KEY_VARIABLE = "OFFLOAD_SERVER_S3_SSE_C_MASTER_KEY"
DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant with tools. Large tool results are stored outside the conversation and replaced by "
    "a pointer like \"Tool result offloaded to ... at '<reference>'\": call read_tool_result with that reference to "
    "read it (page by page, or with a search), and list_tool_results to see what is stored. send_invoice needs a "
    "person's approval; if it is denied, say so and do not retry."
)


class ServerSettings(BaseSettings):
    """
    Settings of ``offload-haystack serve``, read from ``OFFLOAD_SERVER_*`` environment variables or given directly.

    ```python
    from offload_haystack_app.server import ServerSettings

    settings = ServerSettings(
        store="s3://acme-agent-results/prod",
        s3_endpoint_url="http://127.0.0.1:5000",
        tokens={"a-long-random-token-for-acme": "acme"},
    )
    ```

    The same from the environment: ``OFFLOAD_SERVER_STORE=s3://acme-agent-results/prod``,
    ``OFFLOAD_SERVER_TOKENS='{"a-long-random-token-for-acme": "acme"}'`` (or ``OFFLOAD_SERVER_TOKENS_FILE=tokens.json``
    holding the same JSON object), ``OFFLOAD_SERVER_MODEL=openai`` with ``OFFLOAD_SERVER_OPENAI_BASE_URL``,
    ``OFFLOAD_SERVER_OPENAI_MODEL`` and ``OFFLOAD_SERVER_OPENAI_API_KEY`` (or ``OPENAI_API_KEY``);
    ``OFFLOAD_SERVER_ENGINE=fsspec`` to keep S3 on s3fs (the default, ``auto``, takes obstore where it can);
    ``OFFLOAD_SERVER_RESUME_LEASE=60`` for the lease, in seconds, of a worker's claim on a held step it resumes;
    ``OFFLOAD_SERVER_QUOTA='{"session_results": 500}'`` for the store's `Quota`; ``OFFLOAD_SERVER_METRICS_PORT=9464``
    (with ``_METRICS_HOST``, ``_METRICS_TOKEN`` and ``_METRICS_TENANTS=acme,globex``) for each worker's ``/metrics``.

    Multi-user use: a token names exactly one tenant, taken from this table and never from a request; several tokens
    may name the same tenant (one per user or per client).
    """

    model_config = SettingsConfigDict(env_prefix="OFFLOAD_SERVER_", extra="forbid", validate_default=True)

    store: str = Field(default=DEFAULT_SERVER_STORE, description="Root URL of the results store (directory or s3://).")
    engine: Literal["auto", "fsspec", "obstore"] = Field(
        default="auto",
        description="The store's engine: auto (obstore for s3:// and az:// where it can), fsspec, or obstore.",
    )
    storage_options: dict[str, Any] = Field(default_factory=dict, description="fsspec options for the store, as JSON.")
    s3_endpoint_url: str | None = Field(default=None, description="S3 endpoint (MinIO, moto, a VPC endpoint).")
    s3_access_key_id: SecretStr | None = None
    s3_secret_access_key: SecretStr | None = None
    s3_region: str | None = None
    s3_connect_timeout: float | None = Field(
        default=None, gt=0, description="Seconds to open a connection to S3; None: the store's default (5 s)."
    )
    s3_read_timeout: float | None = Field(
        default=None,
        gt=0,
        description="Seconds an S3 answer may stay silent; None: the store's default (15 s). On the obstore engine it "
        "also bounds sending one request's body (16 MiB at most).",
    )
    s3_tenant_role_arn: str | None = Field(
        default=None,
        description="A role the server's credentials assume per tenant (STS), each tenant's limited to its prefix; "
        "None: every tenant's requests sign with the server's own credentials.",
    )
    s3_sts_endpoint_url: str | None = Field(
        default=None, description="The STS endpoint for s3_tenant_role_arn; None: the S3 endpoint, else AWS's."
    )
    s3_tenant_tag: str | None = Field(
        default=None,
        description="A session tag key carrying the tenant id in each tenant's STS session, for ABAC role policies "
        "(aws:PrincipalTag); None: no tags.",
    )
    s3_sse_c_master_key: SecretStr | None = Field(
        default=None,
        description="A master secret (32 characters or more) each tenant's SSE-C key is derived from; None: no keys "
        "per tenant. Every replica needs the same one: without it, nothing written under it can be read.",
    )
    drain_seconds: float = Field(
        default=30.0,
        ge=0,
        description="On SIGTERM: how long a worker lets its requests and turns run on before stopping them.",
    )
    tokens: dict[str, str] = Field(default_factory=dict, repr=False, description="Bearer token -> tenant id.")
    tokens_file: Path | None = Field(default=None, description="A JSON file holding more 'token: tenant' pairs.")
    model: Literal["scripted", "openai"] = "scripted"
    openai_base_url: str | None = Field(default=None, description="An OpenAI-compatible endpoint; None: OpenAI's.")
    openai_model: str = "gpt-4o-mini"
    openai_api_key: SecretStr | None = Field(default=None, description="Falls back to the OPENAI_API_KEY variable.")
    openai_check_timeout: float = Field(
        default=DEFAULT_CHECK_TIMEOUT, ge=0, description="Seconds for the start-up check of the endpoint; 0 skips it."
    )
    offload_over_chars: int = Field(default=4000, ge=1, description="Offload tool results longer than this.")
    context_window: int | None = Field(default=None, ge=256, description="Tokens; default 6,000 scripted, 128,000.")
    approval_ttl: float = Field(default=24 * 3600.0, gt=0, description="Seconds an approval request stays open.")
    turn_lease: float = Field(default=300.0, gt=0, description="Seconds before a stuck turn may be abandoned.")
    resume_lease: float = Field(
        default=DEFAULT_RESUME_LEASE,
        gt=0,
        description="Seconds a resuming worker's claim on a held step lasts unrenewed (renewed while it works).",
    )
    system_prompt: str | None = Field(default=None, description="Default: a prompt explaining the read-back tools.")
    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES, ge=1024, description="Larger request bodies are refused (413) unread."
    )
    scripted_tool_delay: float = Field(
        default=0.0,
        ge=0,
        le=60,
        description="Seconds each scripted demo tool takes (the scripted model only), to watch a turn's progress live.",
    )
    quota: Quota | None = Field(
        default=None, description="Limits on what each session and tenant may store, as JSON (see Quota); none: none."
    )
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="The first of the workers' GET /metrics ports (one per worker, from this one); None: no metrics.",
    )
    metrics_host: str = Field(default="127.0.0.1", description="The interface the metrics ports listen on.")
    metrics_token: SecretStr | None = Field(
        default=None, description="When set, a scrape must send 'Authorization: Bearer <token>' (never a tenant's)."
    )
    metrics_tenants: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Tenants whose series carry their id (offload_tenant), comma separated; keep it a small set.",
    )

    @field_validator("store")
    @classmethod
    def _store_has_a_path(cls, value: str) -> str:
        protocol, path = split_protocol(value)
        if not path.strip("/"):
            raise ValueError(f"the store URL {value!r} has no path: give a directory or s3://bucket/prefix")
        if protocol not in (None, "file", "local", "memory", "s3", "s3a"):
            # Other fsspec protocols work too; this only catches typos like "s4://" early, with a clear message.
            try:
                import fsspec

                fsspec.get_filesystem_class(protocol)
            except (ImportError, ValueError) as error:
                raise ValueError(f"unknown or unavailable storage protocol {protocol!r}: {error}") from error
        return value

    @field_validator("s3_region")
    @classmethod
    def _is_a_region(cls, value: str | None) -> str | None:
        if value:  # the same rule as the store's and the CLI's, named by its variable
            check_region(value, "OFFLOAD_SERVER_S3_REGION")
        return value

    @field_validator("s3_sse_c_master_key")
    @classmethod
    def _is_a_master_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_MASTER_SECRET_CHARACTERS:
            raise ValueError(f"{_MASTER_KEY_VARIABLE} must be at least {MIN_MASTER_SECRET_CHARACTERS} characters")
        return value

    @model_validator(mode="after")
    def _keys_need_s3(self) -> "ServerSettings":
        if self.s3_sse_c_master_key is not None and split_protocol(self.store)[0] not in {"s3", "s3a"}:
            raise ValueError(
                f"{_MASTER_KEY_VARIABLE} (SSE-C) applies to s3:// stores only, and {self.store!r} is not one"
            )
        return self

    @model_validator(mode="after")
    def _engine_serves_the_store(self) -> "ServerSettings":
        # The store would refuse it too, but only when the app is built: say it at start-up, naming the setting.
        if self.engine == "obstore" and split_protocol(self.store)[0] not in _OBSTORE_PROTOCOLS:
            raise ValueError(
                f"engine 'obstore' serves s3:// stores only (and Azure's az://, abfs://), and {self.store!r} is not one"
            )
        return self

    @field_validator("tokens")
    @classmethod
    def _valid_tokens(cls, tokens: dict[str, str]) -> dict[str, str]:
        for token, tenant in tokens.items():
            _check_token(token)
            validate_scope_id(tenant, field="tenant")
        return tokens

    @field_validator("metrics_tenants", mode="before")
    @classmethod
    def _comma_separated_tenants(cls, value: Any) -> Any:
        # The variable is a comma-separated list (OFFLOAD_SERVER_METRICS_TENANTS=acme,globex), as an operator writes it.
        if isinstance(value, str):
            return [tenant.strip() for tenant in value.split(",") if tenant.strip()]
        return value

    @field_validator("metrics_tenants")
    @classmethod
    def _valid_metrics_tenants(cls, tenants: list[str]) -> list[str]:
        for tenant in tenants:
            validate_scope_id(tenant, field="tenant")
        return tenants

    @field_validator("metrics_token")
    @classmethod
    def _valid_metrics_token(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None:
            _check_token(token.get_secret_value())
        return token

    @model_validator(mode="after")
    def _merge_tokens_file_and_check_model(self) -> "ServerSettings":
        if self.tokens_file is not None:
            try:
                loaded = TypeAdapter(dict[str, str]).validate_json(self.tokens_file.read_bytes())
            except OSError as error:
                raise ValueError(f"tokens_file {str(self.tokens_file)!r} cannot be read: {error.strerror}") from error
            except ValidationError as error:
                raise ValueError(
                    f"tokens_file {str(self.tokens_file)!r} must hold a JSON object of token -> tenant strings"
                ) from error
            for token, tenant in self._valid_tokens(loaded).items():
                if self.tokens.get(token, tenant) != tenant:
                    raise ValueError("a token in tokens_file maps to another tenant than in tokens")
                self.tokens[token] = tenant
        if self.model == "openai" and self.openai_api_key is None and not os.environ.get("OPENAI_API_KEY"):
            raise ValueError(
                "model 'openai' needs an API key: set OFFLOAD_SERVER_OPENAI_API_KEY or OPENAI_API_KEY "
                "(any value for endpoints that do not check it)"
            )
        return self

    @model_validator(mode="after")
    def _metrics_token_is_no_tenants(self) -> "ServerSettings":
        # After the tokens file is merged: with a tenant's token as the scrape token, that tenant reads every tenant's
        # figures.
        if self.metrics_token is not None and self.metrics_token.get_secret_value() in self.tokens:
            raise ValueError("metrics_token must not be a tenant's token: give the scrape a token of its own")
        return self

    # What the app builds from the settings

    @property
    def scripted(self) -> bool:
        """Whether the built-in scripted model answers (no LLM is called)."""
        return self.model == "scripted"

    def model_label(self) -> str:
        """
        How the page and the logs name the model.

        :returns: The scripted label, or the model name and endpoint.
        """
        if self.scripted:
            return SCRIPTED_MODEL_LABEL
        return f"{self.openai_model} at {self.openai_base_url or 'https://api.openai.com/v1'}"

    def resolved_context_window(self) -> int:
        """
        The context window compaction works against.

        :returns: The configured window, or the scripted model's small one, or 128,000.
        """
        if self.context_window is not None:
            return self.context_window
        return SCRIPTED_CONTEXT_WINDOW if self.scripted else 128_000

    def resolved_system_prompt(self) -> str | None:
        """
        The system prompt for new sessions.

        :returns: The configured prompt; by default one explaining the read-back tools (none for the scripted model).
        """
        if self.system_prompt is not None:
            return self.system_prompt or None
        return None if self.scripted else DEFAULT_SYSTEM_PROMPT

    def chat_generator(self) -> Any:
        """
        Build the chat generator (no network I/O: clients connect on first use).

        :returns: The scripted `MockChatGenerator`, or an `OpenAIChatGenerator` for the configured endpoint.
        """
        if self.scripted:
            return scripted_generator()
        from haystack.components.generators.chat import OpenAIChatGenerator

        key = (
            Secret.from_token(self.openai_api_key.get_secret_value())
            if self.openai_api_key is not None
            else Secret.from_env_var("OPENAI_API_KEY")
        )
        return OpenAIChatGenerator(api_key=key, model=self.openai_model, api_base_url=self.openai_base_url)

    def check_model(self) -> None:
        """
        Check, once at start-up, that the configured model can answer: for ``model=openai``, one request to the
        endpoint's ``/models`` (see `check_openai_endpoint`); nothing for the scripted model, or with
        `openai_check_timeout` 0.

        :raises ModelEndpointError: In one line, if the endpoint is unreachable, refuses the key, or does not list the
            model.
        """
        if self.scripted or self.openai_check_timeout == 0:
            return
        key = self.openai_api_key.get_secret_value() if self.openai_api_key else os.environ.get("OPENAI_API_KEY", "")
        check_openai_endpoint(
            self.openai_base_url, api_key=key, model=self.openai_model, timeout=self.openai_check_timeout
        )

    def results_store(self) -> FsspecToolResultStore:
        """
        Build the server's root store (no network I/O: the client connects on first use).

        :returns: The store at `store`, with `engine`, `quota` and the resolved storage options.
        """
        credentials = None
        if self.s3_tenant_role_arn:
            credentials = AssumeRoleCredentials(
                self.s3_tenant_role_arn, sts_endpoint_url=self.s3_sts_endpoint_url, tenant_tag=self.s3_tenant_tag
            )
        return FsspecToolResultStore(
            self.store,
            storage_options=self.resolved_storage_options(),
            engine=self.engine,
            quota=self.quota,
            credentials=credentials,
            encryption=self._tenant_keys(),
        )

    def _tenant_keys(self) -> TenantKeys | None:
        if self.s3_sse_c_master_key is None:
            return None
        value = self.s3_sse_c_master_key.get_secret_value()
        # By name when it came from the environment, so the store serializes without the secret in it.
        from_environment = os.environ.get(_MASTER_KEY_VARIABLE) == value
        return TenantKeys(Secret.from_env_var(_MASTER_KEY_VARIABLE) if from_environment else Secret.from_token(value))

    def check_store(self) -> None:
        """
        Check, once at start-up, that the store refuses a second exclusive create (S3 ``If-None-Match: *``), as the
        server's turns and approvals need; an "unknown" answer (a transient failure) is asked again a few times.

        :raises ServerStartupError: In one line, if the store ignores or refuses exclusive creates, or the check could
            not tell.
        :raises StoragePermissionError: If the check's probe may not be written.
        """
        require_exclusive_creates(self.results_store())

    def resolved_storage_options(self) -> dict[str, Any]:
        """
        The store's fsspec options: `storage_options` plus the ``s3_*`` settings for S3 URLs.

        :returns: A new dictionary.
        """
        if split_protocol(self.store)[0] not in {"s3", "s3a"}:
            return dict(self.storage_options)
        credentials = (self.s3_access_key_id, self.s3_secret_access_key)
        key, secret = (value.get_secret_value() if value else None for value in credentials)
        chosen = with_s3_choices(
            self.storage_options,
            endpoint_url=self.s3_endpoint_url or None,
            region=self.s3_region or None,
            key=key,
            secret=secret,
        )
        return with_timeouts(chosen, connect_timeout=self.s3_connect_timeout, read_timeout=self.s3_read_timeout)

    def environment(self) -> dict[str, str]:
        """
        These settings as ``OFFLOAD_SERVER_*`` variables, for worker processes that read them back.

        :returns: The variables (secrets included: pass them to child processes only).
        """
        variables: dict[str, str] = {}
        for name, value in self.model_dump(exclude_none=True).items():
            if name == "tokens_file":
                continue  # its tokens are already merged into `tokens`
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if isinstance(value, dict):
                value = json.dumps(value)
            elif isinstance(value, list):
                value = ",".join(value)  # the comma-separated form the variable is read in
            variables[f"OFFLOAD_SERVER_{name.upper()}"] = str(value)
        return variables


def _check_token(token: str) -> None:
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"every token must be at least {MIN_TOKEN_LENGTH} characters long (use a random one)")
    if any(character.isspace() or not character.isprintable() for character in token):
        raise ValueError("tokens must not contain spaces or control characters")
