#!/bin/sh
# Runs every fuzz target for the given -fuzztime each (default 200000x, i.e.
# executions): make fuzz runs them for a while, make test briefly. The seed
# corpora in <package>/testdata/fuzz/<target> also run as plain tests on every
# go test. Prints the executions of each run, which docs/security.md quotes.
#
# Counts, not durations: with a duration, Go up to 1.26 can fail a target with
# a bare "context deadline exceeded" when the time runs out while a worker is
# busy (go.dev/issue/75804, fixed in Go 1.27); a count never races a clock.
set -eu
fuzztime=${1:-200000x}
targets="
./httpapi FuzzStartBody
./httpapi FuzzCheckBody
./httpapi FuzzInferenceBodyDecoding
./store FuzzAppendRecord
./internal/jsonw FuzzString
./internal/jsonw FuzzFloat
./httpapi FuzzProjectPutBody
./httpapi/admin FuzzAdminBody
./config FuzzLoad
./manifest FuzzParse
"
echo "$targets" | while read -r pkg target; do
	[ -n "$pkg" ] || continue
	out=$(go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" 2>&1) || {
		echo "$out"
		echo "fuzz: $target in $pkg FAILED; a failing input, if one was found, is in $pkg/testdata/fuzz/$target"
		exit 1
	}
	execs=$(echo "$out" | sed -n 's/.*execs: \([0-9]*\).*/\1/p' | tail -n 1)
	# go test -fuzz with a target the package lacks passes having run
	# nothing: a target that moved must fail here, not report a pass.
	if [ -z "$execs" ] || [ "$execs" -eq 0 ]; then
		echo "$out"
		echo "fuzz: $target in $pkg ran no input (is the target still in $pkg?)"
		exit 1
	fi
	echo "fuzz: $target ($pkg): $execs inputs, no failure"
done
