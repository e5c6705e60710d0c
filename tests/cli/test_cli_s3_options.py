"""
``--endpoint-url``, ``--profile`` and ``--region``, and their AWS environment defaults, against the local S3 server;
and ``--engine``, which client serves an ``s3://`` store (s3fs, or obstore: its User-Agent tells them apart).

What reaches the server shows what the client was given: the request arrived at all (the endpoint), and its SigV4
``Authorization`` header names the access key (the profile's credentials) and the region it was signed for
(``Credential=<key>/<date>/<region>/s3/aws4_request``). A flag beats ``--storage-options``, which beats a variable.
"""

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog

DEAD_ENDPOINT = "http://127.0.0.1:9"  # the discard port: a client sent there gets nothing back
PROFILE_KEY = "AKIAPROFILEEXAMPLE01"
_CREDENTIAL = re.compile(r"Credential=([^/]+)/\d{8}/([^/]+)/s3/aws4_request")


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, s3_server: LocalS3Server) -> pytest.MonkeyPatch:
    """
    A clean AWS environment: the server's credentials in variables, a profile ``cli-test`` (its own key, and
    eu-central-1) in config files of the test's own, and no other AWS variable from the machine.
    """
    for name in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_SESSION_TOKEN",
    ):
        monkeypatch.delenv(name, raising=False)
    options = s3_server.storage_options()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", options["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", options["secret"])
    credentials, config = tmp_path / "credentials", tmp_path / "config"
    credentials.write_text(f"[cli-test]\naws_access_key_id = {PROFILE_KEY}\naws_secret_access_key = profile-secret\n")
    config.write_text("[profile cli-test]\nregion = eu-central-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    return monkeypatch


@pytest.fixture
def url(s3_server: LocalS3Server) -> str:
    """A store on the local S3 server with one result in acme/chat-1."""
    url = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    store = FsspecToolResultStore(url, storage_options=s3_server.storage_options())
    store.for_session("acme", "chat-1").write(key="hello.txt", content="hello from S3", tool_name="web_search")
    return url


def _ls(capsys: pytest.CaptureFixture[str], *arguments: str) -> Any:
    code = main(["ls", *arguments, "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def _signed(requests: RequestLog) -> set[tuple[str, str]]:
    """The (access key, region) pairs the server's requests were signed with."""
    found = set()
    for request in requests.snapshot():
        match = _CREDENTIAL.search(request.header("authorization") or "")
        assert match is not None, request
        found.add((match.group(1), match.group(2)))
    return found


@pytest.mark.s3
@pytest.mark.parametrize(
    ("flags", "variables"),
    [
        (["--endpoint-url", "{endpoint}"], {}),
        ([], {"AWS_ENDPOINT_URL": "{endpoint}"}),
        # The S3-specific variable first, as the AWS CLI reads them.
        ([], {"AWS_ENDPOINT_URL_S3": "{endpoint}", "AWS_ENDPOINT_URL": DEAD_ENDPOINT}),
        (["--endpoint-url", "{endpoint}"], {"AWS_ENDPOINT_URL": DEAD_ENDPOINT}),
        (["--storage-options", '{"endpoint_url": "{endpoint}"}'], {"AWS_ENDPOINT_URL": DEAD_ENDPOINT}),
        (["--endpoint-url", "{endpoint}", "--storage-options", f'{{"endpoint_url": "{DEAD_ENDPOINT}"}}'], {}),
    ],
    ids=[
        "flag",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3 first",
        "flag over variable",
        "options over variable",
        "flag over options",
    ],
)
def test_endpoint_url_from_the_flag_or_the_environment(
    flags: list[str],
    variables: dict[str, str],
    aws: pytest.MonkeyPatch,
    url: str,
    s3_server: LocalS3Server,
    s3_requests: RequestLog,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in variables.items():
        aws.setenv(name, value.replace("{endpoint}", s3_server.endpoint_url))
    arguments = [flag.replace("{endpoint}", s3_server.endpoint_url) for flag in flags]
    tree = _ls(capsys, url, *arguments)
    assert tree["results"] == 1 and tree["tenants"][0]["tenant"] == "acme"
    assert s3_requests.snapshot(), "the listing did not reach the local server"


@pytest.mark.s3
@pytest.mark.parametrize(
    ("flags", "variables", "region"),
    [
        (["--region", "eu-west-1"], {}, "eu-west-1"),
        ([], {"AWS_REGION": "eu-north-1"}, "eu-north-1"),
        ([], {"AWS_DEFAULT_REGION": "ap-south-1"}, "ap-south-1"),
        ([], {"AWS_REGION": "eu-north-1", "AWS_DEFAULT_REGION": "ap-south-1"}, "eu-north-1"),
        (["--region", "us-west-2"], {"AWS_REGION": "eu-north-1"}, "us-west-2"),
        (
            ["--storage-options", '{"client_kwargs": {"region_name": "sa-east-1"}}'],
            {"AWS_REGION": "eu-north-1"},
            "sa-east-1",
        ),
    ],
    ids=["flag", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_REGION first", "flag over variable", "options over variable"],
)
def test_region_from_the_flag_or_the_environment_signs_the_requests(
    flags: list[str],
    variables: dict[str, str],
    region: str,
    aws: pytest.MonkeyPatch,
    url: str,
    s3_server: LocalS3Server,
    s3_requests: RequestLog,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in variables.items():
        aws.setenv(name, value)
    tree = _ls(capsys, url, "--endpoint-url", s3_server.endpoint_url, *flags)
    assert tree["results"] == 1
    assert _signed(s3_requests) == {(s3_server.storage_options()["key"], region)}


@pytest.mark.s3
@pytest.mark.parametrize("how", ["flag", "AWS_PROFILE"])
def test_profile_from_the_flag_or_the_environment_gives_its_credentials_and_region(
    how: str,
    aws: pytest.MonkeyPatch,
    url: str,
    s3_server: LocalS3Server,
    s3_requests: RequestLog,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Only the profile holds credentials here, so a listing that works was signed with the profile's key.
    aws.delenv("AWS_ACCESS_KEY_ID")
    aws.delenv("AWS_SECRET_ACCESS_KEY")
    if how == "flag":
        flags = ["--profile", "cli-test"]
    else:
        aws.setenv("AWS_PROFILE", "cli-test")
        flags = []
    tree = _ls(capsys, url, "--endpoint-url", s3_server.endpoint_url, *flags)
    assert tree["results"] == 1
    assert _signed(s3_requests) == {(PROFILE_KEY, "eu-central-1")}


@pytest.mark.s3
def test_the_s3_flags_work_on_every_store_command(
    aws: pytest.MonkeyPatch,
    url: str,
    s3_server: LocalS3Server,
    s3_requests: RequestLog,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    flags = ["--endpoint-url", s3_server.endpoint_url, "--region", "eu-west-3"]
    [record] = FsspecToolResultStore(url, storage_options=s3_server.storage_options()).list()
    s3_requests.clear()
    assert main(["cat", url, record.reference, *flags, "-o", str(tmp_path / "out.txt")]) == 0
    assert (tmp_path / "out.txt").read_text() == "hello from S3"
    assert main(["du", url, *flags, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == 1
    assert main(["audit", url, *flags, "--tenant", "acme", "--session", "chat-1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["purge", url, *flags, "--tenant", "acme", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == 1
    assert {region for _, region in _signed(s3_requests)} == {"eu-west-3"}


@pytest.mark.s3
def test_the_demo_takes_the_s3_flags(
    aws: pytest.MonkeyPatch, s3_server: LocalS3Server, s3_requests: RequestLog, capsys: pytest.CaptureFixture[str]
) -> None:
    store = f"{s3_server.bucket_url}/{uuid.uuid4().hex}"
    arguments = ["--store", store, "--tenants", "acme", "--sessions", "1", "--json"]
    assert main(["demo", *arguments, "--endpoint-url", s3_server.endpoint_url, "--region", "eu-south-1"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert {region for _, region in _signed(s3_requests)} == {"eu-south-1"}


def test_serve_passes_the_s3_flags_to_its_workers(
    aws: pytest.MonkeyPatch, s3_server: LocalS3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    # serve checks its store before it starts (one listing), so the flags name a live endpoint and a real profile.
    monkeypatch = aws
    import uvicorn

    from offload_haystack_app.server.settings import ServerSettings

    # `serve` hands its settings to the worker processes through OFFLOAD_SERVER_* variables: undo them afterwards.
    # Set first, then delete: monkeypatch undoes only what it recorded, and deleting an unset variable records
    # nothing, so what `serve` sets would otherwise leak into every later test's server processes.
    for name in ServerSettings.model_fields:
        monkeypatch.setenv(f"OFFLOAD_SERVER_{name.upper()}", "")
        monkeypatch.delenv(f"OFFLOAD_SERVER_{name.upper()}")
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-north-1")  # a default the flag overrides
    started: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: started.append(kwargs))
    flags = ["--endpoint-url", s3_server.endpoint_url, "--profile", "cli-test", "--region", "eu-west-1"]
    assert main(["serve", "--store", f"{s3_server.bucket_url}/prod", *flags]) == 0
    assert started and "demo tokens" in capsys.readouterr().out
    settings = ServerSettings()  # what a worker reads back
    assert settings.resolved_storage_options() == {
        "endpoint_url": s3_server.endpoint_url,
        "profile": "cli-test",
        "client_kwargs": {"region_name": "eu-west-1"},
    }


@pytest.mark.parametrize("bad", ["no-bucket", "memory-workers"])
def test_serve_stops_in_one_line_on_a_store_it_cannot_use(
    bad: str, aws: pytest.MonkeyPatch, s3_server: LocalS3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    started: list[dict[str, Any]] = []
    aws.setattr(uvicorn, "run", lambda *args, **kwargs: started.append(kwargs))
    if bad == "no-bucket":
        arguments = ["--store", "s3://no-such-bucket-here/prod", "--endpoint-url", s3_server.endpoint_url]
    else:
        arguments = ["--store", "memory://serve-check", "--workers", "2"]
    assert main(["serve", *arguments]) == 2
    error = capsys.readouterr().err.strip()
    assert started == [] and len(error.splitlines()) == 1 and "Traceback" not in error
    assert ("does not exist" in error) if bad == "no-bucket" else ("memory://" in error)


def _user_agents(requests: RequestLog) -> set[str]:
    return {(request.header("user-agent") or "").split("/", 1)[0] for request in requests.snapshot()}


@pytest.mark.s3
def test_every_store_command_runs_on_the_engine_asked_for(
    aws: pytest.MonkeyPatch,
    url: str,
    s3_server: LocalS3Server,
    s3_requests: RequestLog,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # Which client sent a request shows in its User-Agent: obstore's Rust client, or aiobotocore (s3fs).
    [record] = FsspecToolResultStore(url, storage_options=s3_server.storage_options()).list()
    for engine, client in (("obstore", "object_store"), ("fsspec", "aiobotocore")):
        s3_requests.clear()
        # The S3 flags reach either engine: every request is signed for the region given.
        flags = ["--endpoint-url", s3_server.endpoint_url, "--region", "eu-west-3", "--engine", engine]
        assert _ls(capsys, url, *flags)["results"] == 1
        assert main(["du", url, *flags, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["results"] == 1
        assert main(["cat", url, record.reference, *flags, "-o", str(tmp_path / f"{engine}.txt")]) == 0
        assert (tmp_path / f"{engine}.txt").read_text() == "hello from S3"
        assert main(["audit", url, *flags, "--tenant", "acme", "--session", "chat-1", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == []
        assert main(["purge", url, *flags, "--tenant", "acme", "--dry-run", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["results"] == 1
        assert _user_agents(s3_requests) == {client}
        assert {region for _, region in _signed(s3_requests)} == {"eu-west-3"}
    # And a purge through obstore deletes.
    flags = ["--endpoint-url", s3_server.endpoint_url, "--engine", "obstore"]
    s3_requests.clear()
    assert main(["purge", url, *flags, "--tenant", "acme", "--yes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["deleted"] == 1
    assert _user_agents(s3_requests) == {"object_store"}
    assert FsspecToolResultStore(url, storage_options=s3_server.storage_options()).list() == []


@pytest.mark.s3
def test_the_obstore_engine_takes_its_endpoint_from_the_environment(
    aws: pytest.MonkeyPatch, url: str, s3_server: LocalS3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    aws.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    assert _ls(capsys, url, "--engine", "obstore")["results"] == 1


@pytest.mark.s3
def test_the_obstore_engine_shows_progress_on_standard_error(
    aws: pytest.MonkeyPatch, url: str, s3_server: LocalS3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["du", url, "--endpoint-url", s3_server.endpoint_url, "--engine", "obstore", "--json", "--progress"])
    captured = capsys.readouterr()
    assert code == 0 and json.loads(captured.out)["results"] == 1
    started, ended = captured.err.splitlines()
    assert started == f"listing {url}/ ..." and ended.startswith(f"listed 1 object(s) of {url}/ in ")


@pytest.mark.s3
def test_a_missing_bucket_on_the_obstore_engine_is_one_line(
    aws: pytest.MonkeyPatch, s3_server: LocalS3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["ls", "s3://no-such-bucket-here/x", "--endpoint-url", s3_server.endpoint_url, "--engine", "obstore"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert len(captured.err.splitlines()) == 1 and "Traceback" not in captured.err, captured.err
