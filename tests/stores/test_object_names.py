"""A reference's name is checked without being parsed: the check agrees with the parser on every kind of name."""

from datetime import UTC, datetime

import pytest

from haystack_integrations.offload.stores.names import is_object_name, new_object_name, parse_object_name

NAMES = [
    new_object_name(key="1_fetch_call.bin", kind="bytes", tool_name="fetch"),
    new_object_name(key="k.txt", kind="text", tool_name=None),
    new_object_name(key="k", kind="text", tool_name="t", now=datetime(1970, 1, 1, tzinfo=UTC)),
    new_object_name(key="k", kind="text", tool_name="t", now=datetime(9999, 12, 31, 23, 59, tzinfo=UTC)),
    "000000000000000000-5f3a9c1e.t.tool.key.txt",  # the countdown's last microsecond
    "099999999999999999-5f3a9c1e.t.tool.key.txt",  # its first
    "20261129T213400123456Z-5f3a9c1e.t.tool.key.txt",  # the old layout's stamp
    "20261399T213400123456Z-5f3a9c1e.t.tool.key.txt",  # a stamp that is no date
    "20261129T256100123456Z-5f3a9c1e.b..key",
    "20261129T213400123456Z-5f3a9c1e.x.tool.key",  # no such kind
    "00000000000000000-5f3a9c1e.t.tool.key",  # a digit short
    "099999999999999999-5F3A9C1E.t.tool.key",  # an upper-case nonce
    "099999999999999999-5f3a9c1e.t.tool.",  # no key
    "..",
    "",
]


@pytest.mark.parametrize("name", NAMES, ids=range(len(NAMES)))  # written names differ per run
def test_the_check_agrees_with_the_parser(name: str) -> None:
    assert is_object_name(name) is (parse_object_name(name) is not None)


def test_names_this_library_writes_pass_and_others_do_not() -> None:
    verdicts = [is_object_name(name) for name in NAMES]
    assert verdicts[:7] == [True] * 7
    assert not any(verdicts[7:])
