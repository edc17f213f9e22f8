#!/usr/bin/env bash
# Installs the Debian packages that `make test` needs and a fresh machine lacks.
# One list, one place: add a package here with the test that needs it.
# Runs apt only for what is missing, so a warm machine pays one dpkg query.
set -euo pipefail

packages=(
  chromium          # status page browser test (web/browsertest)
  prometheus        # promtool: e2e_metrics_test.go checks a /metrics scrape
  lintian           # e2e_package_test.go checks the .deb
  python3-torch     # examples/digits: a real PyTorch model server
  python3-sklearn   # examples/digits: the bundled 8x8 digits data set
  python3-flask     # examples/potassium: the Potassium stand-in is built on Flask
  iproute2          # e2e/threenode_test.go: network namespaces to cut a cluster node off
  strace            # store/bolt/sync_test.go: every commit fdatasyncs the data file
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  apt=(apt-get)
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  apt=(sudo -n apt-get)
else
  echo "make test needs these Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "installing test dependencies: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# apt may be busy right after boot (unattended upgrades); wait for its lock.
"${apt[@]}" -o DPkg::Lock::Timeout=300 update -q
"${apt[@]}" -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${missing[@]}"
