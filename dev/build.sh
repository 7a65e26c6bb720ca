#!/usr/bin/env bash
# Builds the dev/ benchmarks against build/libpetrel.a (run `make` first).
set -e
cd "$(dirname "$0")/.."
for f in dev/bench_*.c; do
  cc -std=c11 -O2 -g -D_GNU_SOURCE -Iinclude -Isrc -pthread -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mavx512vnni -mfma \
     -o "${f%.c}" "$f" build/libpetrel.a -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lm -ldl
done
