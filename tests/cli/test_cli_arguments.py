"""
Bad arguments, every one of them: one line on standard error, a non-zero exit, nothing on standard output, and never
a traceback (in this process, through `main`, and in a real process for a few). Also ``--version``.

No test here reaches a network: S3 URLs either fail before any request, or point at a closed loopback port.
"""

import argparse
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from haystack_integrations.offload.cli import build_parser, main

DEAD_ENDPOINT = "http://127.0.0.1:9"  # the discard port: nothing listens there


@pytest.fixture(autouse=True)
def _no_aws_configuration(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No AWS variable from the machine, and empty config and credentials files, so profiles are the test's own."""
    for name in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
    ):
        monkeypatch.delenv(name, raising=False)
    empty = tmp_path / "aws-empty"
    empty.write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))


STORE = "{store}"  # replaced by an existing, empty store directory
FILE = "{file}"  # replaced by an existing file

BAD_ARGUMENTS = [
    ([], "the following arguments are required: command"),
    (["nosuch"], "invalid choice: 'nosuch'"),
    (["ls"], "the following arguments are required: url"),
    (["ls", STORE, "--bogus"], "unrecognized arguments: --bogus"),
    (["demo", "--sessions", "abc"], "'abc' is not a whole number"),
    (["demo", "--sessions", "-3"], "give from 1 to 1000"),
    (["demo", "--sessions", "1000000"], "give from 1 to 1000"),
    (["demo", "--store", FILE], "is a file"),
    (["demo", "--store", STORE, "--tenants", ","], "at least one tenant"),
    (["demo", "--store", STORE, "--endpoint-url", "http://127.0.0.1:5000"], "only applies to s3:// stores"),
    (["serve", "--port", "99999"], "give from 1 to 65535"),
    (["serve", "--workers", "0"], "give 1 or more"),
    (["serve", "--model", "gpt"], "invalid choice: 'gpt'"),
    (["serve", "--store", STORE, "--region", "eu-west-1"], "--region only applies to s3:// stores"),
    (["ls", STORE, "--session", "chat-1"], "give the tenant too"),
    (["ls", STORE, "--tenant", "../acme"], "tenant id"),
    (["ls", STORE, "--storage-options", "{"], "not valid JSON"),
    (["ls", STORE, "--storage-options", "[]"], "must be a JSON object"),
    (["ls", STORE, "--endpoint-url", "http://127.0.0.1:5000", "--profile", "p"], "only apply to s3:// stores"),
    (["ls", "s3://bucket/x", "--endpoint-url", "127.0.0.1:5000"], "--endpoint-url must be an http:// or https://"),
    (
        ["ls", "s3://bucket/x", "--storage-options", '{"endpoint_url": "127.0.0.1:39975"}'],
        "storage_options['endpoint_url'] must be an http:// or https:// URL, got '127.0.0.1:39975'",
    ),
    (
        ["doctor", "--store", "s3://bucket/x", "--storage-options", '{"endpoint_url": "127.0.0.1:39975"}'],
        "storage_options['endpoint_url'] must be an http:// or https:// URL",
    ),
    (["ls", "s3://bucket/x", "--region", "eu west 1"], "--region is not a region name"),
    (["ls", "s3://bucket/x", "--profile", " spaced "], "--profile is not a profile name"),
    (["ls", "s3://bucket/x", "--profile", "nosuch", "--endpoint-url", DEAD_ENDPOINT], "nosuch"),
    (["ls", "s3://bucket/x", "--endpoint-url", DEAD_ENDPOINT, "--storage-options", '{"bogus": 1}'], "bogus"),
    (["ls", "s3://"], "has no path"),
    (["du", "nosuchprotocol://x/y"], "Protocol not known"),
    (["du", "/definitely/not/a/store"], "directory does not exist"),
    (["cat", STORE, "acme/chat-1/x", "--offset", "-1"], "argument --offset: -1 is out of range"),
    (["cat", STORE, "acme/chat-1/x", "--offset", "1e30"], "'1e30' is not a whole number"),
    (["cat", STORE, "acme/chat-1/x", "--length", str(2**64)], "argument --length"),
    (["cat", STORE, "name.txt", "--tenant", "acme"], "Give both --tenant and --session"),
    (["cat", STORE, "acme/chat-1/../../globex/chat-1/x"], "No result or document"),
    (["cat", STORE, "acme/chat-1/.Not_A_Namespace/x"], "No result or document"),
    # Ages: at most MAX_AGE (36,500 days), the bound the store puts on purge(older_than=...), refused before any I/O.
    (["purge", STORE, "--older-than", "1000000d", "--yes"], "Invalid age '1000000d': at most 36500 days (100 years)"),
    (["purge", STORE, "--older-than", "36501d", "--yes"], "Invalid age '36501d': at most 36500 days"),
    (["purge", STORE, "--older-than", "5300w", "--yes"], "at most 36500 days"),
    (["purge", STORE, "--older-than", "876001h", "--dry-run"], "at most 36500 days"),
    (["purge", STORE, "--older-than", "99999999999d", "--yes"], "at most 36500 days"),
    (["purge", STORE, "--older-than", "1" * 30 + "s", "--yes"], "at most 36500 days"),  # past timedelta's own range
    (["purge", STORE, "--older-than", "9" * 400 + "w", "--yes"], "at most 36500 days"),  # inf as a float
    (["purge", STORE, "--older-than", "1e10d", "--yes"], "Invalid age '1e10d': use a number and a unit"),
    (["purge", STORE, "--older-than", "inf", "--yes"], "Invalid age 'inf'"),
    (["purge", STORE, "--older-than", "nand", "--yes"], "Invalid age 'nand'"),
    (["purge", STORE, "--older-than=-5d", "--yes"], "Invalid age '-5d'"),
    (["purge", STORE, "--older-than", "-5d", "--yes"], "argument --older-than: expected one argument"),
    (["purge", STORE, "--older-than", "30D", "--yes"], "Invalid age '30D'"),
    (["purge", STORE, "--older-than", "", "--yes"], "Invalid age ''"),
    (["purge", STORE, "--older-than", "0d", "--yes"], "more than zero"),
    (["purge", STORE, "--older-than", "0.0000001s", "--yes"], "more than zero"),
    (["purge", STORE, "--older-than", "soon", "--yes"], "Invalid age 'soon'"),
    (["purge", STORE, "--session", "chat-1", "--yes"], "--session needs --tenant"),
    (["audit", STORE, "--tenant", "acme"], "Say whose audit record: tenant/session"),
    # --engine: a choice, obstore for s3:// stores only; a profile that does not exist is named.
    (["ls", STORE, "--engine", "boto"], "argument --engine: invalid choice: 'boto'"),
    (["du", STORE, "--engine", "obstore"], "--engine obstore serves s3:// stores only"),
    (["ls", "memory://x", "--engine", "obstore"], "--engine obstore serves s3:// stores only"),
    (["purge", "file:///tmp/x", "--tenant", "a", "--engine", "obstore"], "--engine obstore serves s3:// stores only"),
    (["ls", "s3://bucket/x", "--engine", "obstore", "--profile", "prod"], "No AWS profile 'prod'"),
    (
        ["ls", "s3://bucket/x", "--engine", "obstore", "--storage-options", '{"config_kwargs": {"proxies": {}}}'],
        "not supported by the obstore engine",
    ),
    # --progress: a switch of ls, du and purge only.
    (["ls", STORE, "--progress=yes"], "ignored explicit argument 'yes'"),
    (["cat", STORE, "acme/chat-1/x", "--progress"], "unrecognized arguments: --progress"),
    (["audit", STORE, "--tenant", "a", "--session", "b", "--progress"], "unrecognized arguments: --progress"),
]


