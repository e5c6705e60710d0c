# Sourced by .ci/run: the Debian packages CI needs, installed only when missing (CI runs as root). chromium for the page
# test (tests/app/server/test_page_browser.py drives it through Playwright's Python package, never a browser of its
# own), Ceph's mon, OSD and RADOS Gateway for the real-S3 lane (tests/support/ceph_rgw.py starts a one-node cluster; the
# packages start no daemon), HAProxy for the replicas test (tests/support/replicas.py runs app/deploy/haproxy.cfg), and
# Node.js with npm for Azurite (tests/support/azurite.py).
# Tested by tests/test_ci_system_packages.py with a stand-in apt-get.

# How long apt may wait for another apt (unattended-upgrades, cloud-init, a second CI job) to let go of its locks.
APT_LOCK_WAIT=600

# apt-get, waiting for the locks instead of failing at once with exit 100. apt >= 1.9.11 waits for dpkg's lock itself
# (DPkg::Lock::Timeout); `apt-get update` does not wait for the package lists' lock (/var/lib/apt/lists/lock), so a
# failure that names a lock is retried every second until APT_LOCK_WAIT, one line each 30 s; any other failure is
# returned at once.
apt_get() {
  local errors status waited=0
  errors="$(mktemp)"
  until DEBIAN_FRONTEND=noninteractive apt-get -o "DPkg::Lock::Timeout=$APT_LOCK_WAIT" "$@" 2>"$errors"; do
    status=$?
    if [ "$waited" -ge "$APT_LOCK_WAIT" ] || ! grep -qiE "could not get lock|unable to lock|unable to acquire" "$errors"; then
      cat "$errors" >&2
      rm -f "$errors"
      return "$status"
    fi
    [ $((waited % 30)) = 0 ] && echo "apt-get $1: another apt holds its lock ($(grep -m1 -i lock "$errors")); waiting" >&2
    sleep 1
    waited=$((waited + 1))
  done
  cat "$errors" >&2
  rm -f "$errors"
}

# Under CI a missing Ceph fails the real-S3 lane, so a failed install fails the run (set -e) rather than skipping it.
install_system_packages() {
  if [ ! -x /usr/bin/chromium ] || ! command -v radosgw >/dev/null 2>&1 || ! command -v haproxy >/dev/null 2>&1 \
    || ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
      SECONDS=0
      apt_get update -qq
      [ -x /usr/bin/chromium ] || apt_get install -y -qq chromium >/dev/null
      command -v haproxy >/dev/null 2>&1 || apt_get install -y -qq haproxy >/dev/null
      # Node.js and npm, for Azurite (Azure Blob Storage's emulator, installed by .ci/run with npm).
      command -v npm >/dev/null 2>&1 || apt_get install -y -qq --no-install-recommends nodejs npm >/dev/null
      command -v radosgw >/dev/null 2>&1 || apt_get install -y -qq \
        --no-install-recommends ceph-mon ceph-osd radosgw ceph-common >/dev/null
      echo "apt-get install took ${SECONDS}s"
    else
      echo "warning: not root: without /usr/bin/chromium the page test reports xfail; without radosgw the RGW lane fails, without haproxy the replicas test" >&2
    fi
  fi
}
