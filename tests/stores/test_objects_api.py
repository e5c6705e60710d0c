"""The operator's view of a store: `find_objects`, `delete_objects`, `activity_times`, relative to the store's scope."""

import json
from datetime import UTC, datetime

import pytest

from haystack_integrations.offload import FsspecToolResultStore

pytestmark = [pytest.mark.engines]


def test_find_objects_names_every_object_relative_to_the_scope(store: FsspecToolResultStore) -> None:
    chat = store.for_session("acme", "chat-1")
    result = chat.write(key="k.txt", content="12345")
    chat.documents("audit").put("event.json", b"{}")
    sibling = store.for_session("acme", "chat-10").write(key="k.txt", content="x")

    assert store.find_objects() == {
        f"acme/chat-1/{result}": 5,
        "acme/chat-1/.audit/event.json": 2,
        f"acme/chat-10/{sibling}": 1,
    }
    store.for_session("acme2", "chat-1").write(key="k.txt", content="another tenant")
    assert store.for_tenant("acme").find_objects().keys() == {
        f"chat-1/{result}",
        "chat-1/.audit/event.json",
        f"chat-10/{sibling}",
    }
    # 'acme/chat-1' is a string prefix of 'acme/chat-10': only the separator tells them apart.
    assert chat.find_objects() == {result: 5, ".audit/event.json": 2}


def test_delete_objects_deletes_only_what_it_is_given(store: FsspecToolResultStore) -> None:
    chat = store.for_session("acme", "chat-1")
    doomed, kept = chat.write(key="a.txt", content="a"), chat.write(key="b.txt", content="b")
    store.delete_objects([f"acme/chat-1/{doomed}", "acme/chat-1/never-there"])
    assert store.find_objects() == {f"acme/chat-1/{kept}": 1}


@pytest.mark.parametrize("path", ["", "/etc/passwd", "acme//x", "acme/../globex/x", "./x", "acme\\x", "a\0b"])
def test_delete_objects_refuses_paths_that_could_leave_the_scope(store: FsspecToolResultStore, path: str) -> None:
    chat = store.for_session("acme", "chat-1")
    kept = chat.write(key="a.txt", content="a")
    with pytest.raises(ValueError, match="relative"):
        chat.delete_objects([kept, path])
    assert chat.find_objects() == {kept: 1}  # refused as a whole: nothing was deleted


def test_activity_times_reads_what_each_turn_says(store: FsspecToolResultStore) -> None:
    history = store.for_session("acme", "chat-1").documents("history")
    ended = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    history.put("turn.00000001.end.json", json.dumps({"ended_at": ended.isoformat()}).encode())
    history.put("turn.00000002.start.json", b"not json")
    times = store.activity_times(
        [
            "acme/chat-1/.history/turn.00000001.end.json",
            "acme/chat-1/.history/turn.00000002.start.json",
            "acme/chat-1/.history/turn.00000003.end.json",
        ]
    )
    assert times == {
        "acme/chat-1/.history/turn.00000001.end.json": ended,
        "acme/chat-1/.history/turn.00000002.start.json": None,
        "acme/chat-1/.history/turn.00000003.end.json": None,
    }
