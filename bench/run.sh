#!/usr/bin/env bash
# `make bench`: a quick benchmark pass on this machine — the bundled demo model
# and the llama-3.2-1b shape at 4-bit (random weights), pp and tg with the
# achieved bandwidth fraction. Longer, recorded runs are described in
# bench/RESULTS.md (each with its exact command).
set -euo pipefail
cd "$(dirname "$0")/.."
P=${PETREL:-build/petrel}
T=${THREADS:-0}
echo "== demo model (models/kjv-llama-4bit)"
"$P" bench -m models/kjv-llama-4bit -t "$T" -p 128 -n 64 -r 3
echo "== synthetic llama-3.2-1b, q4"
"$P" bench --synthetic llama-3.2-1b --quant q4 -t "$T" -p 64 -n 32 -r 3
