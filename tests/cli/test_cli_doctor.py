"""
``offload-haystack doctor``: the object-store checks on memory, local disk and moto (both engines), their exit
statuses, a store that ignores conditional writes, and that nothing is left behind.
"""

import json
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from haystack_integrations.offload import FsspecToolResultStore, RetryPolicy
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.operations.conformance import (
    EXIT_FAILED,
    EXIT_PASSED,
    EXIT_UNKNOWN,
    CheckResult,
    ConformanceReport,
    run_conformance,
)
from haystack_integrations.offload.testing.faults import Fault, FaultPlan, FaultProxy
from haystack_integrations.offload.testing.local_s3 import LocalS3Server
from support.silent_endpoint import SilentEndpoint

CHECKS = [
    "exclusive-create",
    "ranged-read",
    "list-delimiter",
    "batch-delete",
    "multipart-write",
    "conditional-multipart",
    "tenant-isolation",
    "cleanup",
    "leftovers",
]
S3_ONLY = {"list-delimiter", "multipart-write", "conditional-multipart"}
NOT_CONFIGURED = {"tenant-isolation"}  # skipped without credentials or keys per tenant


def _doctor(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", *arguments, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out)


def _verdicts(report: dict[str, Any]) -> dict[str, str]:
    return {check["name"]: check["verdict"] for check in report["checks"]}


def _s3_arguments(server: LocalS3Server, prefix: str, endpoint: str | None = None) -> list[str]:
    options = server.storage_options()
    options["endpoint_url"] = endpoint or options["endpoint_url"]
    return ["--store", f"{server.bucket_url}/{prefix}", "--storage-options", json.dumps(options)]


def _keys(server: LocalS3Server, prefix: str) -> list[str]:
    listed = server.client().list_objects_v2(Bucket=server.bucket, Prefix=prefix)
    return [entry["Key"] for entry in listed.get("Contents", [])]


def test_doctor_on_memory_passes_and_skips_the_s3_checks(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _doctor(capsys, "--store", f"memory://doctor-{uuid.uuid4().hex}")
    verdicts = _verdicts(report)
    assert code == EXIT_PASSED and report["ok"] is True and list(verdicts) == CHECKS
    assert {name for name, verdict in verdicts.items() if verdict == "skipped"} == S3_ONLY | NOT_CONFIGURED
    assert all(verdict == "pass" for name, verdict in verdicts.items() if name not in S3_ONLY | NOT_CONFIGURED)
    skipped = [check["detail"] for check in report["checks"] if check["name"] in S3_ONLY]
    # Each says which store lacks what (memory:// has no listing pages, no multipart), not a generic "S3 only".
    assert all(detail.startswith("memory:// ") and "S3 only" not in detail for detail in skipped)


def test_doctor_on_a_local_directory_leaves_it_as_it_was(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "README").write_text("an operator's file")
    code, report = _doctor(capsys, str(tmp_path))  # the URL alone, as the other commands take it
    assert code == EXIT_PASSED, report
    assert _verdicts(report)["exclusive-create"] == "pass" and _verdicts(report)["ranged-read"] == "pass"
    assert report["prefix"].startswith(f"{tmp_path}/.doctor/")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["README"]


def test_doctor_prints_a_table_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--store", f"memory://doctor-{uuid.uuid4().hex}"]) == EXIT_PASSED
    out = capsys.readouterr().out
    for name in CHECKS:
        assert name in out
    assert "PASS" in out and "SKIPPED" in out and out.rstrip().endswith("exit 0")


@pytest.mark.s3
@pytest.mark.parametrize(("engine", "resolved"), [("fsspec", "fsspec"), ("obstore", "obstore"), (None, "obstore")])
def test_doctor_on_s3_passes_and_leaves_no_object_behind(
    s3_server: LocalS3Server, engine: str | None, resolved: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"doctor-{uuid.uuid4().hex}"
    chosen = ["--engine", engine] if engine else []  # None: the default, which resolves to obstore
    code, report = _doctor(capsys, *_s3_arguments(s3_server, prefix), *chosen)
    verdicts = _verdicts(report)
    assert code == EXIT_PASSED, report
    assert list(verdicts) == CHECKS and report["engine"] == resolved
    expected = {name: "skipped" if name in NOT_CONFIGURED else "pass" for name in CHECKS}
    if resolved == "obstore":
        expected["conditional-multipart"] = "skipped"  # obstore cannot send the conditional completion
    assert verdicts == expected, report
    assert report["checks"][0]["finding"] == "enforced"
    assert _keys(s3_server, prefix) == []
    uploads = s3_server.client().list_multipart_uploads(Bucket=s3_server.bucket, Prefix=prefix)
    assert uploads.get("Uploads", []) == []


@pytest.mark.s3
def test_doctor_on_a_store_that_ignores_conditional_writes_fails(
    s3_server: LocalS3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"doctor-{uuid.uuid4().hex}"
    with FaultProxy(s3_server.endpoint_url, ignore_conditional_writes=True) as proxy:
        code, report = _doctor(capsys, *_s3_arguments(s3_server, prefix, proxy.endpoint_url), "--engine", "fsspec")
        stripped = len(proxy.stripped.snapshot())
    checks = {check["name"]: check for check in report["checks"]}
    assert code == EXIT_FAILED and report["ok"] is False
    assert checks["exclusive-create"]["verdict"] == "fail"
    assert checks["exclusive-create"]["finding"] == "ignored"  # not "unsupported": the server said nothing of it
    # A conditional multipart completion that is ignored is a warning: coordination never goes through multipart.
    assert checks["conditional-multipart"]["verdict"] == "warn"
    assert checks["conditional-multipart"]["finding"] == "ignored"
    assert checks["ranged-read"]["verdict"] == "pass" and checks["cleanup"]["verdict"] == "pass"
    assert stripped >= 3  # the probe's two creates and the completion
    assert _keys(s3_server, prefix) == []


@pytest.mark.s3
def test_doctor_cannot_run_without_a_bucket(s3_server: LocalS3Server, capsys: pytest.CaptureFixture[str]) -> None:
    options = json.dumps(s3_server.storage_options())
    code = main(["doctor", "--store", f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}", "--storage-options", options])
    captured = capsys.readouterr()
    # Every check fails (the bucket is missing), and none is mistaken for a transient "unknown".
    assert code == EXIT_FAILED, captured.err
    assert "FAIL" in captured.out and "UNKNOWN" not in captured.out


def test_doctor_refuses_two_different_stores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", str(tmp_path), "--store", "memory://other"]) == 2
    assert "Give the store once" in capsys.readouterr().err
    assert main(["doctor"]) == 2
    assert "--store URL" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("verdicts", "status"),
    [
        (["pass", "warn", "skipped"], EXIT_PASSED),
        (["pass", "unknown"], EXIT_UNKNOWN),
        (["unknown", "fail"], EXIT_FAILED),
        (["fail", "pass"], EXIT_FAILED),
    ],
)
def test_exit_status_rules(verdicts: list[Any], status: int) -> None:
    checks = tuple(CheckResult(f"check-{number}", verdict, "-") for number, verdict in enumerate(verdicts))
    report = ConformanceReport("memory://x", "fsspec", "memory://x/.doctor-0", checks)
    assert report.exit_status == status
    assert report.to_dict()["exit_status"] == status


@pytest.mark.parametrize("as_json", [False, True])
def test_doctor_never_prints_credentials_given_in_the_store_url(
    as_json: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"memory://AKIDEXAMPLE:S3CR3T@doctor-{uuid.uuid4().hex}/prod?secret=S3CR3T2&region=eu-west-1"
    code = main(["doctor", "--store", url, *(["--json"] if as_json else [])])
    captured = capsys.readouterr()
    assert code == EXIT_PASSED, captured
    printed = captured.out + captured.err
    assert "S3CR3T" not in printed and "AKIDEXAMPLE" not in printed
    assert "***:***@doctor-" in printed and "secret=***&region=eu-west-1" in printed


def test_a_refused_store_url_is_named_without_its_credentials(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--store", "gs://AKIDEXAMPLE:S3CR3T@bucket/prod", "--engine", "obstore"])
    captured = capsys.readouterr()
    assert code != 0 and "gs://***:***@bucket/prod" in captured.err
    assert "S3CR3T" not in captured.out + captured.err


@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_doctor_stops_at_the_first_check_that_cannot_reach_the_store_and_reports_each_as_it_ends(engine: str) -> None:
    silent = SilentEndpoint()
    try:
        options = {"endpoint_url": f"http://127.0.0.1:{silent.port}", "key": "k", "secret": "s"}
        root = FsspecToolResultStore(
            "s3://bucket/prod",
            storage_options={**options, "client_kwargs": {"region_name": "us-east-1"}},
            engine=engine,
            retry=RetryPolicy(attempts=2, attempt_timeout=0.5, deadline=2),
        )
        seen: list[str] = []
        report = run_conformance(root, on_check=lambda check: seen.append(check.name))
    finally:
        silent.close()
    assert silent.accepted, "the endpoint was asked"
    assert seen == [check.name for check in report.checks] == CHECKS
    verdicts = _verdicts(report.to_dict())
    assert verdicts["exclusive-create"] == "unknown"
    later = [check for check in report.checks if check.name != "exclusive-create"]
    assert all(check.verdict == "skipped" for check in later), verdicts
    assert all("exclusive-create could not reach the store" in check.detail for check in later)


@pytest.mark.s3
@pytest.mark.parametrize("fault", [Fault.RESET_AFTER, Fault.SLOW_DOWN])
def test_doctor_keeps_going_on_a_store_that_answers_badly(s3_server: LocalS3Server, fault: Fault) -> None:
    # A reset after the request reached S3, or a 503, is a flaky store, not an unreachable one: every check runs.
    with FaultProxy(s3_server.endpoint_url, plan=FaultPlan(rate=1.0, kinds=[fault])) as proxy:
        root = FsspecToolResultStore(
            f"{s3_server.bucket_url}/doctor-{uuid.uuid4().hex}",
            storage_options={**s3_server.storage_options(), "endpoint_url": proxy.endpoint_url},
            engine="fsspec",
            retry=RetryPolicy(attempts=2, base_delay=0, max_delay=0, deadline=5),
        )
        report = run_conformance(root)
        injected = [entry.kind for entry in proxy.faults.snapshot()]
    verdicts = _verdicts(report.to_dict())
    # Every check that sends requests asked (two attempts each) and got the fault; none was skipped for it.
    assert len(injected) >= 2 * 5 and set(injected) == {fault}, injected
    assert not [check.name for check in report.checks if "could not reach" in check.detail], verdicts
    assert {verdicts[name] for name in CHECKS if name not in S3_ONLY | NOT_CONFIGURED} <= {"unknown", "fail"}, verdicts


@pytest.mark.s3
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_doctor_removes_what_a_killed_run_left_and_keeps_a_run_under_way(s3_server: LocalS3Server, engine: str) -> None:
    # A doctor killed mid-run (SIGKILL: no cleanup) leaves its objects below <root>/.doctor/<run>/, which ls, du and
    # purge never show or touch. The next run removes those older than `leftover_age` by the storage's clock.
    prefix = f"doctor-{uuid.uuid4().hex}"
    client = s3_server.client()
    killed = [f"{prefix}/.doctor/0123456789ab/ranged", f"{prefix}/.doctor/0123456789ab/.tmp-{'0' * 16}"]
    for key in killed:
        client.put_object(Bucket=s3_server.bucket, Key=key, Body=b"left")
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{prefix}", storage_options=s3_server.storage_options(), engine=engine
    )
    time.sleep(1.1)  # S3 dates objects to the second: make the killed run's strictly older than this one's
    report = run_conformance(root, leftover_age=timedelta(seconds=1))
    assert report.exit_status == EXIT_PASSED, report
    assert _verdicts(report.to_dict())["leftovers"] == "pass"
    assert _keys(s3_server, prefix) == []

    # A run under way elsewhere (younger than the default age) keeps what it wrote.
    running = f"{prefix}/.doctor/ba9876543210/ranged"
    client.put_object(Bucket=s3_server.bucket, Key=running, Body=b"mine")
    report = run_conformance(root)
    assert "kept 1" in next(check.detail for check in report.checks if check.name == "leftovers")
    assert _keys(s3_server, prefix) == [running]


class _UndatedMemory(MemoryFileSystem):
    """A filesystem that cannot say when an object was written (fsspec's default `modified`)."""

    protocol = "undated-memory"

    def modified(self, path: str) -> Any:
        raise NotImplementedError


def test_doctor_keeps_what_it_cannot_date_it_may_be_a_run_under_way() -> None:
    fsspec.register_implementation(_UndatedMemory.protocol, _UndatedMemory, clobber=True)
    root = FsspecToolResultStore(f"{_UndatedMemory.protocol}://doctor-{uuid.uuid4().hex}")
    other_run = f"{root._handle.root_path()}/.doctor/0123456789ab/ranged"
    fs = _UndatedMemory()
    fs.pipe_file(other_run, b"mine")
    report = run_conformance(root, leftover_age=timedelta(0))
    assert "kept 1 object(s)" in next(check.detail for check in report.checks if check.name == "leftovers")
    assert fs.cat_file(other_run) == b"mine"


@pytest.mark.s3
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_doctor_fails_a_store_that_lets_one_tenant_reach_another_or_ignores_sse_c(
    s3_server: LocalS3Server, engine: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # moto evaluates no IAM policy and ignores SSE-C: exactly what the check is there to find.
    monkeypatch.setenv("DOCTOR_MASTER_KEY", "a master secret for the doctor's tests, 48 chars")
    role = ["--tenant-role-arn", "arn:aws:iam::123456789012:role/offload-tenants"]
    prefix = f"doctor-{uuid.uuid4().hex}"
    code, report = _doctor(capsys, *_s3_arguments(s3_server, prefix), "--engine", engine, *role)
    check = next(check for check in report["checks"] if check["name"] == "tenant-isolation")
    assert code == EXIT_FAILED and check["verdict"] == "fail"
    assert "(read, overwrite, list, delete)" in check["detail"], check
    code, report = _doctor(
        capsys, *_s3_arguments(s3_server, prefix), "--engine", engine, "--sse-c-master-key-env", "DOCTOR_MASTER_KEY"
    )
    check = next(check for check in report["checks"] if check["name"] == "tenant-isolation")
    assert code == EXIT_FAILED and "SSE-C is ignored" in check["detail"], check
    assert _keys(s3_server, prefix) == []


def test_doctor_names_a_master_key_variable_that_is_not_set(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--store", "s3://bucket/prod", "--sse-c-master-key-env", "DOCTOR_UNSET_VARIABLE"])
    assert code == 2 and "DOCTOR_UNSET_VARIABLE, which is not set" in capsys.readouterr().err


@pytest.mark.rgw
@pytest.mark.parametrize("engine", ["fsspec", "obstore"])
def test_doctor_passes_tenant_isolation_on_rgw(
    real_s3_server: Any,
    real_s3_tenant_role: str,
    engine: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCTOR_MASTER_KEY", "a master secret for the doctor's tests, 48 chars")
    prefix = f"doctor-{uuid.uuid4().hex}"
    arguments = ["--store", f"{real_s3_server.bucket_url}/{prefix}"]
    arguments += ["--storage-options", json.dumps(real_s3_server.storage_options()), "--engine", engine]
    arguments += ["--tenant-role-arn", real_s3_tenant_role, "--sse-c-master-key-env", "DOCTOR_MASTER_KEY"]
    code, report = _doctor(capsys, *arguments)
    check = next(check for check in report["checks"] if check["name"] == "tenant-isolation")
    assert check["verdict"] == "pass", report
    assert "refused another tenant's objects" in check["detail"] and "refused without it" in check["detail"]
    assert _verdicts(report)["cleanup"] == "pass" and code in (EXIT_PASSED, EXIT_FAILED)
    listed = real_s3_server.client().list_objects_v2(Bucket=real_s3_server.bucket, Prefix=prefix)
    assert listed.get("Contents", []) == []
