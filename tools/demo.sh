#!/usr/bin/env bash
# `make demo`: petrel generating text with the bundled demo model
# (models/kjv-llama-4bit, a 4-bit Llama trained on the King James Bible):
# a plain continuation, a chat turn through the model's ChatML template, and
# a short piped chat session. DEMO_MODEL=DIR runs another model directory.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${DEMO_MODEL:-models/kjv-llama-4bit}
PETREL=${PETREL:-build/petrel}
if [ ! -f "$MODEL/config.json" ]; then
  echo "petrel demo: no model at $MODEL" >&2
  exit 1
fi
echo "== petrel inspect $MODEL"
"$PETREL" inspect "$MODEL" || true
echo
echo "== petrel generate -m $MODEL -p 'In the beginning God' --max-tokens 60 --temp 0"
"$PETREL" generate -m "$MODEL" -p "In the beginning God" --max-tokens 60 --temp 0
echo
echo "== petrel generate -m $MODEL --chat -p 'Recite John 3:16.' --max-tokens 80 --temp 0"
"$PETREL" generate -m "$MODEL" --chat -p "Recite John 3:16." --max-tokens 80 --temp 0
echo
echo "== printf 'Quote Psalm 23:1.\nWhat does Genesis 1:1 say?\n' | petrel chat -m $MODEL --temp 0.7 --seed 1"
printf 'Quote Psalm 23:1.\nWhat does Genesis 1:1 say?\n' | "$PETREL" chat -m "$MODEL" --temp 0.7 --seed 1 --max-tokens 80
