"""
tox's `emulators` env, which CI runs: the suites marked real_s3 (and the s3_endpoint tests of those it names) on Azurite
and fake-gcs-server, with the clouds' extras installed by the env itself; Azurite comes from npm through .ci/run.
"""

import configparser
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tox() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return parser


def test_the_env_is_in_the_envlist_and_runs_the_lane_on_both_emulators() -> None:
    tox = _tox()
    assert "emulators" in [name.strip() for name in tox["tox"]["envlist"].split(",")]
    env = tox["testenv:emulators"]
    assert env["set_env"].split("=") == ["OFFLOAD_TEST_EMULATORS ", " azurite,fake-gcs"]
    assert {"test", "azure", "gcs"} <= set(env["extras"].split())
    assert env["skip_missing_interpreters"].strip() == "false" and "CI" in env["pass_env"].split()
    # The py3xx envs leave the lane off: no emulator backend in their runs.
    assert all(
        "OFFLOAD_TEST_EMULATORS" not in tox[name].get("set_env", "") for name in tox.sections() if name != env.name
    )


def test_the_env_selects_the_lanes_tests_of_suites_that_exist() -> None:
    words = shlex.split(_tox()["testenv:emulators"]["commands"].replace("\\\n", " "))
    assert words[words.index("-m") + 1] == "emulators"
    suites = [word for word in words if word.startswith("tests/")]
    assert {"tests/stores/test_behaviour.py", "tests/stores/test_hostile.py", "tests/sessions"} <= set(suites)
    assert [suite for suite in suites if not (ROOT / suite).exists()] == []


def test_ci_installs_azurite() -> None:
    assert 'npm install --global --no-audit --no-fund --loglevel=error "azurite@' in (ROOT / ".ci/run").read_text()
