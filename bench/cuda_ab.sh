#!/usr/bin/env bash
# Paired A/B of environment-switched CUDA levers with one GPU bundle (make
# gpu-bundle), the configurations alternated within each round in one run on
# the GPU machine (only a side-by-side comparison means anything; an earlier
# run's numbers may come from another card). Per round and configuration:
#   tg   `petrel bench --device cuda --synthetic SHAPE --quant q4 -p 0 -n 128
#        -r 3 --bw-gib 2 --mma-n 0` for each shape of SHAPES: median t/s and
#        its fraction of the read bandwidth measured in the same run
#   serve bench/serve_batch_bench.sh with STREAMS streams of the llama-3.1-8b
#        shape at 4-bit (64 tokens a stream): aggregate and per-stream median
#        tok/s, and how many verified replies were identical alone and in the
#        batch
# then per configuration the median of each number over the rounds.
# Usage: bench/cuda_ab.sh BUNDLE_DIR ROUNDS CONFIG...
#   CONFIG: VAR=VALUE words quoted as one argument, or "-" for none, e.g.
#   bench/cuda_ab.sh /tmp/bundle 3 PETREL_CUDA_TC_WG_MIXED=0 PETREL_CUDA_TC_WG_MIXED=1
# Environment: PARTS (default "tg serve"), SHAPES (default "llama-3.2-1b
# llama-3.1-8b"), STREAMS (default 64), WORK (default /tmp/petrel-ab: the
# logs), MODEL (the served model directory; default WORK/l8b, the synthetic
# 8B shape, written once by bench/make_synth_model.py), DEVICE (default
# cuda) and TG_ARGS (default "-p 0 -n 128 -r 3 --bw-gib 2 --mma-n 0"): other
# values only to try the script itself on a CPU machine, e.g. DEVICE=cpu
# TG_ARGS="-p 0 -n 4 -r 1 --bw-gib 0" MODEL=models/kjv-llama-4bit.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { echo "usage: bench/cuda_ab.sh BUNDLE_DIR ROUNDS CONFIG..." >&2; exit 2; }
B=$1 ROUNDS=$2
shift 2
P=$B/petrel
[ -x "$P" ] || { echo "cuda_ab: $P is not an executable petrel" >&2; exit 1; }
case $ROUNDS in '' | *[!0-9]*) echo "cuda_ab: ROUNDS must be a positive number, not '$ROUNDS'" >&2; exit 2 ;; esac
[ "$ROUNDS" -ge 1 ] || { echo "cuda_ab: ROUNDS must be at least 1" >&2; exit 2; }
PARTS=${PARTS:-"tg serve"}
SHAPES=${SHAPES:-"llama-3.2-1b llama-3.1-8b"}
STREAMS=${STREAMS:-64}
W=${WORK:-/tmp/petrel-ab}
MODEL=${MODEL:-$W/l8b}
DEVICE=${DEVICE:-cuda}
TG_ARGS=${TG_ARGS:-"-p 0 -n 128 -r 3 --bw-gib 2 --mma-n 0"}
read -r -a tg_args <<<"$TG_ARGS"
export DEVICE
mkdir -p "$W"
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "bundle: $(head -2 "$B/MANIFEST" 2>/dev/null | tail -1 || echo "$B")"
ROWS=$W/rows.tsv
: >"$ROWS"
for r in $(seq 1 "$ROUNDS"); do
  for ci in $(seq 0 $(($# - 1))); do
    args=("$@")
    cfg=${args[$ci]}
    vars=()
    [ "$cfg" != "-" ] && read -r -a vars <<<"$cfg"
    line="round $r [$cfg]"
    if has tg; then
      for s in $SHAPES; do
        j=$W/tg_${s}_${r}_${ci}.json
        env "${vars[@]}" "$P" bench --device "$DEVICE" --synthetic "$s" --quant q4 "${tg_args[@]}" \
          --json >"$j" 2>"$W/tg.err" || { echo "cuda_ab: petrel bench failed ($cfg, $s):" >&2; tail -3 "$W/tg.err" >&2; exit 1; }
        v=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))[0]; print("%.2f %.1f" % (r["median_ts"], 100 * r["bw_fraction"]))' "$j")
        printf '%s\t%s\ttg %s\t%s\n' "$ci" "$r" "$s" "${v% *}" >>"$ROWS"
        line="$line  tg $s ${v% *} (${v#* }%)"
      done
    fi
    if has serve; then
      out=$(env "${vars[@]}" bench/serve_batch_bench.sh "$P" "$MODEL" "$STREAMS" 64 2>&1) ||
        { echo "cuda_ab: serving failed ($cfg):" >&2; echo "$out" | tail -5 >&2; exit 1; }
      agg=$(echo "$out" | sed -n 's/.* streams *[0-9]*  agg *\([0-9.]*\) tok\/s  per-stream median *\([0-9.]*\).*/\1 \2/p' | head -1)
      same=$(echo "$out" | sed -n 's/^verify: \([0-9]* of [0-9]*\) replies identical.*/\1/p' | head -1)
      [ -n "$agg" ] || { echo "cuda_ab: no serving row ($cfg):" >&2; echo "$out" | tail -5 >&2; exit 1; }
      printf '%s\t%s\tserve %s agg\t%s\n%s\t%s\tserve %s per-stream\t%s\n' "$ci" "$r" "$STREAMS" "${agg% *}" \
        "$ci" "$r" "$STREAMS" "${agg#* }" >>"$ROWS"
      line="$line  serve $STREAMS: agg ${agg% *} per-stream ${agg#* } (identical ${same:-?})"
    fi
    echo "$line"
  done
done
echo "== medians over $ROUNDS round(s)"
python3 - "$ROWS" "$@" <<'PY'
import sys
from collections import defaultdict
rows, cfgs = sys.argv[1], sys.argv[2:]
v = defaultdict(list)
for l in open(rows):
    ci, _, what, x = l.rstrip("\n").split("\t")
    v[(what, int(ci))].append(float(x))
whats = list(dict.fromkeys(w for w, _ in v))
def med(a):
    a = sorted(a)
    return (a[(len(a) - 1) // 2] + a[len(a) // 2]) / 2
for w in whats:
    base = med(v[(w, 0)])
    cells = []
    for ci, c in enumerate(cfgs):
        m = med(v[(w, ci)])
        cells.append(f"[{c}] {m:.2f}" + ("" if ci == 0 else f" ({100 * (m / base - 1):+.1f}%)"))
    print(f"{w:28s} " + "   ".join(cells))
PY
echo "logs: $W"
