"""
`.ci/run`'s Debian packages (`.ci/system-packages.sh`): apt-get waits while another apt holds its lock (a second job,
unattended-upgrades) instead of failing the run at once with exit 100, and still fails at once on any other error.

Run with a stand-in `apt-get` on a PATH of its own (no real apt, no root): it records its arguments and answers as apt
does when the lists' lock is held, a given number of times.
"""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "system-packages.sh"
LOCKED = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)"
LOCK_OPTION = "-o DPkg::Lock::Timeout=600"

FAKE_APT_GET = f"""#!/bin/bash
echo "$*" >> "$APT_CALLS"
calls=0
[ -f "$APT_COUNT" ] && read -r calls < "$APT_COUNT"
echo $((calls + 1)) > "$APT_COUNT"
if [ "$calls" -lt "${{APT_LOCKED_CALLS:-0}}" ]; then echo "{LOCKED}" >&2; exit 100; fi
if [ -n "${{APT_FAILS_WITH:-}}" ]; then echo "$APT_FAILS_WITH" >&2; exit 100; fi
exit 0
"""


def _run(tmp_path: Path, call: str, **environment: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"apt-get": FAKE_APT_GET, "id": "#!/bin/bash\necho 0\n"}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for tool in ("mktemp", "cat", "grep", "rm", "sleep"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    calls = tmp_path / "calls"
    env = {
        "PATH": str(bin_dir),  # only the stand-ins: no radosgw, no haproxy, no real apt-get
        "TMPDIR": str(tmp_path),
        "APT_CALLS": str(calls),
        "APT_COUNT": str(tmp_path / "count"),
        **environment,
    }
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run(
        [bash, "-c", f'set -euo pipefail; source "{SCRIPT}"; {call}'],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_apt_get_waits_while_another_apt_holds_the_lock(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, "apt_get update -qq", APT_LOCKED_CALLS="1")
    assert done.returncode == 0, done.stderr
    assert calls == [f"{LOCK_OPTION} update -qq"] * 2  # refused once, then through
    assert "another apt holds its lock" in done.stderr


def test_apt_get_fails_at_once_on_any_other_error(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, "apt_get install -y chromium", APT_FAILS_WITH="E: Unable to locate package chromium")
    assert done.returncode == 100
    assert calls == [f"{LOCK_OPTION} install -y chromium"]
    assert "Unable to locate package chromium" in done.stderr


def test_every_install_waits_for_the_lock(tmp_path: Path) -> None:
    done, calls = _run(tmp_path, "install_system_packages", APT_LOCKED_CALLS="2")
    assert done.returncode == 0, done.stderr
    assert calls[:3] == [f"{LOCK_OPTION} update -qq"] * 3
    assert all(call.startswith(f"{LOCK_OPTION} ") for call in calls), calls
    installs = [call.split()[-1] for call in calls if " install " in call]
    assert "haproxy" in installs and "ceph-common" in installs, calls  # chromium too where the machine lacks it


def test_ci_run_calls_apt_only_through_the_waiting_function() -> None:
    run = (ROOT / ".ci" / "run").read_text()
    code = [line.split("#", 1)[0] for line in run.splitlines()]
    assert not [line for line in code if "apt-get " in line or "apt " in line]
    assert "source .ci/system-packages.sh" in code
    assert os.access(ROOT / ".ci" / "run", os.X_OK)
