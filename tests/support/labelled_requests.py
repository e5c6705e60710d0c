"""The requests a recording proxy saw during each labelled call of a test, each described as the test needs."""

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from haystack_integrations.offload.testing.faults import FaultProxy
from haystack_integrations.offload.testing.relay import ProxiedRequest

Described = TypeVar("Described")


class LabelledRequests(Generic[Described]):
    """Call ``sent(label, call)``: runs `call`, keeps what it sent in ``calls[label]``, returns its answer."""

    def __init__(self, proxy: FaultProxy, describe: Callable[[ProxiedRequest], Described]) -> None:
        self._proxy = proxy
        self._describe = describe
        self.calls: dict[str, list[Described]] = {}

    def __call__(self, label: str, call: Callable[[], Any]) -> Any:
        before = len(self._proxy.requests.snapshot())
        answer = call()
        self.calls[label] = [self._describe(request) for request in self._proxy.requests.snapshot()[before:]]
        return answer
