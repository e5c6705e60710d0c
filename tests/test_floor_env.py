"""
tox's `floor` env, which CI runs: the quick lane on the lowest version of every declared dependency, the library's and
the app's, so a floor that no longer works fails CI instead of a user's install.
"""

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tox() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return parser


def test_ci_runs_the_floor_env() -> None:
    # .ci/run runs `python -m tox`, which runs the envlist.
    envlist = [name.strip() for name in _tox()["tox"]["envlist"].split(",")]
    assert "floor" in envlist


def test_the_floor_env_installs_the_lowest_allowed_versions_of_the_library_and_the_app() -> None:
    floor = _tox()["testenv:floor"]
    assert floor["uv_resolution"].strip() == "lowest-direct"  # the wheel and its extras, through tox-uv
    app_install = floor["commands_pre"].split()
    assert app_install[:3] == ["uv", "pip", "install"] and "{toxinidir}/app[test]" in app_install
    assert "--resolution" in app_install and app_install[app_install.index("--resolution") + 1] == "lowest-direct"
    assert floor["skip_missing_interpreters"].strip() == "false"


def test_the_floor_env_runs_the_quick_lane_on_the_test_extras() -> None:
    tox = _tox()
    floor = tox["testenv:floor"]
    assert floor.get("extras", tox["testenv"]["extras"]).split() == ["test"]
    assert '-m "not slow"' in floor["commands"] and "pytest" in floor["commands"]
