#!/usr/bin/env bash
# Paired A/B of two petrel binaries with `petrel bench`, alternating in one run
# (the machine is shared: only an interleaved comparison is meaningful).
# Usage: dev/ab_bench.sh OLD_BIN NEW_BIN ROUNDS THREADS_LIST -- BENCH_ARGS...
#   e.g. dev/ab_bench.sh /tmp/old/petrel build/petrel 2 "1 2" -- \
#          --synthetic llama-3.2-1b --quant q4 -p 64 -n 32 -r 3
# Prints one line per run: round, binary label, threads, then the pp/tg rows.
set -u
old=$1 new=$2 rounds=$3 threads=$4
shift 4
[ "${1:-}" = "--" ] && shift
echo "# $(date -u +%FT%TZ) $(uname -m) $(nproc) cpus; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  for t in $threads; do
    for which in old new; do
      bin=$old; [ $which = new ] && bin=$new
      out=$("$bin" bench "$@" -t "$t" 2>&1)
      rows=$(echo "$out" | grep -E '^\| (pp|tg)' | awk -F'|' '{gsub(/ /,"",$2); gsub(/^ +| +$/,"",$5); printf "%s=%s  ", $2, $5}')
      echo "round $r  $which  t=$t  $rows load=$(cut -d' ' -f1 /proc/loadavg)"
    done
  done
done
