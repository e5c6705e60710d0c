"""
The library's metrics as a test reads them: one OpenTelemetry SDK MeterProvider per test process, read as what changed
since the test began, so tests need not run alone.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader, NumberDataPoint

_reader: InMemoryMetricReader | None = None

Point = tuple[str, frozenset[tuple[str, str]]]


def process_reader() -> InMemoryMetricReader:
    """The test process's reader, installed on first use (a MeterProvider can be set once per process)."""
    global _reader
    if _reader is None:
        _reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[_reader]))
    return _reader


def _read(reader: InMemoryMetricReader) -> dict[Point, tuple[float, float]]:
    """Every data point: a counter's value (and 0), a histogram's count and sum, a gauge's value (and 0)."""
    points: dict[Point, tuple[float, float]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    key = (metric.name, frozenset((k, str(v)) for k, v in (point.attributes or {}).items()))
                    if isinstance(point, HistogramDataPoint):
                        points[key] = (point.count, point.sum)
                    elif isinstance(point, NumberDataPoint):
                        points[key] = (point.value, 0)
    return points


class MetricReadings:
    """What the library counted since this object was made."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self._reader = reader
        self._before = _read(reader)

    def _changes(self, name: str, attributes: Mapping[str, str]) -> list[tuple[float, float]]:
        wanted = set(attributes.items())
        now = _read(self._reader)
        changes = []
        for (metric, labels), (value, total) in now.items():
            if metric == name and wanted <= labels:
                before_value, before_total = self._before.get((metric, labels), (0, 0))
                changes.append((value - before_value, total - before_total))
        return changes

    def added(self, name: str, **attributes: str) -> float:
        """How much a counter grew, over its series whose attributes include these (dots as ``__``)."""
        return sum(value for value, _ in self._changes(name, _dotted(attributes)))

    def recorded(self, name: str, **attributes: str) -> tuple[float, float]:
        """How many values a histogram recorded, and their sum, over the series whose attributes include these."""
        changes = self._changes(name, _dotted(attributes))
        return sum(count for count, _ in changes), sum(total for _, total in changes)

    def series(self, name: str) -> list[dict[str, str]]:
        """The attribute sets of a metric's series that changed."""
        now = _read(self._reader)
        return [
            dict(labels)
            for (metric, labels), value in now.items()
            if metric == name and value != self._before.get((metric, labels), (0, 0))
        ]


def _dotted(attributes: Mapping[str, str]) -> dict[str, str]:
    # offload__outcome="stored" reads as {"offload.outcome": "stored"}: attribute names have dots, keywords cannot.
    return {key.replace("__", "."): value for key, value in attributes.items()}
