"""
`ls` of a root and `ls --tenant` from usage marks and listings by delimiter (issue 42): the same requests at any size,
instead of a walk of every object; ``--exact``, ``-R``, a tenant with no mark or a root without marks walk as before.
`find_children` (the delimiter listing) on each engine, counted on moto's server.
"""

import json
import uuid
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore, Quota
from haystack_integrations.offload.cli import main
from haystack_integrations.offload.testing.local_s3 import LocalS3Server, RequestLog
from support.seeding import seed_results

pytestmark = pytest.mark.s3

LISTS = {"method": "GET", "query_contains": "list-type"}


def _marked_tenant(server: LocalS3Server, count: int) -> tuple[str, list[str]]:
    """A root whose tenant acme holds `count` results in sessions of 50, then one quota'd write (its first mark)."""
    prefix = f"ls-summary-{uuid.uuid4().hex}"
    seed_results(server, prefix, count, per_session=50, body=b"xy")
    url = f"{server.bucket_url}/{prefix}"
    writer = FsspecToolResultStore(url, storage_options=server.storage_options(), quota=Quota(tenant_results=10**6))
    writer.for_session("acme", "new-chat").write(key="k.txt", content="abc")
    sessions = sorted([f"chat-{index}" for index in range((count + 49) // 50)] + ["new-chat"])
    return url, sessions


def _ls(capsys: pytest.CaptureFixture[str], server: LocalS3Server, url: str, *flags: str) -> Any:
    options = json.dumps(server.storage_options())
    assert main(["ls", url, "--storage-options", options, "--tenant", "acme", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("count", [40, 2_500])
def test_ls_of_a_tenant_costs_the_same_requests_at_any_size(
    s3_server: LocalS3Server, s3_requests: RequestLog, capsys: pytest.CaptureFixture[str], count: int
) -> None:
    url, sessions = _marked_tenant(s3_server, count)
    s3_requests.clear()
    summary = _ls(capsys, s3_server, url)
    # The mark (a LIST of one key, a GET) and one LIST by delimiter. Before: a walk, 1 LIST at 40 objects, 3 at 2,500.
    assert (s3_requests.count(**LISTS), len(s3_requests)) == (2, 3)
    assert len(s3_requests.filter(method="GET", query_contains="delimiter=")) == 1
    assert summary["source"] == "usage_mark" and summary["sessions"] == sessions  # no ".-usage" among them
    assert (summary["results"], summary["total_bytes"]) == (count, 2 * count)
    # --exact walks every object, and counts each session (the write the mark does not carry yet included).
    s3_requests.clear()
    exact = _ls(capsys, s3_server, url, "--exact")
    assert s3_requests.count(**LISTS) == count // 1000 + 1
    assert exact["results"] == count + 1 and len(exact["tenants"][0]["sessions"]) == len(sessions)


def test_ls_of_a_tenant_without_a_mark_walks_it(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    root = FsspecToolResultStore(str(tmp_path))  # no quota: no marks
    root.for_session("acme", "chat-1").write(key="a.txt", content="abc")
    assert main(["ls", str(tmp_path), "--tenant", "acme", "--json"]) == 0
    walked = json.loads(capsys.readouterr().out)
    assert walked["results"] == 1 and "source" not in walked


def test_ls_text_names_the_sessions_the_mark_and_how_to_count_them(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    root = FsspecToolResultStore(str(tmp_path), quota=Quota(tenant_bytes=10**9))
    for session in ("chat-2", "chat-1"):
        root.for_session("acme", session).write(key="a.txt", content="abcd")
    assert main(["ls", str(tmp_path), "--tenant", "acme"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "2 session(s)" in lines[0]
    assert lines[1:3] == ["  chat-1/", "  chat-2/"]
    assert "usage mark #" in lines[3] and "--exact" in lines[3]


def _marked_root(server: LocalS3Server, per_tenant: int) -> str:
    """A root of tenants acme-0 to acme-2, each with `per_tenant` results and a mark, and globex without one."""
    prefix = f"ls-root-{uuid.uuid4().hex}"
    url = f"{server.bucket_url}/{prefix}"
    writer = FsspecToolResultStore(url, storage_options=server.storage_options(), quota=Quota(tenant_results=10**6))
    for index in range(3):
        seed_results(server, prefix, per_tenant, per_session=50, body=b"xy", tenant=f"acme-{index}")
        writer.for_session(f"acme-{index}", "new-chat").write(key="k.txt", content="abc")
    FsspecToolResultStore(url, storage_options=server.storage_options()).for_session("globex", "c").write(
        key="g.txt", content="abcd"
    )
    return url


@pytest.mark.parametrize("per_tenant", [20, 1_100])
def test_ls_of_a_root_costs_the_same_requests_at_any_size(
    s3_server: LocalS3Server, s3_requests: RequestLog, capsys: pytest.CaptureFixture[str], per_tenant: int
) -> None:
    url = _marked_root(s3_server, per_tenant)
    options = json.dumps(s3_server.storage_options())
    s3_requests.clear()
    assert main(["ls", url, "--storage-options", options, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # One LIST by delimiter, each tenant's mark (a LIST of one key, a GET; globex has none: its LIST, and its walk).
    # Before: a walk of the root, 1 LIST at 64 objects, 4 at 3,304.
    assert (s3_requests.count(**LISTS), len(s3_requests)) == (1 + 4 + 1, 1 + 4 + 1 + 3)
    assert [tenant.get("tenant") for tenant in summary["tenants"]] == ["acme-0", "acme-1", "acme-2", "globex"]
    assert [tenant["source"] for tenant in summary["tenants"]] == ["usage_mark"] * 3 + ["listing"]
    assert summary["results"] == 3 * per_tenant + 1 and summary["source"] == "usage_marks"
    s3_requests.clear()
    assert main(["ls", url, "--storage-options", options, "--json", "--exact"]) == 0
    exact = json.loads(capsys.readouterr().out)
    assert exact["results"] == 3 * (per_tenant + 1) + 1 and "source" not in exact


def test_ls_of_a_root_without_marks_walks_it(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    root = FsspecToolResultStore(str(tmp_path))  # no quota: no marks
    for tenant in ("acme", "globex"):
        root.for_session(tenant, "chat-1").write(key="a.txt", content="abc")
    assert main(["ls", str(tmp_path), "--json"]) == 0
    walked = json.loads(capsys.readouterr().out)
    assert walked["results"] == 2 and "source" not in walked


@pytest.mark.parametrize("engine", ["obstore", "fsspec"])
def test_find_children_lists_by_delimiter_one_list_per_thousand(
    s3_server: LocalS3Server, s3_requests: RequestLog, engine: str
) -> None:
    prefix = f"children-{uuid.uuid4().hex}"
    seed_results(s3_server, prefix, 1_001, per_session=1)  # 1,001 sessions of one result: two pages of prefixes
    root = FsspecToolResultStore(
        f"{s3_server.bucket_url}/{prefix}", storage_options=s3_server.storage_options(), engine=engine
    )
    s3_requests.clear()
    tenant = root.for_tenant("acme").find_children()
    assert s3_requests.count(**LISTS) == 2
    assert tenant.directories == sorted(f"chat-{index}" for index in range(1_001)) and tenant.objects == {}
    s3_requests.clear()
    below_root = root.find_children()
    assert s3_requests.count(**LISTS) == 1 and below_root.directories == ["acme"]


@pytest.mark.parametrize("where", ["memory", "local"])
def test_find_children_elsewhere_gives_the_same_answer(tmp_path: Any, where: str) -> None:
    url = f"memory://children-{uuid.uuid4().hex}" if where == "memory" else str(tmp_path)
    root = FsspecToolResultStore(url)
    for session in ("b", "a"):
        root.for_session("acme", session).write(key="x.txt", content="x")
    session = root.for_session("acme", "a")
    children = session.find_children()
    assert root.for_tenant("acme").find_children().directories == ["a", "b"]
    assert children.directories == [] and len(children.objects) == 1
    assert root.find_children().directories == ["acme"]
