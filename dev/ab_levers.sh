#!/usr/bin/env bash
# Paired A/B of environment-switched levers with one petrel binary, alternating
# in one run (the machine is shared: only an interleaved comparison means
# anything). Each configuration is a set of VAR=VALUE words (quoted as one
# argument; "-" = no variables).
# Usage: dev/ab_levers.sh BIN ROUNDS THREADS_LIST CONFIG... -- BENCH_ARGS...
#   e.g. dev/ab_levers.sh /tmp/petrel 3 "1 2" "PETREL_CPU_MULTI=0 PETREL_CPU_SCALE16=0" "-" -- \
#          --synthetic llama-3.2-1b --quant q4 -p 0 -n 128 -r 3
# Prints one line per run: round, threads, configuration, the pp/tg rows
# (median t/s and the fraction of the bandwidth petrel bench measured), load.
set -u
bin=$1 rounds=$2 threads=$3
shift 3
configs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do configs+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
echo "# $(date -u +%FT%TZ) $(uname -m) $(nproc) cpus; load: $(cut -d' ' -f1-3 /proc/loadavg); $bin $*"
for r in $(seq 1 "$rounds"); do
  for t in $threads; do
    for cfg in "${configs[@]}"; do
      vars=(); [ "$cfg" != "-" ] && read -r -a vars <<< "$cfg"
      load=$(cut -d' ' -f1 /proc/loadavg)
      out=$(env "${vars[@]}" "$bin" bench "$@" -t "$t" 2>&1)
      bw=$(echo "$out" | grep -o 'read bandwidth [0-9.]* GB/s' | head -1)
      rows=$(echo "$out" | grep -E '^\| (pp|tg)' | awk -F'|' '{gsub(/ /,"",$2); gsub(/^ +| +$/,"",$6); gsub(/^ +| +$/,"",$8); printf "%s=%s (%s)  ", $2, $6, $8}')
      echo "round $r  t=$t  [$cfg]  $rows $bw  load=$load"
    done
  done
done
