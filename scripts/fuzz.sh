#!/bin/sh
# Runs every fuzz target for FUZZTIME each (default 30s): make fuzz runs them
# for a while, make test for a few seconds. The seed corpora in
# <package>/testdata/fuzz/<target> also run as plain tests on every go test.
# Prints the executions of each run, which docs/security.md quotes.
set -eu
fuzztime=${1:-30s}
targets="
./httpapi FuzzStartBody
./httpapi FuzzCheckBody
./httpapi FuzzProjectPutBody
./httpapi FuzzAdminBody
./config FuzzLoad
./manifest FuzzParse
"
echo "$targets" | while read -r pkg target; do
	[ -n "$pkg" ] || continue
	out=$(go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" 2>&1) || {
		echo "$out"
		echo "fuzz: $target in $pkg FAILED; the input that broke it is in $pkg/testdata/fuzz/$target"
		exit 1
	}
	execs=$(echo "$out" | sed -n 's/.*execs: \([0-9]*\).*/\1/p' | tail -n 1)
	echo "fuzz: $target ($pkg): ${execs:-0} inputs in $fuzztime, no failure"
done
