"""
Storage options and store URLs without credentials in clear: serialized, shown (`redacted_url`), and checked.

Credentials may be given as Haystack `Secret`s anywhere in the options (``{"key": Secret.from_env_var(...)}``); they
are resolved only when the filesystem is created and serialized as references to environment variables. A plain
string under a credential-like name refuses to serialize, with an error that says what to do instead. Leaving
credentials out entirely (environment, instance profile, ``AWS_PROFILE``) is the recommended setup.
"""

import ipaddress
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from haystack.core.errors import SerializationError
from haystack.utils import Secret

# Names fsspec backends use for credentials (s3fs, botocore, gcsfs, adlfs and friends).
_CREDENTIAL_NAMES = frozenset(
    {
        "key",
        "secret",
        "token",
        "password",
        "session_token",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "sas_token",
        "account_key",
        "connection_string",
        "client_secret",
        "credentials",
    }
)
# A query parameter whose name says it carries a credential (``secret``, ``X-Amz-Signature``, ``sas_token`` ...).
_CREDENTIAL_PARAMETER = re.compile(r"key|secret|token|password|signature|credential|sig$", re.IGNORECASE)
_HIDDEN = "***"
# The AWS SDKs' endpoint variables, the service-specific one first (what obstore and botocore read).
# Seconds: to open a connection, and that an answer may stay silent (on the obstore engine this also bounds sending one
# request's body: a 16 MiB PUT needs about 1.1 MB/s). botocore's own defaults are 60 s each, which made a silent
# endpoint cost a minute per attempt.
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 15.0
_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_REGION_VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")
# botocore's own rule for region names, checked so a bad one is named before any connection is tried.
_REGION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?")


def redacted_url(url: str) -> str:
    """
    A store URL fit to print or log: credentials in its user part or its query string replaced by ``***``.

    ``s3://AKID:SECRET@bucket/prod?secret=x&region=eu`` becomes ``s3://***:***@bucket/prod?secret=***&region=eu``.

    :param url: A store URL or a local path.
    :returns: The URL with every credential hidden; a URL without any, unchanged.
    """
    if "://" not in url:
        return url
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = f"{_HIDDEN}:{_HIDDEN}@{host}" if ":" in user else f"{_HIDDEN}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = "&".join(
            f"{quote(name, safe='')}={_HIDDEN if _hides(name) else quote(value, safe='')}" for name, value in pairs
        )
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def check_endpoint_url(value: object, source: str) -> None:
    """
    Refuse an S3 endpoint that is not an ``http://`` or ``https://`` URL, in one line naming where it was given.

    :param value: The endpoint as given (a `Secret` is left to its backend).
    :param source: Where it was given, for the message: a flag, a variable or ``storage_options['endpoint_url']``.
    :raises ValueError: If it has no such scheme or no host (``127.0.0.1:9000``, ``ftp://host``).
    """
    if isinstance(value, Secret):
        return
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{source} must be an http:// or https:// URL, got {value!r}.")


def require_tls(url: str, *, sends: str) -> None:
    """
    Refuse an endpoint that would carry secrets in the clear to another machine: not https://, and not ``localhost``
    or a loopback address (an emulator, a proxy on this machine).

    :param url: The endpoint (a scheme is required).
    :param sends: What it would carry, opening the message ("encryption= sends each tenant's key in its requests").
    :raises ValueError: If the endpoint is plain http:// (or another scheme) on another host.
    """
    parts = urlsplit(url)
    if parts.scheme == "https" or on_this_machine(parts.hostname or ""):
        return
    raise ValueError(
        f"{sends}: the endpoint {parts.scheme}://{parts.hostname} must be https:// (plain http:// only on this "
        "machine, for an emulator)."
    )


