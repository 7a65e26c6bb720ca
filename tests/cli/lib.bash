# Helpers for CLI tests: each check prints "PASS name" or "FAIL name: why".
# PETREL points at the binary (set by tests/run.sh).
: "${PETREL:=build/petrel}"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }
# expect_exit NAME CODE CMD... : runs CMD, checks its exit status.
expect_exit() {
  local name=$1 code=$2; shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  if [ $rc -eq "$code" ]; then pass "$name"; else fail "$name" "exit $rc, expected $code; stderr: $(head -c 300 "$TMP/err")"; fi
}
# expect_stderr NAME PATTERN : the last command's stderr matches PATTERN (grep -E).
expect_stderr() {
  if grep -qE "$2" "$TMP/err"; then pass "$1"; else fail "$1" "stderr lacks /$2/: $(head -c 300 "$TMP/err")"; fi
}
expect_stdout() {
  if grep -qE "$2" "$TMP/out"; then pass "$1"; else fail "$1" "stdout lacks /$2/: $(head -c 300 "$TMP/out")"; fi
}
