"""
Serialization of fsspec `storage_options` without credentials in clear.

Credentials may be given as Haystack `Secret`s anywhere in the options (``{"key": Secret.from_env_var(...)}``); they
are resolved only when the filesystem is created and serialized as references to environment variables. A plain
string under a credential-like name refuses to serialize, with an error that says what to do instead. Leaving
credentials out entirely (environment, instance profile, ``AWS_PROFILE``) is the recommended setup.
"""

from collections.abc import Mapping
from typing import Any

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
