"""
What `read_tool_result` and `list_tool_results` share: State injection, the run's store, arguments, errors, serde.
"""

import logging
from collections.abc import Mapping
from typing import Any, ClassVar, Self, get_args

from haystack.components.agents.state.state import State
from haystack.core.serialization import generate_qualified_class_name
from haystack.dataclasses import ImageContent, TextContent
from haystack.hooks.tool_result_offloading.types import ToolResultStore
from haystack.tools.errors import ToolInvocationError
from haystack.tools.tool import Tool
from haystack.utils.deserialization import deserialize_component_inplace
from pydantic import BaseModel, ValidationError

from haystack_integrations.offload.metrics import ReadKind, read_back
from haystack_integrations.offload.sync_calls import sync_twin
from haystack_integrations.offload.tools.errors import ReadBackToolError, message_for
from haystack_integrations.offload.tools.resolve import resolve_store

logger = logging.getLogger(__name__)

ToolOutput = str | list[TextContent | ImageContent]

_JSON_TYPES = {str: "string", int: "integer", bool: "boolean"}


def argument_schema(arguments_model: type[BaseModel]) -> dict[str, Any]:
    """
    The JSON schema the model sees for a tool's arguments, from the model that validates them: names and types only.

    The model reads this schema on every call of every step, so limits (page size, match count, pattern length) stay
    out of it: the tool enforces them, clamping or explaining, and a configured tool costs what the default one does.

    :param arguments_model: The tool's `arguments_model`; each field is a `str`, `int` or `bool`, optional or not.
    :returns: An object schema with each field's type, and the required fields, if any.
    """
    fields = arguments_model.model_fields
    properties = {name: {"type": _json_type(info.annotation)} for name, info in fields.items()}
    required = [name for name, info in fields.items() if info.is_required()]
    return {"type": "object", "properties": properties, **({"required": required} if required else {})}


def _json_type(annotation: Any) -> str:
    # An optional argument (`int | None`) has the type of what it is when given.
    return _JSON_TYPES[next(kind for kind in get_args(annotation) or (annotation,) if kind is not type(None))]


class _ErrorText(str):
    """A failed call's message, told apart from a normal result without changing what the model reads."""

    __slots__ = ()


