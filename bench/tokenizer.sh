#!/usr/bin/env bash
# Tokenizer encode throughput, petrel beside the reference library (npm
# `tokenizers`), one thread, same text and tokenizer.json, in one run:
#   bench/tokenizer.sh [MB] [REPS]
# Tokenizers: one trained by the reference's BPE trainer on the text, the
# committed llama3 / qwen2 / gemma fixtures, and a synthetic 262k-entry
# byte-level vocabulary (load time). Modes: "whole" encodes the text as one
# string; "lines" encodes each line separately. Needs node and npm (installs
# tools/tokenizer/node_modules on first use); builds build/libpetrel.a.
set -euo pipefail
cd "$(dirname "$0")/.."
MB=${1:-4}
REPS=${2:-5}
OUT=${TOKBENCH_DIR:-build/tokbench}
mkdir -p "$OUT"
[ -d tools/tokenizer/node_modules/tokenizers ] || (cd tools/tokenizer && npm ci --no-audit --no-fund >/dev/null)
make -s build/libpetrel.a
cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -o "$OUT/tokenizer_bench" bench/tokenizer_bench.c build/libpetrel.a \
   $(pkg-config --libs libcjson libpcre2-8 libutf8proc 2>/dev/null || echo -lcjson -lpcre2-8 -lutf8proc) -lm -lpthread
node tools/tokenizer/bench_prep.js "$OUT" "$MB" | grep -v '^$'
[ -f "$OUT/big.json" ] || node tools/tokenizer/make_big.js "$OUT/big.json" 262144 >/dev/null
export RAYON_NUM_THREADS=1   # the reference parallelises only batches; pin it anyway
echo "commit $(git rev-parse --short HEAD); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(nproc) cores"
# A/B/A/B: one repetition of each side in turn, so machine noise hits both.
speed() { grep -o 'best [0-9.]*' | cut -d' ' -f2; }
stats() { sort -g | awk '{v[NR]=$1} END {printf "median %6.2f  best %6.2f", v[int((NR+1)/2)], v[NR]}'; }
median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
printf '%-22s %-5s %-36s %-36s %s\n' tokenizer mode "petrel MB/s" "reference MB/s" "ratio (medians)"
for tok in "$OUT/trained.json" tests/fixtures/tokenizers/llama3.json tests/fixtures/tokenizers/qwen2.json \
           tests/fixtures/tokenizers/gemma.json "$OUT/big.json"; do
  for mode in whole lines; do
    : >"$OUT/a"; : >"$OUT/b"
    for r in $(seq "$REPS"); do
      "$OUT/tokenizer_bench" "$tok" "$OUT/text.txt" 1 "$mode" | speed >>"$OUT/a"
      node tools/tokenizer/bench_ref.js "$tok" "$OUT/text.txt" 1 "$mode" | speed >>"$OUT/b"
    done
    ratio=$(awk -v a="$(median <"$OUT/a")" -v b="$(median <"$OUT/b")" 'BEGIN {printf "%.1fx", a / b}')
    printf '%-22s %-5s %-36s %-36s %s\n' "$(basename "$tok")" "$mode" "$(stats <"$OUT/a")" "$(stats <"$OUT/b")" "$ratio"
  done
done
echo "load (262144-entry vocabulary, 261888 merges, 10 MB):"
"$OUT/tokenizer_bench" "$OUT/big.json" "$OUT/text.txt" 1 lines | grep -o 'load [0-9.]* s' | sed 's/^/  petrel    /'
node tools/tokenizer/bench_ref.js "$OUT/big.json" "$OUT/text.txt" 1 lines | grep -o 'load [0-9.]* s' | sed 's/^/  reference /'
