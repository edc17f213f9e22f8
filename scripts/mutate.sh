#!/usr/bin/env bash
# Mutation check of the tests that guard inferd's core rules (make mutate).
#
# For each mutation in scripts/mutations.txt (a one-line change that breaks one
# rule: durability before reply, restart recovery, team isolation, validation,
# idle timeout and min replicas, ...), apply it in a temporary git worktree of
# HEAD, run the tests the row names, and report whether one failed (caught) or
# all passed (missed). Exit status: 0 when every mutation is caught, 1 when one is
# missed (a test is missing: add it), 2 when the list or the unmutated tests are
# broken (a row whose original line is not found exactly once, a test regex that
# runs no test, a baseline failure, a mutation that does not compile).
#
#   scripts/mutate.sh            run every mutation
#   scripts/mutate.sh REGEX      run the mutations whose name matches REGEX
#   scripts/mutate.sh -l         list the mutations and check each still applies
#
# It mutates HEAD: commit first. Environment: MUTATE_LIST (default
# scripts/mutations.txt), MUTATE_TIMEOUT (go test -timeout per test line,
# default 5m: a hang counts as caught), MUTATE_BASELINE=0 to skip the check that
# the tests pass unmutated, MUTATE_KEEP=1 to keep the worktree and logs,
# MUTATE_EVERY=1 to run every test line of a row, not only up to the first that
# fails, and count the mutation caught only if each of them fails.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
list=${MUTATE_LIST:-scripts/mutations.txt}
timeout=${MUTATE_TIMEOUT:-5m}
# A test that would skip for a missing dependency must fail instead: a skipped
# guard would report every mutation it should catch as missed, or pass the
# baseline without having run.
export INFERD_REQUIRE_CLIENT_TESTS=1

listonly=0
filter=
case "${1:-}" in
-l) listonly=1 ;;
-h | --help)
  sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
  ;;
"") ;;
*) filter=$1 ;;
esac

die() {
  echo "mutate: $*" >&2
  exit 2
}

# --- read the list ----------------------------------------------------------

names=() rules=() files=() froms=() tos=() tests=()
name= rule= file= from= to= test=
lineno=0 start=0

flush() {
  if [ -z "$name$rule$file$from$to$test" ]; then
    return
  fi
  local missing=
  for k in name rule file from to test; do
    [ -n "${!k}" ] || missing+=" $k"
  done
  [ -z "$missing" ] || die "$list:$start: mutation ${name:-?} lacks:$missing"
  [[ $name =~ ^[a-z0-9-]+$ ]] || die "$list:$start: name $name: use a-z, 0-9 and -"
  for n in "${names[@]}"; do
    [ "$n" != "$name" ] || die "$list:$start: name $name is used twice"
  done
  names+=("$name") rules+=("$rule") files+=("$file") froms+=("$from") tos+=("$to") tests+=("$test")
  name= rule= file= from= to= test=
}

trim() {
  local s=$1
  s=${s#"${s%%[![:space:]]*}"}
  s=${s%"${s##*[![:space:]]}"}
  printf '%s' "$s"
}

[ -f "$list" ] || die "no list $list"
while IFS= read -r line || [ -n "$line" ]; do
  lineno=$((lineno + 1))
  case "$line" in
  \#*) continue ;;
  esac
  if [ -z "$(trim "$line")" ]; then
    flush
    continue
  fi
  [ -n "$name$rule$file$from$to$test" ] || start=$lineno
  key=${line%%:*}
  [ "$key" != "$line" ] || die "$list:$lineno: not a key: value line: $line"
  value=$(trim "${line#*:}")
  case "$key" in
  name | rule | file | from | to)
    [ -z "${!key}" ] || die "$list:$lineno: $key given twice in one mutation"
    printf -v "$key" '%s' "$value"
    ;;
  test)
    set -f
    # shellcheck disable=SC2086
    set -- $value
    set +f
    [ $# -eq 2 ] || die "$list:$lineno: test wants a package and a -run regex, got: $value"
    test+="$value"$'\n'
    ;;
  *) die "$list:$lineno: unknown key $key" ;;
  esac
