#!/usr/bin/env bash
# One round on a GPU machine that has CUDA 13 and Python but none of our build
# tools: the CUDA suite, the issue targets and kernel timelines, from a packed
# GPU bundle, in one command. Two halves:
#
#   dev/gpu_round.sh pack PACK.tar.xz
#       on the build machine: the GPU bundle (tools/gpu-bundle.sh, ~160 MB)
#       and the kernel timeline tracer (dev/trace_cupti.so) packed as one xz
#       archive (~18 MB: one thread, a 192 MiB dictionary; the binaries share
#       most of their bytes, which a multi-threaded xz's blocks do not see).
#   dev/gpu_round.sh run PACK.tar.xz OUTDIR
#       on the GPU machine, from a copy of the tree: unpacks to $ROUND_DIR
#       (default /tmp/petrel-round), writes the synthetic llama-3.1-8b model
#       (bench/make_synth_model.py, ~40 s) in the background, then runs the
#       parts of $PARTS (default "check targets trace"):
#         check    tests/run-cuda.sh over the bundle (the logs in OUTDIR/check)
#         targets  bench/cuda_targets.sh (issue 11 and 13 rows, OUTDIR/targets.txt)
#         trace    a tg128 of $TRACE_SHAPES (default llama-3.1-8b llama-3.2-1b)
#                  under dev/trace_cupti.so, summarized by dev/trace_cupti.py
#                  (OUTDIR/trace_SHAPE.txt: exposed time per kernel)
#       and prints each part's summary. Paired A/B runs of switches stay with
#       bench/cuda_ab.sh (the same bundle: $ROUND_DIR/bundle).
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-}
case $cmd in
pack)
  out=${2:?usage: dev/gpu_round.sh pack PACK.tar.xz}
  case $out in /*) ;; *) out=$PWD/$out ;; esac
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  GPU_BUNDLE=$stage/bundle tools/gpu-bundle.sh
  CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  cc -O2 -Wall -Wextra -shared -fPIC -I"$CUDA_HOME/include" -o "$stage/trace_cupti.so" dev/trace_cupti.c \
    -L"$CUDA_HOME/targets/x86_64-linux/lib" -L"$CUDA_HOME/extras/CUPTI/lib64" -lcupti -lstdc++
  tar -C "$stage" -c bundle trace_cupti.so | xz -T1 --lzma2=preset=6,dict=192MiB >"$out"
  echo "gpu_round: $out ($(du -h "$out" | cut -f1)), bundle of $(sed -n 's/^commit: //p' "$stage/bundle/MANIFEST")"
  ;;
run)
  pack=${2:?usage: dev/gpu_round.sh run PACK.tar.xz OUTDIR}
  out=${3:?usage: dev/gpu_round.sh run PACK.tar.xz OUTDIR}
  R=${ROUND_DIR:-/tmp/petrel-round}
  PARTS=${PARTS:-"check targets trace"}
  has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
  mkdir -p "$R" "$out"
  rm -rf "$R/bundle"
  xz -dc "$pack" | tar -C "$R" -x
  B=$R/bundle
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
  echo "bundle: $(sed -n 's/^commit: //p' "$B/MANIFEST")"
  # the tracer needs CUPTI, which CUDA ships beside its other libraries
  cupti=$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcupti.so*' 2>/dev/null | head -1 || true)
  [ -n "$cupti" ] && export LD_LIBRARY_PATH=$(dirname "$cupti")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  T=$R/targets
  mkdir -p "$T"
  syn=
  if has targets && [ ! -d "$T/l8b" ]; then
    python3 bench/make_synth_model.py "$T/l8b" llama-3.1-8b >"$out/synth.log" 2>&1 &
    syn=$!
  fi
  t0=$SECONDS
  if has check; then
    echo "== check-cuda"
    GPU_BUNDLE=$B CHECK_CUDA_LOGS=$out/check tests/run-cuda.sh >"$out/check.txt" 2>&1 || true
    grep -E '^FAIL' "$out/check.txt" | head -20 || true
    tail -1 "$out/check.txt"
    echo "($((SECONDS - t0)) s)"
  fi
  if [ -n "$syn" ]; then
    wait "$syn" || { echo "gpu_round: the synthetic model failed (see $out/synth.log)" >&2; tail -3 "$out/synth.log" >&2; }
  fi
  if has targets; then
    echo "== targets"
    bench/cuda_targets.sh "$B" "$T" 2>&1 | tee "$out/targets.txt" || true
    echo "($((SECONDS - t0)) s)"
  fi
  if has trace; then
    echo "== traces (exposed us a step, per kernel)"
    for s in ${TRACE_SHAPES:-llama-3.1-8b llama-3.2-1b}; do
      CUDA_INJECTION64_PATH=$R/trace_cupti.so PETREL_TRACE_OUT=$R/trace_$s.tsv \
        "$B/petrel" bench --device cuda --synthetic "$s" --quant q4 -p 0 -n 128 -r 1 --bw-gib 0 \
        >"$out/trace_$s.log" 2>&1 || { echo "gpu_round: traced run of $s failed (see $out/trace_$s.log)"; continue; }
      python3 dev/trace_cupti.py "$R/trace_$s.tsv" 100 30 >"$out/trace_$s.txt" 2>&1 || true
      echo "-- $s"
      head -30 "$out/trace_$s.txt"
    done
    echo "($((SECONDS - t0)) s)"
  fi
  ;;
*)
  echo "usage: dev/gpu_round.sh pack PACK.tar.xz | run PACK.tar.xz OUTDIR" >&2
  exit 2
  ;;
esac
