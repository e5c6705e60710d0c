"""A tracer that records every span with its tags, to check what our hooks report (enabled by `recording_tracer`)."""

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from haystack.tracing import Span, Tracer

HOOK_SPAN = "haystack.agent.hook"


@dataclass
class RecordedSpan(Span):
    """One span: its name, parent and tags (content tags included)."""

    operation_name: str
    parent: Span | None = None
    tags: dict[str, Any] = field(default_factory=dict)

    def set_tag(self, key: str, value: Any) -> None:
        self.tags[key] = value


class RecordingTracer(Tracer):
    """Records spans in the order they open; the innermost open span is the current one."""

    def __init__(self) -> None:
        self.spans: list[RecordedSpan] = []
        self._open: list[RecordedSpan] = []
        self.is_content_tracing_enabled = False

    @contextlib.contextmanager
    def trace(
        self, operation_name: str, tags: dict[str, Any] | None = None, parent_span: Span | None = None
    ) -> Iterator[Span]:
        span = RecordedSpan(operation_name, parent_span, dict(tags or {}))
        self.spans.append(span)
        self._open.append(span)
        try:
            yield span
        finally:
            self._open.remove(span)

    def current_span(self) -> Span | None:
        return self._open[-1] if self._open else None

    def hook_spans(self, point: str | None = None) -> list[RecordedSpan]:
        """The Agent's spans around hook calls, optionally only those of one hook point."""
        return [
            span
            for span in self.spans
            if span.operation_name == HOOK_SPAN and (point is None or span.tags["haystack.agent.hook.point"] == point)
        ]
