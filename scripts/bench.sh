#!/usr/bin/env bash
# make bench: builds inferd and the no-op model, makes sure nginx is there
# (Debian's nginx-light, installed with apt only when missing), runs the
# side-by-side suite (bench/suite) and the Go micro-benchmarks. The report
# goes to stdout and to bench/out/ (gitignored).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  if [ "$(id -u)" -eq 0 ]; then
    apt=(apt-get)
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    apt=(sudo -n apt-get)
  else
    echo "make bench needs nginx: sudo apt-get install -y nginx-light" >&2
    exit 1
  fi
  echo "installing nginx-light for the benchmark" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${apt[@]}" -o DPkg::Lock::Timeout=300 update -q >&2
  "${apt[@]}" -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends nginx-light >&2
fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

out=bench/out
mkdir -p "$out"
go build -o "$out/inferd" .
go build -o "$out/noop" ./bench/noop
go run ./bench/suite -inferd "$out/inferd" -noop "$out/noop" -nginx "$nginx_bin" "$@" | tee "$out/${BENCH_REPORT:-suite.md}"
# make bench-cluster runs one step of the suite: BENCH_GO=0 leaves these out.
[ "${BENCH_GO:-1}" = 1 ] || exit 0
echo
# Queue ETA accuracy (issue #32): etaMs against when calls actually finish.
go run ./bench/eta -inferd "$out/inferd" | tee "$out/eta.md"
echo
echo '## Go benchmarks'
echo
go test -run '^$' -bench . -benchmem -benchtime 2s ./store/bolt/ ./scheduler/ ./httpapi/ | tee "$out/go-bench.txt"
