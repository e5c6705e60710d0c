"""The default engine: obstore for s3:// wherever it can serve the configuration, s3fs with a reason elsewhere."""

import http.server
import json
import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from haystack_integrations.offload import FsspecToolResultStore, StoragePermissionError
from haystack_integrations.offload.stores import engines
from haystack_integrations.offload.stores.aws import bucket_region
from haystack_integrations.offload.stores.obstore_io import obstore_settings

AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION")


@pytest.fixture(autouse=True)
def _fresh_fallback_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "_fallbacks_logged", set())


def test_s3_takes_obstore_by_default_and_to_dict_keeps_what_was_asked() -> None:
    store = FsspecToolResultStore("s3://bucket/prefix", storage_options={"endpoint_url": "http://127.0.0.1:9"})
    assert (store.engine, store.resolved_engine) == ("auto", "obstore")
    data = json.loads(json.dumps(store.for_session("acme", "chat-1").to_dict()))
    assert data["init_parameters"]["engine"] == "auto"
    restored = FsspecToolResultStore.from_dict(data)
    assert (restored.engine, restored.resolved_engine, restored.scope) == ("auto", "obstore", ("acme", "chat-1"))


def test_other_protocols_and_filesystem_objects_stay_on_fsspec() -> None:
    from fsspec.implementations.memory import MemoryFileSystem

    for store in (
        FsspecToolResultStore("memory://engine-choice"),
        FsspecToolResultStore("/x", filesystem=MemoryFileSystem()),
    ):
        assert store.resolved_engine == "fsspec" and "obstore serves s3:// only" in store.engine_choice.reason


def test_an_option_obstore_cannot_serve_falls_back_to_s3fs_with_its_reason_logged_once_per_root(
    caplog: pytest.LogCaptureFixture,
) -> None:
    options = {"endpoint_url": "http://127.0.0.1:9", "config_kwargs": {"proxies": {"http": "http://proxy:3128"}}}
    with caplog.at_level(logging.INFO, logger=engines.__name__):
        roots = [FsspecToolResultStore("s3://bucket/prefix", storage_options=options) for _ in range(3)]
        sessions = [root.for_session("acme", f"chat-{n}") for n, root in enumerate(roots)]
    assert {session.resolved_engine for session in sessions} == {"fsspec"}
    assert "config_kwargs['proxies']" in roots[0].engine_choice.reason
    assert [record.getMessage() for record in caplog.records] == [
        "The store s3://bucket/prefix uses the fsspec engine (s3fs): storage option(s) config_kwargs['proxies'] have "
        "no obstore counterpart."
    ]
    # Named, the fast engine still refuses what it cannot serve.
    with pytest.raises(ValueError, match=r"config_kwargs\['proxies'\] not supported by the obstore engine"):
        FsspecToolResultStore("s3://bucket/prefix", storage_options=options, engine="obstore")


def _profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profiles: dict[str, tuple[str, str]]) -> None:
    credentials = "".join(
        f"[{name}]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
        for name, (key, secret) in profiles.items()
    )
    config = "".join(f"[profile {name}]\nregion = eu-west-3\n" for name in profiles)
    (tmp_path / "credentials").write_text(credentials)
    (tmp_path / "config").write_text(config)
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))


def test_a_profile_is_read_through_botocore_for_obstore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _profiles(tmp_path, monkeypatch, {"team": ("AKIATEAM", "team-secret")})
    settings = obstore_settings({"profile": "team"}, retrying=True, attempt_timeout=None)
    assert settings.credential_provider is not None
    assert settings.credential_provider()["access_key_id"] == "AKIATEAM"
    assert settings.config["region"] == "eu-west-3"  # the profile's region, as s3fs would take it
    monkeypatch.setenv("AWS_PROFILE", "team")  # no keys anywhere: AWS_PROFILE is read the same way
    assert obstore_settings({}, retrying=True, attempt_timeout=None).credential_provider is not None
    assert FsspecToolResultStore("s3://bucket/x", storage_options={"profile": "team"}).resolved_engine == "obstore"


def test_a_profile_signs_real_requests_on_every_server(
    s3_endpoint: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = s3_endpoint.storage_options()
    key, secret = options.pop("key"), options.pop("secret")
    _profiles(tmp_path, monkeypatch, {"team": (key, secret), "wrong": (key, "not-the-secret")})
    url = f"{s3_endpoint.bucket_url}/{uuid.uuid4().hex}"
    store = FsspecToolResultStore(url, storage_options={**options, "profile": "team"}).for_session("acme", "chat-1")
    assert store.resolved_engine == "obstore"
    reference = store.write(key="k.txt", content="signed with the profile's keys")
    assert store.read(reference) == "signed with the profile's keys"
    if s3_endpoint.checks_signatures:
        wrong = FsspecToolResultStore(url, storage_options={**options, "profile": "wrong"}).for_session("acme", "c")
        with pytest.raises(StoragePermissionError):
            wrong.write(key="k.txt", content="x")


class _RegionAnswer(http.server.BaseHTTPRequestHandler):
    asked: ClassVar[list[str]] = []

    def do_HEAD(self) -> None:
        type(self).asked.append(self.path)
        self.send_response(301)  # what AWS answers for a bucket in another region
        self.send_header("x-amz-bucket-region", "ap-southeast-2")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def region_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RegionAnswer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_bucket_region_is_asked_once_when_nothing_configures_it(
    region_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (*AWS_VARIABLES, "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    assert bucket_region("team-results", endpoint=region_server) == "ap-southeast-2"
    assert _RegionAnswer.asked[-1] == "/team-results"
    assert obstore_settings({"key": "k", "secret": "s"}, retrying=True, attempt_timeout=None).region_from_bucket
    configured = {"key": "k", "secret": "s", "client_kwargs": {"region_name": "eu-west-1"}}
    assert not obstore_settings(configured, retrying=True, attempt_timeout=None).region_from_bucket
    assert bucket_region("team-results", endpoint="http://127.0.0.1:9", timeout=1) is None  # nobody answers
