#!/usr/bin/env bash
# Continuous-batching serving benchmark (bench/RESULTS.md, "Continuous
# batching on the H200"): `petrel serve --device ${DEVICE:-cuda} --parallel 64` on a
# model directory, driven by bench/loadgen.py on the same machine with 1, 8,
# 32 and 64 concurrent streams; per level: aggregate output tok/s, per-stream
# tok/s, time to first token, mean batch size per decode step (/metrics);
# where the levels include 1, each other level's aggregate and per-stream rate
# as a ratio to it, from this one run.
#
# Usage: bench/serve_batch_bench.sh PETREL MODEL_DIR [LEVELS] [TOKENS]
#   MODEL_DIR is written first when absent: bench/make_synth_model.py
#   MODEL_DIR llama-3.1-8b (random 4-bit weights of the published shape).
#   LEVELS default "1 8 32 64"; TOKENS (generated per stream) default 64.
# Environment: PROMPT_LEN (default 16), CTX (default 1024), PARALLEL (64),
# VERIFY (default 2: per level, the first 2 replies rerun alone must be identical),
# VERIFY_FULL (default 1: those replies keep their whole prompts, exact when the
# server runs prompts as rows; 0: one-token prompts, for builds before that),
# LABEL (default: the model directory's name).
set -eu
cd "$(dirname "$0")/.."
PETREL=$1
MODEL=$2
LEVELS=${3:-"1 8 32 64"}
TOKENS=${4:-64}
PROMPT_LEN=${PROMPT_LEN:-16}
CTX=${CTX:-1024}
PARALLEL=${PARALLEL:-64}
[ -d "$MODEL" ] || python3 bench/make_synth_model.py "$MODEL" llama-3.1-8b
ERR=$(mktemp)
OUTS=$(mktemp)
PID=
trap '[ -n "$PID" ] && kill $PID 2>/dev/null; rm -f "$ERR" "$OUTS"' EXIT
t0=$(date +%s%N)
"$PETREL" serve -m "$MODEL" --device ${DEVICE:-cuda} --parallel "$PARALLEL" --ctx "$CTX" --prompt-cache 0 --port 0 2>"$ERR" &
PID=$!
PORT=
for _ in $(seq 1 1200); do
  PORT=$(sed -n 's/.*ready on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$ERR")
  [ -n "$PORT" ] && break
  kill -0 $PID 2>/dev/null || { cat "$ERR"; exit 1; }
  sleep 0.1
done
[ -n "$PORT" ] || { cat "$ERR"; echo "server not ready"; exit 1; }
cat "$ERR"
echo "ready after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
V=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$MODEL/config.json")
# warm-up: sessions for every slot, and the CUDA graph of each batch bucket
for n in $LEVELS; do
  python3 bench/loadgen.py --port "$PORT" --streams "$n" --tokens 3 --prompt-len "$PROMPT_LEN" --vocab "$V" \
    --seed 99 --label warmup >/dev/null
done
for n in $LEVELS; do
  python3 bench/loadgen.py --port "$PORT" --streams "$n" --tokens "$TOKENS" --prompt-len "$PROMPT_LEN" --vocab "$V" \
    --seed "$n" --label "${LABEL:-$(basename "$MODEL")}" --verify "${VERIFY:-2}" \
    $([ "${VERIFY_FULL:-1}" = 1 ] && echo --verify-full) | tee -a "$OUTS"
done
# with a one-stream level in this run: each level against it, measured side by side (issue 13's ratios)
python3 - "$OUTS" <<'PY'
import json, sys
runs = [json.loads(l[5:]) for l in open(sys.argv[1]) if l.startswith("JSON ")]
one = next((r for r in runs if r["streams"] == 1), None)
if one:
    for r in runs:
        if r["streams"] > 1:
            print(f"ratio streams {r['streams']:3d}: agg {r['agg_tok_s'] / one['agg_tok_s']:.2f}x one stream, "
                  f"per-stream median {100 * r['per_stream_median_tok_s'] / one['per_stream_median_tok_s']:.1f}% of one stream's")
PY
python3 -c "import urllib.request,sys; print(''.join(l for l in urllib.request.urlopen(sys.argv[1]).read().decode().splitlines(True) if l.startswith(('petrel_batch_size', 'petrel_prompt_row', 'petrel_pipelined', 'petrel_scheduler'))))" "http://127.0.0.1:$PORT/metrics"
