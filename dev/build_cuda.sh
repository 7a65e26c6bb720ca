#!/usr/bin/env bash
# Builds the dev/ CUDA benchmarks (dev/cuda_*.c) against build-cuda/libpetrel.a
# (run `make gpu-bundle` first); the binaries use the bundle's RPATH layout, so
# copy them next to build/gpu-bundle/tests/ to run them on the GPU machine.
set -e
cd "$(dirname "$0")/.."
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
for f in dev/cuda_*.c; do
  cc -std=c11 -O2 -D_GNU_SOURCE -Iinclude -Isrc -I"$CUDA_HOME/include" -DPT_HAVE_CUDA=1 -pthread \
     -o "${f%.c}" "$f" build-cuda/libpetrel.a \
     -Wl,--no-as-needed -Wl,--disable-new-dtags -Wl,-rpath,'$ORIGIN/lib' -Wl,-rpath,'$ORIGIN/../lib' \
     -Wl,-rpath,"$CUDA_HOME/lib64" -lcjson -lpcre2-8 -lutf8proc -lmicrohttpd -lm -ldl \
     -L"$CUDA_HOME/lib64" -lcublas -lcudart_static -lrt -lstdc++
done
# the kernel timeline tracer (a CUPTI injection library, dev/README.md)
cc -O2 -Wall -Wextra -shared -fPIC -I"$CUDA_HOME/include" -o dev/trace_cupti.so dev/trace_cupti.c \
   -L"$CUDA_HOME/targets/x86_64-linux/lib" -L"$CUDA_HOME/extras/CUPTI/lib64" -lcupti -lstdc++
