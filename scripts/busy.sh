#!/usr/bin/env bash
# Runs a command with a CPU hog beside it (make test-busy: scripts/busy.sh make test):
# BUSY_SPINNERS busy loops (default: twice the cores), each a shell that never
# sleeps, as `stress-ng --cpu N` would be, with nothing to install. The tests'
# deadlines stretch by INFERD_TEST_SLACK (default 3 here: with twice the cores
# spinning beside it, the suite gets about a third of the CPU it would have
# alone) or by the load average per core when the tests begin, whichever is
# larger (internal/testenv/slack.go). The spinners end with the command, or
# when this script is interrupted.
#
#   scripts/busy.sh make test
#   BUSY_SPINNERS=8 scripts/busy.sh go test -race -count=1 ./e2e/
set -euo pipefail

[ $# -gt 0 ] || { echo "usage: scripts/busy.sh COMMAND [ARG...]" >&2; exit 2; }
cores=$(nproc)
n=${BUSY_SPINNERS:-$((2 * cores))}
[[ $n =~ ^[0-9]+$ ]] || { echo "busy: BUSY_SPINNERS=$n is not a count" >&2; exit 2; }
export INFERD_TEST_SLACK=${INFERD_TEST_SLACK:-3}

spinners=()
stop() {
  local p
  for p in "${spinners[@]}"; do
    kill "$p" 2>/dev/null || true
  done
  for p in "${spinners[@]}"; do
    wait "$p" 2>/dev/null || true
  done
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for ((i = 0; i < n; i++)); do
  bash -c 'while :; do :; done' &
  spinners+=($!)
done

echo "busy: $n CPU spinners on $cores cores beside: $* (INFERD_TEST_SLACK=$INFERD_TEST_SLACK; load average now: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown))"
start=$SECONDS
rc=0
"$@" || rc=$?
echo "busy: $* exited $rc after $((SECONDS - start))s beside $n spinners (load average now: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown))"
exit $rc