done <"$list"
flush
[ ${#names[@]} -gt 0 ] || die "$list holds no mutation"

selected=()
for i in "${!names[@]}"; do
  if [ -z "$filter" ] || [[ ${names[$i]} =~ $filter ]]; then
    selected+=("$i")
  fi
done
[ ${#selected[@]} -gt 0 ] || die "no mutation name matches $filter"

# count_original FILE FROM: how many lines of FILE are FROM, leading and
# trailing blanks aside.
count_original() {
  FROM=$2 awk 'function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t\r]+$/, "", s); return s }
    trim($0) == ENVIRON["FROM"] { n++ } END { print n + 0 }' "$1"
}

# Every selected row must still apply to HEAD before anything runs: the code
# moves under the list, and a row that silently no longer mutates anything
# would read as a test that guards nothing.
bad=0
for i in "${selected[@]}"; do
  f=${files[$i]}
  if ! git cat-file -e "HEAD:$f" 2>/dev/null; then
    echo "mutate: ${names[$i]}: $f is not in HEAD: re-target the row" >&2
    bad=1
    continue
  fi
  n=$(git show "HEAD:$f" | count_original /dev/stdin "${froms[$i]}")
  if [ "$n" != 1 ]; then
    echo "mutate: ${names[$i]}: the original line occurs $n times in $f (want exactly 1): re-target the row" >&2
    echo "        from: ${froms[$i]}" >&2
    bad=1
  fi
done
[ $bad -eq 0 ] || exit 2

if [ $listonly -eq 1 ]; then
  for i in "${selected[@]}"; do
    printf '%-36s %s\n' "${names[$i]}" "${rules[$i]}"
    printf '%-36s %s: %s\n' "" "${files[$i]}" "${tos[$i]}"
  done
  echo "${#selected[@]} mutations, each applies to HEAD"
  exit 0
fi

# --- the worktree -------------------------------------------------------------

tmp=$(mktemp -d "${TMPDIR:-/tmp}/inferd-mutate.XXXXXX")
src=$tmp/src
logs=$tmp/logs
mkdir -p "$logs"
cleanup() {
  if [ "${MUTATE_KEEP:-0}" = 1 ]; then
    echo "mutate: kept $tmp" >&2
    return
  fi
  git -C "$root" worktree remove --force "$src" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
git worktree add --detach -q "$src" HEAD
# The worktree has only tracked files: link in the client packages make
# client-deps installed here (ignored node_modules folders), so the end-to-end
# rows that drive the Banana and OpenAI clients run rather than fail.
while IFS= read -r dir; do
  [ -e "$src/$dir" ] || ln -s "$root/$dir" "$src/$dir"
done < <(git -C "$root" ls-files --others --ignored --exclude-standard --directory |
  sed -n 's:/$::; /\(^\|\/\)node_modules$/p')
cd "$src"

# run_test LOG PKG REGEX: go test; its status is the test's.
run_test() {
  go test -count=1 -timeout "$timeout" -run "$3" "$2" >"$1" 2>&1
}

# first_failure LOG: the line that best says why the tests failed.
first_failure() {
  grep -m1 -E -e '^\s*--- FAIL' -e '^panic:' -e 'test timed out' -e '^FAIL' "$1" | sed 's/^[[:space:]]*//' || true
}

began=$(date +%s)

if [ "${MUTATE_BASELINE:-1}" != 0 ]; then
  echo "baseline: the tests pass unmutated"
  declare -A seen=()
  k=0
  for i in "${selected[@]}"; do
    while IFS= read -r t; do
      [ -n "$t" ] && [ -z "${seen[$t]:-}" ] || continue
      seen[$t]=1
      k=$((k + 1))
      read -r pkg re <<<"$t"
      log=$logs/baseline-$k.log
      if ! run_test "$log" "$pkg" "$re"; then
        echo "mutate: the unmutated tests fail ($pkg -run '$re'): $(first_failure "$log")" >&2
        tail -n 30 "$log" >&2
        exit 2
      fi
      if grep -q 'no tests to run' "$log"; then
        die "$pkg -run '$re' runs no test: re-target the rows that name it"
      fi
      echo "  ok  $pkg -run '$re'"
    done <<<"${tests[$i]}"
  done
fi

# --- the mutations ------------------------------------------------------------

caught=0 missed=0 broken=0
report=()
for i in "${selected[@]}"; do
  name=${names[$i]} f=${files[$i]}
  t0=$(date +%s)
  FROM=${froms[$i]} TO=${tos[$i]} awk '
    function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t\r]+$/, "", s); return s }
    trim($0) == ENVIRON["FROM"] { match($0, /^[ \t]*/); print substr($0, 1, RLENGTH) ENVIRON["TO"]; next }
    { print }' "$f" >"$f.mutated"
  mv "$f.mutated" "$f"
  if git diff --quiet -- "$f"; then
    die "$name: the replacement equals the original"
  fi

  result=missed detail=
  # A mutation that does not compile proves nothing about the tests.
  while IFS= read -r t; do
    [ -n "$t" ] || continue
    read -r pkg re <<<"$t"
    if ! go vet "$pkg" >"$logs/$name-vet.log" 2>&1; then
      result=broken detail="does not build: $(grep -m1 -v '^#' "$logs/$name-vet.log")"
      break
    fi
  done <<<"${tests[$i]}"
  if [ $result = missed ]; then
    k=0 passed=
    while IFS= read -r t; do
      [ -n "$t" ] || continue
      k=$((k + 1))
      read -r pkg re <<<"$t"
      log=$logs/$name-$k.log
      if run_test "$log" "$pkg" "$re"; then
        passed+=" $pkg -run '$re';"
      elif [ -z "$detail" ]; then
        detail="by $pkg -run '$re': $(first_failure "$log")"
      fi
      if [ -n "$detail" ] && [ "${MUTATE_EVERY:-0}" != 1 ]; then
        break
      fi
    done <<<"${tests[$i]}"
    if [ -n "$detail" ] && { [ -z "$passed" ] || [ "${MUTATE_EVERY:-0}" != 1 ]; }; then
      result=caught
    elif [ -n "$detail" ]; then
      detail="not by$passed only $detail" # MUTATE_EVERY: some test lines passed
    fi
  fi
  git checkout -q -- "$f"

  secs=$(($(date +%s) - t0))
  case $result in
  caught) caught=$((caught + 1)) ;;
  missed) missed=$((missed + 1)) detail=${detail:-"no test failed: ${rules[$i]}"} ;;
  broken) broken=$((broken + 1)) ;;
  esac
  line=$(printf '%-7s %-36s %4ss  %s' "$result" "$name" "$secs" "$detail")
  echo "$line"
  report+=("$line")
done

echo
echo "mutations: ${#selected[@]}, caught $caught, missed $missed, broken $broken ($(($(date +%s) - began))s)"
if [ $missed -gt 0 ]; then
  echo "a missed mutation is a rule no test holds: add the test, or fix the row's test lines"
fi
[ $broken -eq 0 ] || exit 2
[ $missed -eq 0 ] || exit 1
