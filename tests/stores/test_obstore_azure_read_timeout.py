"""
The obstore engine on Azure honours adlfs's ``read_timeout``: an answer Azure withholds fails after it, per read, and
the store's next attempt gets the answer (the approvals' fault run on Azurite waited a whole attempt instead).
"""

import uuid
from typing import Any

import pytest

from haystack_integrations.offload import FsspecToolResultStore, RetryPolicy
from haystack_integrations.offload.stores.obstore_azure import azure_settings
from haystack_integrations.offload.testing.faults import Fault, FaultProxy

pytest.importorskip("obstore")

# No attempt limit: only the read timeout can end the withheld answer before the proxy's hold closes the connection.
POLICY = RetryPolicy(attempts=2, base_delay=0, max_delay=0, deadline=None, attempt_timeout=None)
HOLD_SECONDS = 5.0


def test_read_timeout_becomes_object_stores_per_read_timeout() -> None:
    settings = azure_settings(
        {"account_name": "acct", "read_timeout": 1, "connection_timeout": 2}, retrying=True, attempt_timeout=None
    )
    assert settings.client_options["read_timeout"].total_seconds() == 1.0
    assert settings.client_options["connect_timeout"].total_seconds() == 2.0
    assert "timeout" not in settings.client_options  # no whole-request bound unless the policy sets one


@pytest.mark.parametrize("size", [1_000, 1_000_000])
def test_a_withheld_answer_fails_after_the_read_timeout_and_the_retry_reads_it(azurite_server: Any, size: int) -> None:
    from support.azurite import ACCOUNT

    with FaultProxy(f"http://127.0.0.1:{azurite_server.port}", hold_seconds=HOLD_SECONDS) as proxy:
        through = azurite_server.connection_string().replace(azurite_server.endpoint, f"{proxy.endpoint_url}/{ACCOUNT}")
        store = FsspecToolResultStore(
            f"az://{azurite_server.new_container()}/{uuid.uuid4().hex}",
            storage_options={"connection_string": through, "read_timeout": 0.5},
            engine="obstore",
            retry=POLICY,
        )
        session = store.for_session("acme", "chat-1")
        reference = session.write(key="k.txt", content="x" * size)
        before = len(proxy.requests.snapshot())
        proxy.inject(Fault.READ_TIMEOUT, method="GET")
        assert session.read(reference) == "x" * size
        sent = [request.method for request in proxy.requests.snapshot()[before:]]
    # The withheld GET ended by the client's read timeout (the proxy's hold would have closed it as a dropped
    # connection), then one more GET.
    assert sent == ["GET", "GET"]
    assert store.retry_stats.as_dict()["causes"] == {"timeout": 1}
