#!/usr/bin/env bash
# The CUDA decode targets (bench/RESULTS.md; the targets are the H200's), each
# measured once in one run on a GPU machine from a GPU bundle (make
# gpu-bundle), then set against its target:
#   batch-1 decode   `petrel bench --device cuda --synthetic NAME --quant q4
#                    -p 0 -n 128 -r 3 --bw-gib 2 --mma-n 0`, llama-3.2-1b,
#                    llama-3.2-3b, llama-3.1-8b: median t/s and its fraction
#                    of the read bandwidth measured in the same run
#                    (targets: 1b >= 30%, 8b >= 70%)
#   prefill          the 8b shape's pp2048 (`-p 2048 -n 0 -r 3`, the bf16
#                    tensor-core GEMM rate measured in the same run): its
#                    fraction of that rate (target >= 40%)
#   fused attention  `BENCH_FUSED_ONLY=1 tests/bench_decode_attn 5 2048 8192
#                    32768` (the 8B shape, 8-bit and 4-bit caches): the
#                    fraction of the read rate for the KV bytes (target at
#                    32k >= 70%)
#   batching         bench/serve_batch_bench.sh with 1, 8, 32, 64 streams of
#                    the 8B shape at 4-bit (64 tokens a stream): aggregate
#                    and per-stream rate against one stream's (targets at 64
#                    streams: >= 20x, >= 50%)
# Usage: bench/cuda_targets.sh BUNDLE_DIR [WORK_DIR]
#   BUNDLE_DIR holds petrel and tests/bench_decode_attn (build/gpu-bundle);
#   WORK_DIR (default /tmp/petrel-targets) receives the logs and the
#   synthetic 8B model directory (bench/make_synth_model.py, written once).
# Environment: PARTS (default "decode prefill attn serve"): which parts run.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:?usage: bench/cuda_targets.sh BUNDLE_DIR [WORK_DIR]}
W=${2:-/tmp/petrel-targets}
PARTS=${PARTS:-"decode prefill attn serve"}
P=$B/petrel
[ -x "$P" ] || { echo "cuda_targets: $P is not an executable petrel" >&2; exit 1; }
mkdir -p "$W"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "bundle: $(head -1 "$B/MANIFEST" 2>/dev/null || echo "$B")"
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
# the first row of petrel bench's JSON output -> "label  rate  fraction  [target, verdict]"
row() { # LABEL JSON_FILE KEY_RATE KEY_FRACTION TARGET_PERCENT|-
  python3 - "$@" <<'PY'
import json, sys
label, path, krate, kfrac, target = sys.argv[1:6]
try:
    r = json.load(open(path))[0]
    rate, f = r[krate], 100 * r[kfrac]
except (OSError, ValueError, IndexError, KeyError) as e:
    print(f"{label:34s} no result ({type(e).__name__}: {e}; see {path[:-5]}.err)")
    sys.exit(0)
verdict = "" if target == "-" else f"   target >= {target}%  {'met' if f >= float(target) else 'NOT met'}"
print(f"{label:34s} {rate:10.2f}  {f:5.1f}%{verdict}")
PY
}
if has decode; then
  echo "== batch-1 decode, tg128 at 4-bit (t/s, of read bandwidth)"
  for s in llama-3.2-1b llama-3.2-3b llama-3.1-8b; do
    "$P" bench --device cuda --synthetic "$s" --quant q4 -p 0 -n 128 -r 3 --bw-gib 2 --mma-n 0 --json \
      >"$W/tg_$s.json" 2>"$W/tg_$s.err" || true
    case $s in llama-3.2-1b) t=30 ;; llama-3.1-8b) t=70 ;; *) t=- ;; esac
    row "tg128 $s q4" "$W/tg_$s.json" median_ts bw_fraction "$t"
  done
fi
if has prefill; then
  echo "== prefill, pp2048 of llama-3.1-8b at 4-bit (t/s, of the bf16 GEMM rate)"
  "$P" bench --device cuda --synthetic llama-3.1-8b --quant q4 -p 2048 -n 0 -r 3 --bw-gib 0 --json \
    >"$W/pp_8b.json" 2>"$W/pp_8b.err" || true
  row "pp2048 llama-3.1-8b q4" "$W/pp_8b.json" median_ts mma_fraction 40
fi
if has attn; then
  echo "== fused quantized-KV decode attention, the 8B shape (of read for the KV bytes)"
  BENCH_FUSED_ONLY=1 "$B/tests/bench_decode_attn" 5 2048 8192 32768 >"$W/attn.txt" 2>&1 || true
  grep -E '^(kv |q[48] fused)' "$W/attn.txt" || { echo "no fused rows (see $W/attn.txt)"; }
  awk '$1 ~ /^q[48]$/ && $2 == "fused" && $3 == 32768 { f = $8; sub(/%/, "", f);
       printf "%-34s %s of read   target >= 70%%  %s\n", $1 " fused at 32768", $8, (f + 0 >= 70 ? "met" : "NOT met") }' \
    "$W/attn.txt"
fi
if has serve; then
  echo "== continuous batching, the 8B shape at 4-bit (bench/serve_batch_bench.sh)"
  bench/serve_batch_bench.sh "$P" "$W/l8b" "1 8 32 64" 64 >"$W/serve.txt" 2>&1 || true
  grep -E '^l8b streams|^ratio' "$W/serve.txt" || { echo "no serving rows (see $W/serve.txt)"; }
  python3 - "$W/serve.txt" <<'PY'
import re, sys
m = re.search(r"ratio streams\s+64: agg ([0-9.]+)x one stream, per-stream median ([0-9.]+)%", open(sys.argv[1]).read())
if m:
    a, p = float(m.group(1)), float(m.group(2))
    print(f"{'64 streams against one':34s} {a:.2f}x  target >= 20x  {'met' if a >= 20 else 'NOT met'};"
          f"  per-stream {p:.1f}%  target >= 50%  {'met' if p >= 50 else 'NOT met'}")
PY
fi
echo "logs: $W"
