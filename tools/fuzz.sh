#!/usr/bin/env bash
# `make fuzz`: builds every libFuzzer target fuzz/fuzz_<name>.c with clang
# (-fsanitize=fuzzer,address,undefined) against the library, then runs each
# for SECONDS (default 20). A crash, sanitizer report, leak or timeout fails.
#
#   tools/fuzz.sh [SECONDS] [NAME...]     NAME = fuzz_<NAME>.c (default: all)
#
# Seeds: fuzz/corpus/<name>/ when it exists, plus, for the format parsers, the
# committed fixtures (safetensors files and config JSON). The growing corpus
# and crash files live in build-fuzz/ (not committed). FUZZ_SEED=N fixes
# libFuzzer's random seed (CI does, so a run explores the same inputs each time).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
shift || true
B=${FUZZ_BUILD:-build-fuzz}
CC=${FUZZ_CC:-clang}
command -v "$CC" >/dev/null || { echo "fuzz: $CC not found (apt-get install clang)" >&2; exit 1; }
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"

PKG_CFLAGS=$(pkg-config --cflags libcjson libpcre2-8 libutf8proc libmicrohttpd 2>/dev/null || true)
PKG_LIBS=$(pkg-config --libs libcjson libpcre2-8 libutf8proc libmicrohttpd 2>/dev/null || echo "-lcjson -lpcre2-8 -lutf8proc -lmicrohttpd")
BASE="-std=c11 -O1 -g -D_GNU_SOURCE -Iinclude -Isrc -pthread -fno-strict-aliasing $PKG_CFLAGS"
export CC SAN BASE B

# The library, instrumented for coverage: every src/ file except the CLI,
# compiled by clang. A file clang cannot compile (e.g. a GCC-only builtin in
# a SIMD dispatcher) is compiled by cc without instrumentation instead: it
# links fine, it just gets no coverage. Incremental: a file is rebuilt when
# it, or any header, is newer than its object.
mkdir -p "$B/obj"
newest_h=$(find src include -name '*.h' -printf '%T@\n' | sort -n | tail -1)
compile_one() {
  local src=$1 obj="$B/obj/${1%.c}.o" isa=""
  mkdir -p "$(dirname "$obj")"
  case "$src" in
    *_avx2.c) isa="-mavx2 -mfma -mf16c" ;;
    *_avx512.c) isa="-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16" ;;
    *_amx.c) isa="-mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mamx-tile -mamx-int8 -mamx-bf16" ;;
  esac
  if [ -f "$obj" ] && [ "$obj" -nt "$src" ] && [ "$(stat -c %Y "$obj")" -ge "${newest_h%.*}" ]; then return 0; fi
  "$CC" $BASE $SAN -fsanitize=fuzzer-no-link $isa -c -o "$obj" "$src" 2>"$obj.log" && return 0
  echo "   note: $src: clang failed ($(head -1 "$obj.log")); built by cc without instrumentation" >&2
  cc ${BASE/-O1/-O2} $isa -c -o "$obj" "$src"
}
export -f compile_one
export newest_h
find src -name '*.c' -not -path 'src/cli/*' | LC_ALL=C sort | xargs -P2 -I{} bash -c 'compile_one {}'
rm -f "$B/libpetrel.a"
ar rcs "$B/libpetrel.a" $(find src -name '*.c' -not -path 'src/cli/*' | LC_ALL=C sort | sed "s|^|$B/obj/|; s|\.c$|.o|")

targets=()
if [ $# -gt 0 ]; then for n in "$@"; do targets+=("fuzz/fuzz_$n.c"); done
else for f in fuzz/fuzz_*.c; do [ -f "$f" ] && targets+=("$f"); done; fi

seed() { # name dir: target-specific seeds from the fixtures
  case "$1" in
    safetensors) find tests/fixtures -name '*.safetensors' -size -200k | head -40 | while read -r f; do cp "$f" "$2/"; done ;;
    config) local i=0
      for f in $(find tests/fixtures -name 'config.json' | head -40); do i=$((i+1)); { printf '\0'; cat "$f"; } >"$2/config$i"; done
      for f in $(find tests/fixtures -name 'generation_config.json' | head -10); do i=$((i+1)); { printf '\1'; cat "$f"; } >"$2/gen$i"; done
      for f in $(find tests/fixtures -name 'tokenizer_config.json' -size -64k | head -10); do i=$((i+1)); { printf '\2'; cat "$f"; } >"$2/tok$i"; done
      for f in $(find tests/fixtures -name 'kv_config.json' | head -10); do i=$((i+1)); { printf '\3'; cat "$f"; } >"$2/kv$i"; done ;;
    spec) local i=0 c n
      for c in $(find tests/fixtures -name config.json | LC_ALL=C sort); do
        [ -f "$(dirname "$c")/model.safetensors" ] || continue
        [ "$(stat -c %s "$(dirname "$c")/model.safetensors")" -lt 400000 ] || continue
        i=$((i+1)); n=$(stat -c %s "$c")
        { printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $((n&255)) $(((n>>8)&255)) $(((n>>16)&255)) $(((n>>24)&255)))"
          cat "$c" "$(dirname "$c")/model.safetensors"; } >"$2/model$i"
      done ;;
  esac
}

status=0
for src in "${targets[@]}"; do
  name=$(basename "$src" .c); short=${name#fuzz_}
  bin="$B/fuzz/$name"; mkdir -p "$B/fuzz" "$B/corpus/$short" "$B/crashes/$short"
  if ! "$CC" -std=c11 -O1 -g $SAN -fsanitize=fuzzer -D_GNU_SOURCE -Iinclude -Isrc -Itests $PKG_CFLAGS \
       -o "$bin" "$src" "$B/libpetrel.a" $PKG_LIBS -lm -ldl -pthread 2>"$B/$name.build.log"; then
    echo "FAIL fuzz $short: does not build"; cat "$B/$name.build.log" >&2; status=1; continue
  fi
  [ -d "fuzz/corpus/$short" ] && cp -r "fuzz/corpus/$short/." "$B/corpus/$short/"
  seed "$short" "$B/corpus/$short"
  echo "== fuzz $short (${secs}s)"
  if "$bin" ${FUZZ_SEED:+-seed=$FUZZ_SEED} -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=262144 -print_final_stats=1 \
       -artifact_prefix="$B/crashes/$short/" "$B/corpus/$short" >"$B/$name.log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^Done' "$B/$name.log" | tail -2 | sed "s/^/   /"
  else
    echo "FAIL fuzz $short: see $B/$name.log and $B/crashes/$short/"; tail -40 "$B/$name.log" >&2; status=1
  fi
done
exit $status
