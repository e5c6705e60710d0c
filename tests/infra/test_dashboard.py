"""
The Grafana dashboard in ``infra/grafana/``: valid JSON on the datasource variable, querying what the library emits.

What it emits is read from the real exporter: a subprocess (a MeterProvider can be set once per process) installs the
OpenTelemetry SDK with its Prometheus reader, records through every function of ``metrics.py`` and prints the scrape.
"""

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "infra" / "grafana" / "offload-haystack-dashboard.json"
OPERATIONS = ROOT / "docs" / "operations.md"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# A scrape, by sample name (``offload_results_total``): its metric family (``offload_results``) and its label pairs.
Scrape = dict[str, tuple[str, set[tuple[str, str]]]]

# Every recording function, with every value of its bounded attributes, then the scrape in Prometheus' text format.
SCRAPE = """
import time
import typing

import prometheus_client
from opentelemetry import metrics as api
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider

api.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
from haystack_integrations.offload import metrics

for outcome in typing.get_args(metrics.OffloadOutcome):
    metrics.result_offloaded(outcome, 5_000)
for outcome in typing.get_args(metrics.RequestOutcome):
    with metrics.storage_request("put") as record:
        record.outcome = outcome
metrics.storage_retry("put", "HTTP 503 SlowDown")
for kind in typing.get_args(metrics.ReadKind):
    metrics.read_back(kind, 1_000)
for event in typing.get_args(metrics.ApprovalEvent):
    metrics.approval(event, verdict="approved" if event == "decided" else None)
metrics.label_tenants(["acme"])
metrics.turn_ended("completed", 0.5, tenant="acme")
metrics.pending_approvals.pending("approval-1", time.time() - 60)
print(prometheus_client.generate_latest().decode())
"""

_METRIC = re.compile(r"\boffload_[a-z0-9_]+")
_SELECTOR = re.compile(r"\{[^}]*\}")
_GROUPING = re.compile(r"\bby \(([^)]*)\)")
_MATCHER = re.compile(r'([a-z_]+)\s*(=~|!=|!~|=)\s*"([^"]*)"')


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


@pytest.fixture(scope="module")
def scraped() -> Scrape:
    """What the exporter printed after every recording function ran."""
    printed = subprocess.run(
        [sys.executable, "-c", SCRAPE], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    samples: Scrape = {}
    for family in text_string_to_metric_families(printed):
        for sample in family.samples:
            samples.setdefault(sample.name, (family.name, set()))[1].update(sample.labels.items())
    return samples


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in _panels(dashboard) for target in panel["targets"]]


def _metrics(dashboard: dict[str, Any]) -> set[str]:
    """The offload_* metric names the queries use; label names (in selectors and groupings) are not metrics."""
    unlabelled = (_GROUPING.sub("", _SELECTOR.sub("", expr)) for expr in _exprs(dashboard))
    return {name for expr in unlabelled for name in _METRIC.findall(expr)}


def test_the_dashboard_is_a_grafana_dashboard_on_a_prometheus_datasource_variable(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] >= 39
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    assert variables["instance"]["datasource"] == DATASOURCE
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in _panels(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        assert all(target["datasource"] == DATASOURCE for target in panel["targets"]), panel["title"]
        # Every query follows the worker selection, so one worker can be looked at alone.
        assert all('instance=~"$instance"' in target["expr"] for target in panel["targets"]), panel["title"]


def test_a_panel_that_says_offloaded_counts_only_what_was_stored(dashboard: dict[str, Any]) -> None:
    # under_threshold, kept_inline and refused_quota results were not offloaded: a panel summing every outcome says
    # "handled".
    for panel in _panels(dashboard):
        if "offloaded" in panel["title"].lower():
            assert all('offload_outcome="stored"' in target["expr"] for target in panel["targets"]), panel["title"]


def test_every_metric_the_dashboard_queries_is_one_the_library_emits(
    dashboard: dict[str, Any], scraped: Scrape
) -> None:
    queried = _metrics(dashboard)
    assert queried, "no offload_* metric in the dashboard's queries"
    assert queried <= set(scraped), sorted(queried - set(scraped))


def test_every_metric_the_library_emits_has_a_panel(dashboard: dict[str, Any], scraped: Scrape) -> None:
    emitted = {family for family, _ in scraped.values() if family.startswith("offload_")}
    queried = {scraped[name][0] for name in _metrics(dashboard) if name in scraped}
    assert emitted == queried, sorted(emitted - queried)


def test_every_label_the_dashboard_groups_or_filters_by_is_one_the_series_carry(
    dashboard: dict[str, Any], scraped: Scrape
) -> None:
    carried = {pair for name, (_, pairs) in scraped.items() if name.startswith("offload_") for pair in pairs}
    label_names = {label for label, _ in carried} | {"instance"}  # Prometheus adds `instance` per target
    variables = [variable["query"] for variable in dashboard["templating"]["list"] if variable["type"] == "query"]
    for expr in _exprs(dashboard) + variables:
        grouped = {label.strip() for labels in _GROUPING.findall(expr) for label in labels.split(",")}
        assert grouped <= label_names, (expr, sorted(grouped - label_names))
        for label, operator, value in _MATCHER.findall(expr):
            assert label in label_names, expr
            if operator == "=":  # an exact value must be one the library records
                assert (label, value) in carried, (expr, label, value)


def test_every_series_and_label_the_metrics_docs_name_is_one_the_exporter_prints(
    scraped: Scrape,
) -> None:
    page = OPERATIONS.read_text(encoding="utf-8")
    section = page[page.index("\n## Metrics\n") :].split("\n## ", 2)[1]
    printed = set(scraped) | {family for family, _ in scraped.values()}
    printed |= {label for _, pairs in scraped.values() for label, _ in pairs}
    named = set(_METRIC.findall(section))
    assert "offload_tenant" in named and "offload_storage_retries_total" in named
    assert named <= printed, sorted(named - printed)
