"""
The cloud emulators' lane's own harness (tests/support/emulators.py, fake_gcs.py): what ``OFFLOAD_TEST_EMULATORS``
takes, a gap list that names only tests that exist, and a fake-gcs-server that keeps answering through a long suite.
"""

import ast
import http.client
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from support.emulators import BACKENDS, GAPS, emulator_lane, emulator_of

TESTS = Path(__file__).resolve().parent.parent


def test_the_lane_takes_each_emulator_once_in_any_case_and_refuses_other_names() -> None:
    assert emulator_lane("") == () and emulator_lane(" , ") == ()
    assert emulator_lane("Azurite, fake-gcs,azurite") == ("azurite", "fake-gcs")
    with pytest.raises(pytest.UsageError, match="takes azurite, fake-gcs, got gcs"):
        emulator_lane("azurite,gcs")


def test_backend_ids_name_their_emulator() -> None:
    assert {backend: emulator_of(backend) for ids in BACKENDS.values() for backend in ids} == {
        "azurite": "azurite",
        "azurite-obstore": "azurite",
        "fake-gcs": "fake-gcs",
    }
    assert emulator_of("s3") is None and emulator_of("rgw-obstore") is None and emulator_of(None) is None


def test_every_gap_names_a_test_that_exists_a_backend_and_a_reason() -> None:
    backends = {backend for ids in BACKENDS.values() for backend in ids} | {"*"}
    for name, gaps in GAPS.items():
        path, _, function = name.partition("::")
        tree = ast.parse((TESTS / path).read_text())
        defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert function in defined, f"{name}: no such test (renamed? update support/emulators.py)"
        assert all(any(backend in key for backend in backends) for key in gaps), name  # ids name their backend
        assert all(kind in {"skip", "xfail"} and len(reason) > 20 for kind, reason in gaps.values()), name


def test_fake_gcs_server_keeps_answering_after_its_log_outgrows_a_pipe(fake_gcs_server: Any) -> None:
    # It logs a line per request to a pipe the wrapper never reads: without a reader it stopped answering at ~490
    # requests (64 KiB of log), which the behaviour suite passes long before its end.
    endpoint = urlsplit(fake_gcs_server.endpoint)
    connection = http.client.HTTPConnection(endpoint.hostname or "", endpoint.port, timeout=5)
    try:
        for _ in range(1500):
            connection.request("GET", "/storage/v1/b")
            response = connection.getresponse()
            response.read()
            assert response.status == 200
    finally:
        connection.close()
