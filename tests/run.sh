#!/usr/bin/env bash
# Runs every test binary (build/tests/test_*) and every CLI test script
# (tests/cli/*.sh), counts PASS/FAIL lines, and ends with "N passed, N failed".
# TEST_FILTER (an extended regex) selects tests by name.
# A binary that crashes or exits non-zero without a FAIL line counts as a failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export PETREL=${PETREL:-$PWD/$BUILD/petrel}
export BUILD
pass=0; fail=0; skip=0
logdir=$BUILD/test-logs; mkdir -p "$logdir"
run_one() { # name, command...
  local name=$1; shift
  local log=$logdir/$name.log
  local start=$SECONDS
  "$@" >"$log" 2>&1; local rc=$?
  local p f s
  p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
  pass=$((pass+p)); fail=$((fail+f)); skip=$((skip+s))
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
    fail=$((fail+1)); echo "FAIL $name: exited with status $rc (see $log)"; tail -20 "$log" | sed 's/^/    /'
  fi
  grep -E '^(FAIL|SKIP) ' "$log" | sed "s/^/[$name] /"
  grep -E '^(INFO|MEASURE) ' "$log" | sed "s/^/[$name] /"
  printf '%-40s %3d passed %3d failed (%ds)\n' "$name" "$p" "$f" $((SECONDS-start))
}
filter=${TEST_FILTER:-}
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  n=$(basename "$t")
  [ -n "$filter" ] && ! echo "$n" | grep -qE "$filter" && continue
  run_one "$n" "$t"
done
for s in tests/cli/*.sh; do
  [ -f "$s" ] || continue
  n=$(basename "$s" .sh)
  [ -n "$filter" ] && ! echo "$n" | grep -qE "$filter" && continue
  run_one "cli_$n" bash "$s"
done
echo "($skip skipped)"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
