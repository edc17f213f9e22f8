#!/usr/bin/env bash
# Installs the Debian packages named on the command line that are missing,
# without their recommends (python3-torch alone would pull ~300 more):
#   scripts/apt-install.sh PKG...
# Used by scripts/test-deps.sh (make test) and make digits-deps. A warm
# machine pays one dpkg query. Every wait is bounded: apt waits at most
# APT_LOCK_WAIT seconds (default 300) for another package manager to let go
# of its lock, and the whole install at most APT_TIMEOUT seconds (default
# 1200); past either it stops with a message saying which.
set -euo pipefail

missing=()
for p in "$@"; do
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
  echo "these Debian packages are missing: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi

lock_wait=${APT_LOCK_WAIT:-300}
limit=${APT_TIMEOUT:-1200}
echo "installing: ${missing[*]} (apt-get, without recommends; at most ${limit}s)"
export DEBIAN_FRONTEND=noninteractive
# run STEP ARGS...: one apt-get step within what is left of the time limit.
start=$SECONDS
run() {
  local step=$1 rc=0
  shift
  local left=$((limit - (SECONDS - start)))
  if [ "$left" -le 0 ]; then
    rc=124
  else
    timeout --kill-after=30 "$left" "${apt[@]}" -o DPkg::Lock::Timeout="$lock_wait" "$@" || rc=$?
  fi
  case $rc in
  0) return 0 ;;
  124 | 137) echo "apt-get $step did not finish within ${limit}s (APT_TIMEOUT): is another package manager running, or the mirror slow?" >&2 ;;
  *) echo "apt-get $step failed (exit $rc), having waited up to ${lock_wait}s (APT_LOCK_WAIT) for the package lock; see its output above" >&2 ;;
  esac
  exit 1
}
run update update -q
run install install -y -q --no-install-recommends "${missing[@]}"
