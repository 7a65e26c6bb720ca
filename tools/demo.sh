#!/usr/bin/env bash
# `make demo`: shows petrel on the bundled demo model (models/kjv-llama-4bit,
# a small Llama trained by petrel on the King James Bible, MLX 4-bit): first
# `petrel inspect` validates and describes it, then `petrel generate`
# continues a prompt greedily. If this build cannot generate yet, it says so.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${DEMO_MODEL:-models/kjv-llama-4bit}
PROMPT=${DEMO_PROMPT:-"In the beginning God created"}
echo "== build/petrel inspect $MODEL"
build/petrel inspect "$MODEL" | sed -n '1,8p'
echo
echo "== build/petrel generate -m $MODEL -p \"$PROMPT\" --max-tokens 48 --temp 0"
if ! build/petrel generate -m "$MODEL" -p "$PROMPT" --max-tokens 48 --temp 0; then
  echo
  echo "petrel demo: text generation is not available in this build (see the message above);"
  echo "the model loads and validates (run 'make check' for the test suite)."
fi