def on_this_machine(host: str) -> bool:
    """Whether `host` is ``localhost`` or a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_region(value: object, source: str) -> None:
    """
    Refuse a region that is not a region name, in one line naming where it was given.

    :param value: The region as given.
    :param source: Where it was given, for the message: a flag, a variable or a setting.
    :raises ValueError: If it is not letters, digits and inner hyphens (``eu-west-1``; not ``bad region``).
    """
    if not isinstance(value, str) or not _REGION.fullmatch(value):
        raise ValueError(f"{source} is not a region name (such as eu-west-1): {value!r}.")


def check_s3_options(storage_options: Mapping[str, Any], environment: Mapping[str, str]) -> None:
    """
    Check the endpoints and region an S3 store would use: the storage options' (s3fs's places), else AWS variables'.

    :param storage_options: The store's storage options.
    :param environment: The process environment (`os.environ`).
    :raises ValueError: For the first endpoint that is not an ``http://`` or ``https://`` URL, or a region that is not
        a region name.
    """
    client_kwargs = storage_options.get("client_kwargs")
    client_kwargs = client_kwargs if isinstance(client_kwargs, Mapping) else {}
    given: dict[str, object] = {
        "storage_options['endpoint_url']": storage_options.get("endpoint_url"),
        "storage_options['client_kwargs']['endpoint_url']": client_kwargs.get("endpoint_url"),
    }
    for source, value in _given_or_variable(given, _ENDPOINT_VARIABLES, environment).items():
        check_endpoint_url(value, source)
    region = {"storage_options['client_kwargs']['region_name']": client_kwargs.get("region_name")}
    for source, value in _given_or_variable(region, _REGION_VARIABLES, environment).items():
        check_region(value, source)


def _given_or_variable(
    given: dict[str, object], variables: tuple[str, ...], environment: Mapping[str, str]
) -> dict[str, object]:
    # What the options set wins; only where they set nothing does the first AWS variable set apply.
    present = {source: value for source, value in given.items() if value is not None}
    if present:
        return present
    variable = next((name for name in variables if environment.get(name)), None)
    return {variable: environment[variable]} if variable else {}


def with_s3_choices(
    options: Mapping[str, Any],
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    profile: str | None = None,
    key: str | None = None,
    secret: str | None = None,
) -> dict[str, Any]:
    """
    s3fs storage options with S3 choices put where s3fs takes them (the region into ``client_kwargs``), over `options`.

    :param options: The storage options given.
    :param endpoint_url: The endpoint, if chosen.
    :param region: The bucket's region, if chosen.
    :param profile: The AWS profile, if chosen.
    :param key: The access key id, if given.
    :param secret: The secret access key, if given.
    :returns: A new dictionary; a choice left None leaves the option as it was.
    """
    chosen = {"endpoint_url": endpoint_url, "profile": profile, "key": key, "secret": secret}
    merged = {**options, **{name: value for name, value in chosen.items() if value is not None}}
    if region is not None:
        merged["client_kwargs"] = {**(options.get("client_kwargs") or {}), "region_name": region}
    return merged


def with_timeouts(
    options: Mapping[str, Any], *, connect_timeout: float | None = None, read_timeout: float | None = None
) -> dict[str, Any]:
    """
    S3 storage options with timeouts where both engines take them (``config_kwargs``, as botocore's), over `options`.

    :param options: The storage options given.
    :param connect_timeout: Seconds to open a connection, if chosen.
    :param read_timeout: Seconds an answer may stay silent, if chosen.
    :returns: A new dictionary; a timeout left None stays as it was (`DEFAULT_CONNECT_TIMEOUT`,
        `DEFAULT_READ_TIMEOUT` where nothing sets one).
    """
    chosen = {"connect_timeout": connect_timeout, "read_timeout": read_timeout}
    given = {name: value for name, value in chosen.items() if value is not None}
    if not given:
        return dict(options)
    return {**options, "config_kwargs": {**(options.get("config_kwargs") or {}), **given}}


def with_default_timeouts(options: Mapping[str, Any]) -> dict[str, Any]:
    """
    S3 storage options with `DEFAULT_CONNECT_TIMEOUT` and `DEFAULT_READ_TIMEOUT` where ``config_kwargs`` sets none.

    :param options: s3fs storage options (secrets resolved or not).
    :returns: A new dictionary.
    """
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
    config.setdefault("read_timeout", DEFAULT_READ_TIMEOUT)
    return {**options, "config_kwargs": config}


def _hides(name: str) -> bool:
    return name.lower() in _CREDENTIAL_NAMES or _CREDENTIAL_PARAMETER.search(name) is not None


def resolve_secrets(options: Mapping[str, Any]) -> dict[str, Any]:
    """
    Return a copy of `options` with every `Secret` replaced by its value, at any depth.

    :param options: fsspec storage options.
    :returns: Options ready to pass to an fsspec filesystem.
    """
    return {name: _resolve(value) for name, value in options.items()}


def _resolve(value: Any) -> Any:
    if isinstance(value, Secret):
        return value.resolve_value()
    if isinstance(value, Mapping):
        return resolve_secrets(value)
    if isinstance(value, list | tuple):
        return type(value)(_resolve(item) for item in value)
    return value


def serialize_options(options: Mapping[str, Any], *, path: str = "storage_options") -> dict[str, Any]:
    """
    Serialize storage options, turning `Secret`s into their dictionaries.

    :param options: fsspec storage options.
    :param path: Where these options sit, for error messages.
    :returns: A JSON-friendly dictionary.
    :raises SerializationError: If a credential is given in clear.
    """
    serialized: dict[str, Any] = {}
    for name, value in options.items():
        where = f"{path}[{name!r}]"
        if isinstance(value, Secret):
            serialized[name] = value.to_dict()
        elif isinstance(value, Mapping):
            serialized[name] = serialize_options(value, path=where)
        elif name.lower() in _CREDENTIAL_NAMES and value is not None:
            raise SerializationError(
                f"{where} holds a credential in clear, which would be written into the serialized store. Pass it as "
                f"Secret.from_env_var('...') instead, or leave it out and let the backend read its environment."
            )
        else:
            serialized[name] = value
    return serialized


def deserialize_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """
    Reverse `serialize_options`: dictionaries in Haystack's `Secret` form become `Secret`s again.

    :param options: Serialized storage options.
    :returns: Storage options with `Secret`s.
    """
    restored: dict[str, Any] = {}
    for name, value in options.items():
        if isinstance(value, Mapping) and value.get("type") in {"env_var", "token"} and "env_vars" in value:
            restored[name] = Secret.from_dict(dict(value))
        elif isinstance(value, Mapping):
            restored[name] = deserialize_options(value)
        else:
            restored[name] = value
    return restored
