#!/usr/bin/env bash
# Server benchmarks (results go to bench/RESULTS.md, section "Server"):
#   1. start to ready: launch `petrel serve` until /health answers (and the
#      server's own "s to ready");
#   2. overhead: `petrel generate` tok/s and first-token time against the same
#      prompt streamed through POST /v1/completions (same tokens: temperature 0),
#      alternating direct / HTTP runs (A B A B) so machine noise hits both;
#   3. N parallel streams: aggregate tok/s with N = 1, 2, 4 concurrent streams;
#   4. the constrained-decoding mask on a 151k-token vocabulary.
# Usage: bench/server_bench.sh [MODEL_DIR] [THREADS] [REPS]
# The HTTP client is bench/server_client.py (python3 standard library; a harness only).
set -eu
cd "$(dirname "$0")/.."
MODEL=${1:-$(ls -d models/*/ | head -1)}
T=${2:-1}
REPS=${3:-8}
N_GEN=${N_GEN:-64}
PROMPT=${PROMPT:-"In the beginning|And God said|Blessed are the|Now the serpent was|The heavens declare|For God so loved|And Jesus answered|And the LORD spake unto Moses"}
PETREL=${PETREL:-build/petrel}
TMP=$(mktemp -d); trap 'kill $PID 2>/dev/null; rm -rf "$TMP"' EXIT
PID=

echo "commit $(git rev-parse --short HEAD)  model $MODEL  threads $T  n_gen $N_GEN  reps $REPS"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"

start_server() { # extra args...
  : >"$TMP/err"
  "$PETREL" serve -m "$MODEL" --port 0 -t "$T" "$@" 2>"$TMP/err" &
  PID=$!
  PORT=""
  for _ in $(seq 1 400); do
    PORT=$(sed -n 's/.*ready on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$TMP/err")
    [ -n "$PORT" ] && break
    sleep 0.005
  done
}
stop_server() { kill "$PID"; wait "$PID" 2>/dev/null || true; PID=; }

echo "## start to ready"
for r in $(seq 1 "$REPS"); do
  : >"$TMP/err"
  t0=$(date +%s.%N)
  "$PETREL" serve -m "$MODEL" --port 0 -t "$T" 2>"$TMP/err" &
  PID=$!
  PORT=""
  until [ -n "$PORT" ] && curl -s -o /dev/null "http://127.0.0.1:$PORT/health"; do
    PORT=$(sed -n 's/.*ready on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$TMP/err")
    sleep 0.002
  done
  t1=$(date +%s.%N)
  self=$(sed -n 's/.*(\([0-9.]*\) s to ready).*/\1/p' "$TMP/err")
  echo "start-to-ready: launch->/health answered $(echo "$t1 - $t0" | bc -l | cut -c1-6) s; server-reported $self s"
  stop_server
done

CLIENT=bench/server_client.py
echo "## direct generate vs HTTP stream (alternating A B A B; medians)"
start_server --parallel 4
python3 "$CLIENT" ab "$PETREL" "$MODEL" "$T" "$PROMPT" "$N_GEN" "$REPS" "$PORT"
echo "## parallel streams (aggregate over N concurrent streams)"
for n in 1 2 4; do python3 "$CLIENT" stream "$PORT" "$PROMPT" "$N_GEN" "$n"; done
stop_server

echo "## constrained-decoding mask (151k-token synthetic vocabulary)"
cc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc $(pkg-config --cflags libcjson) bench/server_mask_bench.c \
  "${PETREL%/petrel}/libpetrel.a" $(pkg-config --libs libcjson) -lm -o "$TMP/mask_bench"
"$TMP/mask_bench"
