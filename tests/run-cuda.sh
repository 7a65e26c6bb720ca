#!/usr/bin/env bash
# make check-cuda: runs the prebuilt CUDA test binaries of the GPU bundle
# (build/gpu-bundle/tests/test_*, made by `make gpu-bundle`; GPU_BUNDLE=DIR
# points elsewhere) and the bundled petrel binary; compiles nothing. Counts
# PASS/FAIL lines like tests/run.sh and ends with "N passed, N failed".
# TEST_FILTER (an extended regex) selects test binaries by name.
# Meant for the GPU machine; elsewhere the tests report their CPU fallback.
set -u
cd "$(dirname "$0")/.."
BUNDLE=${GPU_BUNDLE:-build/gpu-bundle}
if [ ! -x "$BUNDLE/petrel" ]; then
  echo "check-cuda: no bundle at $BUNDLE (run 'make gpu-bundle' on a build machine and carry it)" >&2
  echo "0 passed, 1 failed"; exit 1
fi
[ -f "$BUNDLE/MANIFEST" ] && sed 's/^/INFO bundle: /' "$BUNDLE/MANIFEST"
# cuBLAS comes from the machine's CUDA. The RPATH names /usr/local/cuda/lib64;
# when it lives elsewhere (a Python wheel's copy, a versioned CUDA folder),
# find it and say so.
if ldd "$BUNDLE/petrel" | grep -q 'libcublas.*not found'; then
  for d in /usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib \
           /usr/lib/x86_64-linux-gnu /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib \
           /opt/*/.venv/lib/python3*/site-packages/nvidia/cublas/lib \
           /usr/local/lib/python3*/dist-packages/nvidia/cu13/lib; do
    if [ -e "$d/libcublas.so.13" ]; then
      export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "INFO check-cuda: cuBLAS from $d"; break
    fi
  done
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader |
    sed 's/^/INFO gpu: /'
fi
pass=0; fail=0; skip=0
logdir=${CHECK_CUDA_LOGS:-$BUNDLE/test-logs}; mkdir -p "$logdir"
run_one() { # name, command...
  local name=$1; shift
  local log=$logdir/$name.log start=$SECONDS
  "$@" >"$log" 2>&1; local rc=$?
  local p f s
  p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
  pass=$((pass+p)); fail=$((fail+f)); skip=$((skip+s))
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
    fail=$((fail+1)); echo "FAIL $name: exited with status $rc (see $log)"; tail -20 "$log" | sed 's/^/    /'
  fi
  grep -E '^(FAIL|SKIP|    also) ' "$log" | sed "s/^/[$name] /"
  grep -E '^(INFO|MEASURE) ' "$log" | sed "s/^/[$name] /"
  printf '%-40s %3d passed %3d failed (%ds)\n' "$name" "$p" "$f" $((SECONDS-start))
}
smoke() { # the bundled binary starts and resolves its libraries here
  local v; v=$("$BUNDLE/petrel" --version 2>&1) && echo "PASS bundle_petrel_runs ($v)" ||
    { echo "FAIL bundle_petrel_runs: $v"; ldd "$BUNDLE/petrel"; }
}
run_one bundle_smoke smoke
filter=${TEST_FILTER:-}
for t in "$BUNDLE"/tests/test_*; do
  [ -x "$t" ] || continue
  n=$(basename "$t")
  [ -n "$filter" ] && ! echo "$n" | grep -qE "$filter" && continue
  run_one "$n" "$t"
done
echo "($skip skipped)"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
