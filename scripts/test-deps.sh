#!/usr/bin/env bash
# Installs the Debian packages that `make test` needs and a fresh machine lacks
# (scripts/apt-install.sh: only the missing ones, without recommends, every
# wait bounded). One list, one place: add a package here with the test that
# needs it; README "What make test needs" says what they cost.
set -euo pipefail

packages=(
  chromium          # status page browser test (web/browsertest)
  prometheus        # promtool: e2e_metrics_test.go checks a /metrics scrape
  lintian           # e2e_package_test.go checks the .deb
  python3-torch     # examples/digits: a real PyTorch model server (also: make digits-deps)
  python3-sklearn   # examples/digits: the bundled 8x8 digits data set (also: make digits-deps)
  python3-flask     # examples/potassium: the Potassium stand-in is built on Flask
  iproute2          # e2e/threenode_test.go: network namespaces to cut a cluster node off
  strace            # store/bolt/sync_test.go: every commit fdatasyncs the data file
)
exec "$(dirname "$0")/apt-install.sh" "${packages[@]}"
