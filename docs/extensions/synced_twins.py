"""
A griffe extension for the API reference: a sync twin made with ``synced`` (``read = synced(read_async)``) or
``sync_twin`` (``decide = sync_twin(decide_async)``) is shown as the method or function it is, with its async twin's
parameters and docstring, instead of as an attribute.
"""

from typing import Any

import griffe

_PREFIX = "The sync form of `{name}`, waiting for it.\n\n"
_DERIVERS = ("synced", "sync_twin")


class SyncedTwins(griffe.Extension):
    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        self._replace(cls, is_method=True)

    def on_module_members(self, *, mod: griffe.Module, **kwargs: Any) -> None:
        self._replace(mod, is_method=False)

    def _replace(self, parent: griffe.Class | griffe.Module, *, is_method: bool) -> None:
        for name, member in list(parent.members.items()):
            if member.is_alias or not member.is_attribute:
                continue
            deriver, _, rest = str(member.value or "").partition("(")
            if deriver not in _DERIVERS or not rest.endswith(")"):
                continue
            twin = parent.members.get(rest.removesuffix(")"))
            if not isinstance(twin, griffe.Function):
                continue
            function = griffe.Function(
                name,
                lineno=member.lineno,
                endlineno=member.endlineno,
                parameters=twin.parameters,
                returns=twin.returns,
                docstring=griffe.Docstring(
                    _PREFIX.format(name=twin.name) + (twin.docstring.value if twin.docstring else ""),
                    parser=twin.docstring.parser if twin.docstring else None,
                    parser_options=twin.docstring.parser_options if twin.docstring else None,
                ),
            )
            parent.set_member(name, function)
