#!/usr/bin/env bash
# Mutation testing by a tool (make gremlins): go-gremlins (pinned in
# tools/go.mod) makes mutants of the lines a change touched (conditionals
# flipped, boundaries moved, arithmetic swapped, ...), runs each package's
# own tests against each, and reports which mutants lived: a mutant that
# lives is a change of behaviour no unit test noticed. Give it a test, or a
# written reason in docs/benchmarks.md ("Mutation testing by a tool").
# scripts/mutate.sh (make mutate) stays for the hand-written rows, which the
# end-to-end tests guard too; gremlins runs only a package's own tests.
#
#   scripts/gremlins.sh [BASE]             the packages whose Go code differs from BASE
#                                          (default main; the working tree counts)
#   GREMLINS_PKGS="./scheduler ./store/etcd" scripts/gremlins.sh BASE
#   GREMLINS_WHOLE=1 GREMLINS_PKGS=./internal/durable scripts/gremlins.sh
#                                          every line of the packages, not a diff
#
# Environment: GREMLINS_WORKERS (default 1) and GREMLINS_TEST_CPU (default 1)
# keep it gentle on a shared box; GREMLINS_TIMEOUT_COEFFICIENT (default 10)
# stretches gremlins' per-mutant timeout (a multiple of the package's own
# test time) for a busy one; GREMLINS_OUT keeps the JSON results there.
# Exit status: 0 when it ran (read the report), 2 when it could not.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
base=${1:-${BASE:-main}}
git rev-parse --verify -q "$base^{commit}" >/dev/null || { echo "gremlins: no commit $base to diff against" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/inferd-gremlins.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
out=${GREMLINS_OUT:-$tmp/out}
mkdir -p "$out"

# The packages: directories of non-test Go files that differ from BASE and
# have tests of their own (e2e/ runs the binary, not a package's code).
if [ -n "${GREMLINS_PKGS:-}" ]; then
  read -r -a pkgs <<<"$GREMLINS_PKGS"
else
  mapfile -t pkgs < <(git diff --merge-base "$base" --name-only -- '*.go' ':!*_test.go' |
    xargs -r -n1 dirname | sort -u | while read -r d; do
      case $d in e2e | e2e/* | examples/* | tools | tools/*) continue ;; esac
      [ -d "$d" ] && compgen -G "$d/*_test.go" >/dev/null && echo "./$d"
    done)
fi
if [ ${#pkgs[@]} -eq 0 ]; then
  echo "gremlins: no package with tests differs from $base"
  exit 0
fi

echo "gremlins: building go-gremlins (tools/go.mod)"
go build -C tools -o "$tmp/gremlins" github.com/go-gremlins/gremlins/cmd/gremlins

diff=(--diff "$base")
scope="the lines that differ from $base"
if [ "${GREMLINS_WHOLE:-0}" = 1 ]; then
  diff=() scope="every line"
fi
summary=()
for pkg in "${pkgs[@]}"; do
  dir=${pkg#./}
  [ "$dir" = . ] && dir=
  name=${dir:-.}
  log=$out/${name//\//_}.log
  echo
  echo "== $name: mutants of $scope"
  # gremlins reads the diff (git diff --merge-base BASE) with paths from the
  # repository's root but names its mutants from the package's folder: run
  # it there, with git told to print paths relative to it (diff.relative).
  (
    cd "$root/$dir"
    GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=diff.relative GIT_CONFIG_VALUE_0=true \
      "$tmp/gremlins" unleash "${diff[@]}" \
      --workers "${GREMLINS_WORKERS:-1}" --test-cpu "${GREMLINS_TEST_CPU:-1}" \
      --timeout-coefficient "${GREMLINS_TIMEOUT_COEFFICIENT:-10}" \
      --output "$out/${name//\//_}.json" "$root/$dir"
  ) >"$log" 2>&1 || { echo "gremlins failed on $name:" >&2; tail -n 20 "$log" >&2; exit 2; }
  grep -v ' SKIPPED ' "$log" | sed -n '/KILLED\|LIVED\|NOT COVERED\|TIMED OUT\|NOT VIABLE/p'
  counts=$(grep -m1 '^Killed:' "$log" || echo "Killed: ?")
  efficacy=$(grep -m1 '^Test efficacy:' "$log" | sed 's/Test efficacy: //' || echo "?")
  mcover=$(grep -m1 '^Mutator coverage:' "$log" | sed 's/Mutator coverage: //' || echo "?")
  summary+=("$(printf '%-24s %s; efficacy %s, mutator coverage %s' "$name" "$counts" "$efficacy" "$mcover")")
done

echo
echo "gremlins, $scope ($(git rev-parse --short HEAD)):"
printf '  %s\n' "${summary[@]}"
echo "A LIVED mutant needs a test, or a written reason in docs/benchmarks.md (\"Mutation testing by a tool\")."
