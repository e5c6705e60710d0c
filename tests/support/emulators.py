"""
The cloud emulators' lane (``OFFLOAD_TEST_EMULATORS=azurite,fake-gcs``, tox's ``emulators`` env): its backends, and the
tests of its suites that do not run there (S3 only, or what an emulator lacks), each skipped or xfailed with a reason.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

__all__ = ["BACKENDS", "EMULATORS", "GAPS", "LANE", "emulator_lane", "emulator_of", "lane_backends", "select"]

# Emulator -> the backend ids it serves: Azurite serves az:// through both engines (adlfs, obstore's AzureStore);
# fake-gcs-server gs:// through gcsfs only (obstore's GCSStore speaks GCS's XML API, which fake-gcs-server refuses).
BACKENDS = {"azurite": ("azurite", "azurite-obstore"), "fake-gcs": ("fake-gcs",)}
EMULATORS = tuple(BACKENDS)
_TESTS_ROOT = Path(__file__).resolve().parent.parent

_S3_ONLY = "S3 only"
# "<path under tests/>::<test function>" -> {backend id ("azurite" is adlfs's; an s3_endpoint test's is its emulator's),
# a parameter id (the part in brackets), or "*" for all: ("skip" or "xfail", why)}. A skip is for what cannot mean
# anything there (S3's own requests and faults, an emulator's missing feature); an xfail (strict) is a gap of ours.
GAPS: dict[str, dict[str, tuple[str, str]]] = {
    "stores/test_behaviour.py::test_huge_result_round_trips_byte_for_byte": {
        backend: (
            "xfail",
            "a write over 1 MiB hands aiohttp raw bytes (inside adlfs, gcsfs), whose ResourceWarning ('Sending a large "
            "body directly with raw bytes might lock the event loop'; ignored by Python's default filters) is an error "
            "under pytest's: a warning filter cannot be scoped to one call on 3.11, and the bytes are the SDK's",
        )
        for backend in ("azurite", "fake-gcs")
    },
    "stores/test_exclusive_creates.py::test_a_backend_that_refuses_the_second_create_is_enforced_and_the_probe_leaves_"
    "nothing": {"*": ("skip", f"{_S3_ONLY}: lists keys with boto3 (test_exclusive_creates_emulators.py instead)")},
    "stores/test_exclusive_creates.py::test_a_409_conflict_on_a_conditional_create_is_retried_until_it_lands_once": {
        "*": ("skip", f"{_S3_ONLY}: AWS's 409 ConditionalRequestConflict, injected into S3 PUTs by the fault proxy")
    },
    "stores/test_exclusive_creates.py::test_a_killed_probes_key_goes_with_the_next_purge_after_minutes_not_an_hour": {
        "*": ("skip", f"{_S3_ONLY}: writes the probe's keys with boto3 (test_exclusive_creates_emulators.py instead)")
    },
    "approvals/test_approval_object_stores.py::test_with_409_on_every_keys_first_create_the_durable_flow_runs_each_"
    "call_exactly_once": {
        "*": ("skip", f"{_S3_ONLY}: AWS's 409 ConditionalRequestConflict, injected into S3 PUTs by the fault proxy")
    },
    "sessions/test_history_costs.py::test_a_head_that_cannot_be_read_takes_the_claim_back": {
        "*": ("skip", f"{_S3_ONLY}: the fault proxy goes in as S3's endpoint_url (the module counts S3's requests)")
    },
    # Beyond tox's emulators env: s3_endpoint tests elsewhere, for a run of whole folders with the lane on.
    "stores/test_engine_choice.py::test_a_profile_signs_real_requests_on_every_server": {
        "*": ("skip", f"{_S3_ONLY}: signs with an AWS profile's keys")
    },
    "stores/test_exit_wait.py::test_exit_waits_for_an_obstore_thread_handing_over_a_result": {
        "fake-gcs": ("skip", "holds a hand-over of obstore's threads; gs:// goes through gcsfs")
    },
    "stores/test_mixed_engines.py::test_results_written_on_one_engine_are_read_listed_and_deleted_on_the_other": {
        "*": ("skip", f"{_S3_ONLY}: checks a multipart upload by its ETag through boto3")
    },
    "operations/test_session_marks.py::test_a_mark_whose_answer_was_lost_is_known_as_its_own_not_counted_twice": {
        "*": ("skip", f"{_S3_ONLY}: seeds 1,100 objects with boto3 and loses an answer through S3's endpoint_url")
    },
}


def emulator_lane(value: str) -> tuple[str, ...]:
    """
    The emulators an ``OFFLOAD_TEST_EMULATORS`` value names, in order, each once.

    :param value: Comma-separated emulators (``azurite``, ``fake-gcs``); empty turns the lane off.
    :returns: The emulators, e.g. ``("azurite", "fake-gcs")``.
    :raises pytest.UsageError: For a name that is not an emulator's.
    """
    names = tuple(dict.fromkeys(name.strip() for name in value.lower().split(",") if name.strip()))
    unknown = [name for name in names if name not in BACKENDS]
    if unknown:
        raise pytest.UsageError(f"OFFLOAD_TEST_EMULATORS takes {', '.join(EMULATORS)}, got {', '.join(unknown)}.")
    return names


LANE = emulator_lane(os.environ.get("OFFLOAD_TEST_EMULATORS", ""))


def lane_backends(*, engines: bool = True) -> list[Any]:
    """
    The lane's backends as parameters marked ``emulators`` (none when it is off).

    :param engines: Every engine's backend (``azurite-obstore`` too), or one per emulator.
    """
    ids = [backend for name in LANE for backend in (BACKENDS[name] if engines else BACKENDS[name][:1])]
    return [pytest.param(backend, marks=pytest.mark.emulators) for backend in ids]


def emulator_of(backend: object) -> str | None:
    """
    The emulator a backend or endpoint id runs on.

    :param backend: A ``backend`` or ``s3_endpoint`` parameter.
    :returns: ``"azurite"`` or ``"fake-gcs"``, else ``None``.
    """
    return next((name for name, ids in BACKENDS.items() if backend in ids), None)


def select(config: pytest.Config, items: list[pytest.Item]) -> None:
    """
    Deselect the tests of emulators the lane does not name (as the real-S3 lane's are when it is off), and mark those
    of its own that `GAPS` names, or that ask gs:// for the obstore engine, skip or xfail with their reasons.
    """
    outside = [
        item for item in items if item.get_closest_marker("emulators") and emulator_of(_backend(item)) not in LANE
    ]
    if outside:
        config.hook.pytest_deselected(items=outside)
        dropped = set(outside)
        items[:] = [item for item in items if item not in dropped]
    for item in items:
        backend = _backend(item)
        if emulator_of(backend) is None:
            continue
        name = f"{item.path.relative_to(_TESTS_ROOT).as_posix()}::{getattr(item, 'originalname', item.name)}"
        gap = GAPS.get(name, {})
        kind, reason = gap.get(_id(item)) or gap.get(str(backend)) or gap.get("*") or ("", "")
        if not kind and backend == "fake-gcs" and "obstore" in _params(item).values():
            kind, reason = "skip", "the obstore engine does not serve gs:// (GCS goes through gcsfs)"
        if kind == "skip":
            item.add_marker(pytest.mark.skip(reason=f"{backend}: {reason}"))
        elif kind == "xfail":
            item.add_marker(pytest.mark.xfail(reason=f"{backend}: {reason}", strict=True))


def _params(item: pytest.Item) -> dict[str, Any]:
    callspec: Any = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec is not None else {}


def _id(item: pytest.Item) -> str:
    callspec: Any = getattr(item, "callspec", None)
    return str(callspec.id) if callspec is not None else ""


def _backend(item: pytest.Item) -> object:
    """The item's ``backend`` parameter, or its ``s3_endpoint``'s (``None`` for neither)."""
    params = _params(item)
    return params.get("backend", params.get("s3_endpoint"))
