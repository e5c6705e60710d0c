"""offload_context builds the per-run hook_context Haystack's hooks read the store from."""

import pytest
from haystack.hooks.tool_result_offloading import RESULT_STORE_CONTEXT_KEY

from haystack_integrations.offload import FsspecToolResultStore, offload_context


def test_puts_the_store_under_haystacks_key_with_extras() -> None:
    store = FsspecToolResultStore("memory://ctx").for_session("acme", "chat-1")
    context = offload_context(store, approval_channel="ws")
    assert context == {RESULT_STORE_CONTEXT_KEY: store, "approval_channel": "ws"}
    assert offload_context(store) is not offload_context(store)  # a fresh dict per run


def test_rejects_things_that_are_not_stores() -> None:
    with pytest.raises(TypeError, match="needs a ToolResultStore"):
        offload_context("s3://bucket/prefix")  # type: ignore[arg-type]


def test_rejects_a_second_store_in_extras() -> None:
    store = FsspecToolResultStore("memory://ctx")
    with pytest.raises(TypeError, match="first argument"):
        offload_context(store, **{RESULT_STORE_CONTEXT_KEY: store})