@pytest.mark.parametrize(("arguments", "message"), BAD_ARGUMENTS, ids=[" ".join(a)[:60] for a, _ in BAD_ARGUMENTS])
def test_a_bad_argument_is_one_line_and_a_non_zero_exit(
    arguments: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (tmp_path / "a-file").write_text("not a store")
    argv = [argument.replace(STORE, str(store)).replace(FILE, str(tmp_path / "a-file")) for argument in arguments]
    code = main(argv)
    captured = capsys.readouterr()
    assert code != 0
    assert captured.out == ""
    assert len(captured.err.splitlines()) == 1, captured.err
    assert captured.err.startswith("offload-haystack") and "Traceback" not in captured.err
    assert message in captured.err


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("AWS_ENDPOINT_URL", "localhost:5000", "AWS_ENDPOINT_URL must be an http:// or https:// URL"),
        ("AWS_ENDPOINT_URL_S3", "ftp://x", "AWS_ENDPOINT_URL_S3 must be an http:// or https:// URL"),
        ("AWS_REGION", "not a region", "AWS_REGION is not a region name"),
        ("AWS_DEFAULT_REGION", "eu_west_1", "AWS_DEFAULT_REGION is not a region name"),
        ("AWS_PROFILE", "nosuch", "The config profile (nosuch) could not be found"),
    ],
)
def test_a_bad_aws_variable_is_one_line_and_a_non_zero_exit(
    variable: str, value: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(variable, value)
    endpoint = [] if variable.startswith("AWS_ENDPOINT_URL") else ["--endpoint-url", DEAD_ENDPOINT]
    code = main(["ls", "s3://bucket/x", *endpoint])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert len(captured.err.splitlines()) == 1 and message in captured.err, captured.err


def test_a_missing_aws_profile_with_the_obstore_engine_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AWS_PROFILE", "prod")
    code = main(["ls", "s3://bucket/x", "--engine", "obstore", "--endpoint-url", DEAD_ENDPOINT])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.splitlines() == [captured.err.strip()]
    assert "No AWS profile 'prod' in the shared config or credentials files" in captured.err


def test_the_obstore_engine_without_obstore_installed_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "obstore", None)  # `import obstore` now fails as if it were not installed
    code = main(["ls", "s3://bucket/x", "--engine", "obstore", "--endpoint-url", DEAD_ENDPOINT])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.splitlines() == [captured.err.strip()] and "Traceback" not in captured.err
    assert '--engine obstore needs obstore, which is not installed: install the "s3" extra' in captured.err


