"""The Ceph RGW harness: a real S3 server that starts, answers boto3 and s3fs, and leaves nothing behind."""

import http.client
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import s3fs
from botocore.exceptions import ClientError

from support import ceph_rgw
from support.ceph_rgw import CephRGWServer, ceph_available

pytestmark = [pytest.mark.rgw]


def _require_ceph() -> None:
    missing = ceph_available()
    if missing is None:
        return
    # In CI a missing Ceph is a broken image, not a reason to pass quietly.
    if os.environ.get("CI"):
        pytest.fail(missing)
    pytest.skip(missing)


@pytest.fixture(scope="module")
def server() -> Iterator[CephRGWServer]:
    _require_ceph()
    with CephRGWServer() as running:
        yield running


@pytest.fixture
def fresh() -> None:
    """For tests that start servers of their own."""
    _require_ceph()


@pytest.fixture
def prefix() -> str:
    return f"harness-{uuid.uuid4().hex}"


@pytest.fixture
def fs(server: CephRGWServer) -> Iterator[s3fs.S3FileSystem]:
    # A private, synchronous instance: whatever it caches dies with the test.
    filesystem = s3fs.S3FileSystem(skip_instance_cache=True, **server.storage_options())
    yield filesystem
    if filesystem._s3 is not None:
        filesystem.close_session(filesystem.loop, filesystem._s3creator)


def _processes_mentioning(directory: Path) -> list[int]:
    # Every daemon (and the watchdog) has the folder on its command line, so this finds them even after a pid is gone
    # from the server's own records.
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command_line = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if str(directory).encode() in command_line and state != "Z":
            found.append(int(entry.name))
    return found


def test_boto3_round_trip(server: CephRGWServer, prefix: str) -> None:
    client = server.client()
    body = bytes(range(256)) * 40

    client.put_object(Bucket=server.bucket, Key=f"{prefix}/blob.bin", Body=body)

    assert client.get_object(Bucket=server.bucket, Key=f"{prefix}/blob.bin")["Body"].read() == body
    ranged = client.get_object(Bucket=server.bucket, Key=f"{prefix}/blob.bin", Range="bytes=1000-1999")
    assert ranged["Body"].read() == body[1000:2000]


def test_a_second_conditional_create_is_refused_with_412(server: CephRGWServer, prefix: str) -> None:
    client = server.client()
    client.put_object(Bucket=server.bucket, Key=f"{prefix}/once", Body=b"first", IfNoneMatch="*")

    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket=server.bucket, Key=f"{prefix}/once", Body=b"second", IfNoneMatch="*")

    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    assert client.get_object(Bucket=server.bucket, Key=f"{prefix}/once")["Body"].read() == b"first"


def test_s3fs_pipes_and_cats(server: CephRGWServer, fs: s3fs.S3FileSystem, prefix: str) -> None:
    path = f"{server.bucket}/{prefix}/result.txt"

    fs.pipe_file(path, b"hello from s3fs", mode="create")

    assert fs.cat_file(path) == b"hello from s3fs"
    assert fs.cat_file(path, start=6, end=10) == b"from"
    # RGW's 412 names no condition, so s3fs cannot tell it for "exists": a plain OSError, the 412 in its cause.
    with pytest.raises(OSError) as refused:
        fs.pipe_file(path, b"again", mode="create")
    cause = refused.value.__cause__
    assert isinstance(cause, ClientError)
    assert cause.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert fs.cat_file(path) == b"hello from s3fs"


def test_the_connection_is_kept_alive(server: CephRGWServer) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("GET", "/")
        first = connection.getresponse()
        first.read()
        sock = connection.sock

        connection.request("GET", "/")
        second = connection.getresponse()
        second.read()

        assert (first.status, second.status) == (200, 200)
        assert not first.will_close
        assert sock is not None and connection.sock is sock
    finally:
        connection.close()


def test_settings_point_at_the_server(server: CephRGWServer) -> None:
    options = server.storage_options()
    options["client_kwargs"]["region_name"] = "changed"

    assert server.storage_options()["client_kwargs"] == {"region_name": "us-east-1"}
    assert server.bucket_url == f"s3://{server.bucket}"
    assert server.endpoint_url == f"http://127.0.0.1:{server.port}"
    environment = server.environment()
    assert environment["AWS_ENDPOINT_URL"] == server.endpoint_url
    assert (environment["AWS_ACCESS_KEY_ID"], environment["AWS_SECRET_ACCESS_KEY"]) == (
        options["key"],
        options["secret"],
    )


def test_stop_leaves_no_daemon_and_no_folder(fresh: None) -> None:
    server = CephRGWServer().start()
    directory, pids = server.directory, server.pids
    assert set(pids) == {"mon.a", "osd.0", "client.rgw.test"}
    assert set(pids.values()) <= set(_processes_mentioning(directory))

    server.stop()
    server.stop()

    assert _processes_mentioning(directory) == []
    assert not directory.exists()
    assert server.pids == {}
    with pytest.raises(RuntimeError, match="not running"):
        server.endpoint_url  # noqa: B018 - the property is what raises


def test_two_servers_run_side_by_side(server: CephRGWServer, fresh: None, prefix: str) -> None:
    with CephRGWServer(bucket="second-bucket") as other:
        assert other.port != server.port
        assert other.directory != server.directory
        assert other.storage_options()["key"] != server.storage_options()["key"]

        other.client().put_object(Bucket=other.bucket, Key=f"{prefix}/only-here", Body=b"other")
        server.client().put_object(Bucket=server.bucket, Key=f"{prefix}/only-here", Body=b"first")

        assert other.client().get_object(Bucket=other.bucket, Key=f"{prefix}/only-here")["Body"].read() == b"other"
        assert server.client().get_object(Bucket=server.bucket, Key=f"{prefix}/only-here")["Body"].read() == b"first"
        buckets = {bucket["Name"] for bucket in other.client().list_buckets()["Buckets"]}
        assert buckets == {"second-bucket"}


def test_a_failed_start_names_the_step_and_leaves_nothing(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    real_mkdtemp = ceph_rgw.tempfile.mkdtemp

    def recording_mkdtemp(**kwargs: str) -> str:
        made.append(real_mkdtemp(**kwargs))
        return made[-1]

    monkeypatch.setattr(ceph_rgw.tempfile, "mkdtemp", recording_mkdtemp)

    # No step of a real start fits in a millisecond, so the first wait gives up.
    with pytest.raises(RuntimeError, match=r"Ceph RGW start, step '[^']+': not done after 0 s"):
        CephRGWServer(timeout=0.001).start()

    (directory,) = map(Path, made)
    assert _processes_mentioning(directory) == []
    assert not directory.exists()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="memstore_bytes"):
        CephRGWServer(memstore_bytes=0)


def test_ceph_available_names_the_missing_binary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")

    message = ceph_available()

    assert message is not None
    assert message.startswith("ceph-authtool is not installed")
    assert "apt-get install -y --no-install-recommends ceph-mon ceph-osd radosgw ceph-common" in message
