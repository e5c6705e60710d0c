"""
tox.ini's envs are built so that a failure says what failed: with tox-uv, any failure of `uv venv` is reported as
"could not find python interpreter" and a SKIP (under the [tox] section's skip_missing_interpreters, even for py311,
whose own setting tox-uv does not read). So `uv venv` must need no network: no env is seeded (a seeded venv downloads
pip, which behind a proxy uv does not trust skipped every env), and nothing runs the pip a seed would bring.
"""

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tox() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return parser


def test_no_env_is_seeded() -> None:
    tox = _tox()
    seeded = [name for name in tox.sections() if tox[name].get("uv_seed", "false").strip().lower() == "true"]
    assert seeded == []


def test_no_env_runs_pip() -> None:
    tox = _tox()
    runs = {(name, key): tox[name].get(key, "") for name in tox.sections() for key in ("commands_pre", "commands")}
    assert not {place: text for place, text in runs.items() if "pip install" in text.replace("uv pip install", "")}
    assert "uv" in tox["testenv"]["allowlist_externals"].split()


def test_py311_never_skips() -> None:
    tox = _tox()
    assert tox["testenv:py311"]["skip_missing_interpreters"].strip() == "false"