def test_aws_variables_do_not_disturb_a_local_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # They are for S3; someone with a profile and a region set still lists a directory.
    monkeypatch.setenv("AWS_PROFILE", "nosuch")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    (tmp_path / "store").mkdir()
    assert main(["ls", str(tmp_path / "store"), "--json"]) == 0, capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"offload-haystack {version('offload-haystack')}\n"


@pytest.mark.slow
def test_bad_arguments_in_a_real_process_print_one_line(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    for arguments in (
        ["purge", str(tmp_path / "store"), "--older-than", "1000000d", "--yes"],
        ["purge", str(tmp_path / "store"), "--older-than", "1e10d", "--yes"],
        ["ls", str(tmp_path / "store"), "--engine", "obstore"],
        ["demo", "--sessions", "abc"],
        ["ls", "s3://bucket/x", "--endpoint-url", DEAD_ENDPOINT, "--storage-options", '{"bogus": 1}'],
    ):
        completed = subprocess.run(
            [sys.executable, "-m", "haystack_integrations.offload.cli", *arguments],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**_clean_environment(), "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"},
        )
        assert completed.returncode == 2, completed.stderr
        assert len(completed.stderr.splitlines()) == 1 and "Traceback" not in completed.stderr, completed.stderr
    completed = subprocess.run(
        [sys.executable, "-m", "haystack_integrations.offload.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert completed.stdout.strip() == f"offload-haystack {version('offload-haystack')}"


def _clean_environment() -> dict[str, str]:
    import os

    return {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}


def test_every_command_says_what_it_does_and_every_option_what_it_means() -> None:
    subcommands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    assert {"demo", "serve", "ls", "du", "cat", "purge", "audit", "doctor"} <= set(subcommands.choices)
    for name, parser in subcommands.choices.items():
        assert parser.description, f"{name} --help has no description"
        silent = [action.dest for action in parser._actions if not action.help]
        assert not silent, f"{name}: options without help text: {silent}"