class ReadBackTool(Tool):
    """
    Base of the read-back tools: a `Tool` that reads through the current run's store.

    Subclasses set `arguments_model` and implement `_run_async`; `_run`, the sync form, waits for it, unless a
    subclass drives its reader with the sync driver instead (`tools.source.drive`).
    """

    arguments_model: ClassVar[type[BaseModel]]

    def __init__(
        self,
        *,
        name: str,
        description: str,
        parameters: dict[str, Any],
        store: ToolResultStore | None,
        raise_on_error: bool,
    ) -> None:
        """
        :param name: The tool's name.
        :param description: What the model reads about the tool.
        :param parameters: The JSON schema of the model's arguments.
        :param store: The fallback store, for runs that bring none through `hook_context`.
        :param raise_on_error: Raise `ToolInvocationError` on failure instead of returning ``"Error: ..."``.
        """
        self.store = store
        self.raise_on_error = raise_on_error
        super().__init__(
            name=name,
            description=description,
            parameters=parameters,
            function=self._call,
            async_function=self._call_async,
            # Images travel as ImageContent parts, not as their repr.
            outputs_to_string={"raw_result": True},
        )

    # What Haystack calls. `state` is injected by the Agent (State-typed), everything else comes from the model.

    def _call(self, state: State | None = None, **arguments: Any) -> ToolOutput:
        try:
            store = resolve_store(state, self.store, tool_name=self.name)
            return self._run(store, self._parse(arguments), state)
        except Exception as error:
            return _ErrorText(f"Error: {message_for(error, tool_name=self.name)}")

    async def _call_async(self, state: State | None = None, **arguments: Any) -> ToolOutput:
        try:
            store = resolve_store(state, self.store, tool_name=self.name)
            return await self._run_async(store, self._parse(arguments), state)
        except Exception as error:
            return _ErrorText(f"Error: {message_for(error, tool_name=self.name)}")

    def _parse(self, arguments: Mapping[str, Any]) -> Any:
        try:
            return self.arguments_model.model_validate(dict(arguments))
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in problem['loc']) or 'arguments'}: {problem['msg']}"
                for problem in error.errors(include_url=False)
            )
            raise ReadBackToolError(f"Invalid arguments for {self.name}: {problems}.") from error

    async def _run_async(self, store: ToolResultStore, arguments: Any, state: State | None) -> ToolOutput:
        raise NotImplementedError

    # The sync tool waits for the async one; a tool that drives a sans-I/O reader (`tools.source`) drives it here
    # instead, with the sync driver.
    _run = sync_twin(_run_async)

    @staticmethod
    def _count_read(kind: ReadKind, size: int, store: ToolResultStore) -> None:
        """
        Count one call that read for the model (`metrics.read_back`), under the store's tenant if it has one.

        Called only once a call has read what it returns: a call that fails (a refused reference, bad arguments, a
        storage error) gets an error result and is not counted; its storage requests are, by the store.
        """
        tenant = getattr(store, "tenant", None)
        read_back(kind, size, tenant=tenant if isinstance(tenant, str) else None)

    def _finish(self, result: ToolOutput) -> ToolOutput:
        if isinstance(result, _ErrorText):
            if self.raise_on_error:
                raise ToolInvocationError(f"{self.name}: {result.removeprefix('Error: ')}", tool_name=self.name)
            return str(result)
        return result

    def invoke(self, **kwargs: Any) -> Any:
        """
        Run the tool synchronously (the Agent passes the model's arguments and the live `State`).

        :param kwargs: The model's arguments, and `state`.
        :returns: The result text, or a header and an image for image results; ``"Error: ..."`` on failure.
        :raises ToolInvocationError: On failure, only when constructed with ``raise_on_error=True``.
        """
        return self._finish(super().invoke(**kwargs))

    async def invoke_async(self, **kwargs: Any) -> Any:
        """
        Run the tool without blocking the event loop (ranged reads are awaited).

        :param kwargs: The model's arguments, and `state`.
        :returns: The result text, or a header and an image for image results; ``"Error: ..."`` on failure.
        :raises ToolInvocationError: On failure, only when constructed with ``raise_on_error=True``.
        """
        return self._finish(await super().invoke_async(**kwargs))

    # Serialization and copies: the configuration, not the functions (they are this class's own bound methods).

    def _init_parameters(self) -> dict[str, Any]:
        """The constructor arguments that rebuild this tool (the fallback store as the object itself)."""
        return {"store": self.store, "raise_on_error": self.raise_on_error}

    def to_dict(self) -> dict[str, Any]:
        """
        Serialize the tool's configuration (and its fallback store, if any).

        :returns: A dictionary in Haystack's tool format (``type`` and ``data``).
        """
        data = self._init_parameters()
        data["store"] = self.store.to_dict() if self.store is not None else None
        return {"type": generate_qualified_class_name(type(self)), "data": data}

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        # Haystack deep-copies component inputs (runtime tools, for one). A copy is the same configuration sharing the
        # same fallback store: a store holds a client and its connection pool, which are shared by design.
        return type(self)(**self._init_parameters())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """
        Deserialize a tool produced by `to_dict`.

        :param data: The dictionary representation.
        :returns: The tool.
        """
        parameters = dict(data.get("data") or {})
        if parameters.get("store") is not None:
            deserialize_component_inplace(parameters, key="store")
        return cls(**parameters)

    def __repr__(self) -> str:
        store = f", store={self.store!r}" if self.store is not None else ""
        return f"{type(self).__name__}(name={self.name!r}{store})"
