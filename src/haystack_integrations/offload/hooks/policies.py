"""
Whether a tool's result is offloaded: per-tool `OffloadPolicy` lookup, validation and serialization.

The mapping has the shape of Haystack's `ToolResultOffloadHook.offload_strategies`: a key is a tool name, a tuple of
tool names sharing one policy, or the wildcard ``"*"``; the most specific key wins (name, then tuple, then ``"*"``).
Serialized, a tuple key becomes a JSON array string, as in Haystack, so either hook reads the other's settings.

The read-back tools (`READ_BACK_TOOL_NAMES`) are never offloaded, whatever the mapping says: a page the model reads
back would otherwise be replaced by a pointer to a copy of itself, and the model would loop.
"""

import json
from collections.abc import Mapping
from typing import Any

from haystack.core.serialization import component_to_dict
from haystack.hooks.tool_result_offloading import NeverOffload
from haystack.hooks.tool_result_offloading.types import OffloadPolicy
from haystack.utils.deserialization import deserialize_component_inplace

from haystack_integrations.offload.constants import READ_BACK_TOOL_NAMES

WILDCARD = "*"

OffloadStrategies = dict[str | tuple[str, ...], OffloadPolicy]


def validate_strategies(strategies: Mapping[str | tuple[str, ...], OffloadPolicy]) -> OffloadStrategies:
    """
    Check an offload-strategies mapping and return a copy of it.

    :param strategies: Tool name, tuple of tool names, or ``"*"`` mapped to an `OffloadPolicy`.
    :returns: A new dictionary with the same entries.
    :raises TypeError: If it is not a mapping, a key is neither a string nor a tuple of strings, or a value has no
        ``should_offload`` method.
    :raises ValueError: If a key is empty, a tool is named under two keys, or a read-back tool is given a policy other
        than `NeverOffload` (its results are never offloaded).
    """
    if not isinstance(strategies, Mapping):
        raise TypeError(f"offload_strategies must be a dict of tool name to OffloadPolicy, got {type(strategies)}.")
    seen: dict[str, str | tuple[str, ...]] = {}
    for key, policy in strategies.items():
        names = _key_names(key)
        if not callable(getattr(policy, "should_offload", None)):
            raise TypeError(
                f"offload_strategies[{key!r}] must be an OffloadPolicy (with should_offload), got {type(policy)}."
            )
        for name in names:
            if name in seen:
                raise ValueError(f"Tool {name!r} is under two offload_strategies keys: {seen[name]!r} and {key!r}.")
            seen[name] = key
            if name in READ_BACK_TOOL_NAMES and not isinstance(policy, NeverOffload):
                raise ValueError(
                    f"{name!r} reads offloaded results back; its results are never offloaded. Remove it from "
                    f"offload_strategies (or map it to NeverOffload())."
                )
    return dict(strategies)


def _key_names(key: object) -> tuple[str, ...]:
    if isinstance(key, str):
        if not key:
            raise ValueError("An offload_strategies key must not be empty; use '*' for every other tool.")
        return () if key == WILDCARD else (key,)
    if isinstance(key, tuple):
        if not key or not all(isinstance(name, str) and name for name in key):
            raise ValueError(f"A tuple key in offload_strategies must hold one or more tool names, got {key!r}.")
        return key
    raise TypeError(f"offload_strategies keys must be tool names, tuples of tool names or '*', got {key!r}.")


def policy_for(strategies: OffloadStrategies, tool_name: str) -> OffloadPolicy | None:
    """
    Return the policy for a tool's results, or `None` when they stay in context.

    :param strategies: A validated mapping.
    :param tool_name: The tool that produced the result.
    :returns: The exact-name policy, else the policy of a tuple naming the tool, else the ``"*"`` policy; `None` for
        read-back tools and tools no key covers.
    """
    if tool_name in READ_BACK_TOOL_NAMES:
        return None
    if tool_name in strategies:
        return strategies[tool_name]
    for key, policy in strategies.items():
        if isinstance(key, tuple) and tool_name in key:
            return policy
    return strategies.get(WILDCARD)


def serialize_strategies(strategies: OffloadStrategies) -> dict[str, Any]:
    """
    Serialize a mapping in Haystack's format: tuple keys as JSON arrays, each policy as its typed dictionary.

    :param strategies: A validated mapping.
    :returns: A JSON-friendly dictionary.
    """
    return {
        json.dumps(list(key)) if isinstance(key, tuple) else key: component_to_dict(obj=policy, name=str(key))
        for key, policy in strategies.items()
    }


def deserialize_strategies(data: Mapping[str, Any]) -> OffloadStrategies:
    """
    Rebuild a mapping serialized by `serialize_strategies` or by Haystack's `ToolResultOffloadHook`.

    Policies are imported through Haystack's deserialization allowlist.

    :param data: The serialized mapping.
    :returns: The mapping, with tuple keys restored.
    :raises haystack.core.errors.DeserializationError: If a policy cannot be rebuilt or is not allowed.
    """
    policies = dict(data)
    strategies: OffloadStrategies = {}
    for raw_key in list(policies):
        deserialize_component_inplace(policies, key=raw_key)
        key: str | tuple[str, ...] = tuple(json.loads(raw_key)) if raw_key.startswith("[") else raw_key
        strategies[key] = policies[raw_key]
    return validate_strategies(strategies)
