"""
`du --tenant` from the tenant's newest usage mark (issue 42): two requests at any tenant size, instead of a walk of
every object; ``--exact`` (or a tenant with no mark) walks as before. Counted on moto's server.
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


def _seeded_tenant(server: LocalS3Server, count: int) -> str:
    """A root whose tenant acme holds `count` results put straight into the bucket, then one quota'd write (a mark)."""
    prefix = f"du-summary-{uuid.uuid4().hex}"
    seed_results(server, prefix, count, per_session=50, body=b"xy")
    url = f"{server.bucket_url}/{prefix}"
    # The tenant's first quota'd write ever reconciles: its mark counts what was stored before the write, which the
    # writer's next mark will carry (a writer marks at most its allowance late).
    quota = Quota(tenant_results=1_000_000)
    writer = FsspecToolResultStore(url, storage_options=server.storage_options(), quota=quota)
    writer.for_session("acme", "new-chat").write(key="k.txt", content="abc")
    return url


def _du(capsys: pytest.CaptureFixture[str], server: LocalS3Server, url: str, *flags: str) -> Any:
    options = json.dumps(server.storage_options())
    assert main(["du", url, "--storage-options", options, "--tenant", "acme", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("count", [40, 2_500])
def test_du_of_a_tenant_reads_its_usage_mark_in_two_requests_at_any_size(
    s3_server: LocalS3Server, s3_requests: RequestLog, capsys: pytest.CaptureFixture[str], count: int
) -> None:
    url = _seeded_tenant(s3_server, count)
    s3_requests.clear()
    summary = _du(capsys, s3_server, url)
    # Before, du listed the whole tenant: 1 LIST at 40 objects, 3 at 2,500.
    assert (s3_requests.count(method="GET", query_contains="list-type"), len(s3_requests)) == (1, 2)
    assert summary["source"] == "usage_mark" and (summary["results"], summary["total_bytes"]) == (count, 2 * count)
    assert summary["reconciled"] is not None
    # --exact walks every object, the write not yet marked included.
    s3_requests.clear()
    exact = _du(capsys, s3_server, url, "--exact")
    assert s3_requests.count(method="GET", query_contains="list-type") == count // 1000 + 1
    assert (exact["results"], exact["total_bytes"]) == (count + 1, 2 * count + 3)


def test_du_of_a_tenant_without_a_mark_walks_it(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    root = FsspecToolResultStore(str(tmp_path))  # no quota: no marks
    root.for_session("acme", "chat-1").write(key="a.txt", content="abc")
    assert main(["du", str(tmp_path), "--tenant", "acme", "--json"]) == 0
    walked = json.loads(capsys.readouterr().out)
    assert walked["results"] == 1 and "source" not in walked and walked["tenants"][0]["tenant"] == "acme"


def test_du_text_names_the_mark_and_how_to_walk(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    FsspecToolResultStore(str(tmp_path), quota=Quota(tenant_bytes=10**9)).for_session("acme", "c").write(
        key="a.txt", content="abcd"
    )
    assert main(["du", str(tmp_path), "--tenant", "acme"]) == 0
    out = capsys.readouterr().out
    assert "usage mark #0" in out and "--exact" in out and "acme" in out.splitlines()[2]
