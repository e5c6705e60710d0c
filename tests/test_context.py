"""context.py owns what a run's hook_context holds: offload_context builds it, hooks and tools read it from there."""

import subprocess
import sys

import pytest
from haystack.components.agents.state.state import State
from haystack.hooks.tool_result_offloading import RESULT_STORE_CONTEXT_KEY

import haystack_integrations.offload.context as context
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


# One owner of what a run's hook_context holds: the keys, the reads, and the context a resumed run goes on with.


class _Store:
    """A minimal ToolResultStore (write and read), scoped to a session like a `types.SessionDocumentSource`."""

    def __init__(self, scope: str = "acme/chat-1") -> None:
        self.tenant, self.session = scope.split("/")

    def documents(self, namespace: str) -> object:
        raise NotImplementedError  # resume_context only compares scopes

    def write(self, *, key: str, content: str | bytes) -> str:
        return key

    def read(self, reference: str) -> str:
        return reference


def _state(hook_context: object = None) -> State:
    return State(schema={"hook_context": {"type": dict}}, data={"hook_context": hook_context})


def test_the_keys_live_here_and_stay_importable_where_they_were() -> None:
    from haystack_integrations.offload import APPROVAL_CHANNEL_KEY as public_key
    from haystack_integrations.offload.approvals import APPROVAL_CHANNEL_KEY as approvals_key
    from haystack_integrations.offload.approvals.channels import APPROVAL_CHANNEL_KEY as channels_key
    from haystack_integrations.offload.approvals.resume import RESUMING_KEY as resuming_key

    assert context.RESULT_STORE_CONTEXT_KEY is RESULT_STORE_CONTEXT_KEY
    assert public_key == approvals_key == channels_key == context.APPROVAL_CHANNEL_KEY == "approval_channel"
    assert resuming_key == context.RESUMING_KEY == "offload.resuming"


def test_importing_the_context_imports_no_other_part_of_the_library() -> None:
    code = (
        "import sys\n"
        "import haystack_integrations.offload.context\n"
        "print(sorted(m for m in sys.modules if m.startswith('haystack_integrations.offload.')))\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    # types.py holds only Protocols (a leaf, like context itself).
    loaded = completed.stdout.strip()
    assert loaded == str(["haystack_integrations.offload.context", "haystack_integrations.offload.types"])


def test_hook_context_of_is_the_runs_own_dict_and_checked() -> None:
    own = {"x": 1}
    assert context.hook_context_of(_state(own)) is own  # read from state.data, never deep-copied
    assert context.hook_context_of(_state(None)) == {}
    with pytest.raises(TypeError, match="hook_context must be a dictionary, got list"):
        context.hook_context_of(_state(["not", "a", "dict"]))


def test_run_store_prefers_the_runs_store_and_fails_loudly_without_one() -> None:
    run, fallback = _Store(), _Store()
    assert context.run_store(_state(offload_context(run)), fallback, hook_name="Hook") is run
    assert context.run_store(_state(None), fallback, hook_name="Hook") is fallback
    with pytest.raises(
        ValueError, match=r"^Hook has no store for this run: pass hook_context=offload_context\(store\)"
    ):
        context.run_store(_state({}), None, hook_name="Hook")
    with pytest.raises(TypeError, match=r"hook_context\['tool_result_store'\] must be a ToolResultStore"):
        context.run_store(_state({RESULT_STORE_CONTEXT_KEY: "s3://bucket"}), fallback, hook_name="Hook")
    with pytest.raises(TypeError, match="must be a dictionary"):
        context.run_store(_state("acme"), fallback, hook_name="Hook")


def test_tool_store_is_lenient_and_raises_the_callers_error(caplog: pytest.LogCaptureFixture) -> None:
    run, fallback = _Store(), _Store()

    class ToolError(Exception):
        pass

    assert context.tool_store(_state(offload_context(run)), fallback, tool_name="t", error=ToolError) is run
    assert context.tool_store(None, fallback, tool_name="t", error=ToolError) is fallback
    assert context.tool_store(_state("not a dict"), fallback, tool_name="t", error=ToolError) is fallback
    with pytest.raises(ToolError, match=r"^No result store is available in this run"):
        context.tool_store(_state({}), None, tool_name="reader", error=ToolError)
    assert "reader was called in a run without a result store" in caplog.text
    with pytest.raises(ToolError, match=r"^This run's result store cannot be read from\.$"):
        context.tool_store(_state({RESULT_STORE_CONTEXT_KEY: object()}), fallback, tool_name="t", error=ToolError)


def test_context_store_reads_without_checking() -> None:
    run = _Store()
    assert context.context_store(_state(offload_context(run))) is run
    assert context.context_store(None) is None
    assert context.context_store(_state(None)) is None
    assert context.context_store(_state(42)) is None


def test_resume_context_binds_the_callers_context_to_the_resumed_store() -> None:
    store = _Store()
    default = context.resume_context(store, None, default_channel=lambda: "durable")
    assert default == {RESULT_STORE_CONTEXT_KEY: store, context.APPROVAL_CHANNEL_KEY: "durable"}
    given = {"user": "u-1"}
    resumed = context.resume_context(store, given, default_channel=lambda: "unused")
    assert resumed == {"user": "u-1", RESULT_STORE_CONTEXT_KEY: store}
    assert given == {"user": "u-1"}  # the caller's dict is left alone
    same_scope = _Store()
    assert (
        context.resume_context(store, offload_context(same_scope), default_channel=dict)[RESULT_STORE_CONTEXT_KEY]
        is same_scope
    )
    with pytest.raises(ValueError, match="another scope"):
        context.resume_context(store, offload_context(_Store("globex/chat-1")), default_channel=dict)
    with pytest.raises(TypeError, match="must be a dictionary"):
        context.resume_context(store, ["x"], default_channel=dict)  # type: ignore[arg-type]
