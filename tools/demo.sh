#!/usr/bin/env bash
# `make demo`: shows petrel on the bundled demo model. Until text generation
# lands, it validates and describes the model with `petrel inspect` and says
# so plainly; the generation demo replaces this once `petrel generate` works.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${DEMO_MODEL:-models/kjv-llama-4bit}
[ -d "$MODEL" ] || MODEL=tests/fixtures/format/llama
echo "== petrel inspect $MODEL"
build/petrel inspect "$MODEL"
echo
echo "petrel demo: text generation is not available yet in this build;"
echo "the model above loads and validates (run 'make check' for the test suite)."
