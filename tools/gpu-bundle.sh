#!/usr/bin/env bash
# make gpu-bundle: builds the CUDA binaries (make CUDA=1, in build-cuda/) and
# assembles build/gpu-bundle/ to be carried to a GPU machine that has CUDA's
# own libraries but none of our Debian packages:
#   petrel            the CUDA-enabled binary
#   tests/test_*      the CUDA test binaries (tests/cuda/test_*.c); `make
#                     check-cuda` on the GPU machine runs them — nothing
#                     compiles there
#   tests/bench_*     the CUDA op benchmarks (tests/cuda/bench_*.c)
#   lib/              libpetrel_cuda.so (the library the test binaries link;
#                     petrel itself is static) and the non-system shared
#                     libraries the binaries link
#                     (cJSON, libmicrohttpd, PCRE2, utf8proc and their own
#                     dependencies), found through the binaries' RPATH
#                     $ORIGIN/lib (tests: $ORIGIN/../lib); linked with
#                     --disable-new-dtags so the RPATH also serves the bundled
#                     libraries' own dependencies (a RUNPATH would not)
#   MANIFEST          commit, build host, what was bundled
# Not bundled: glibc and the toolchain's runtime (libc, libm, libstdc++,
# libgcc_s, ...) — the GPU machine's newer ones serve — and CUDA's libraries
# (cuBLAS alone is hundreds of MB; the GPU machine's CUDA 13 provides them;
# cudart is linked statically).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_CUDA=${BUILD_CUDA:-build-cuda}
DEST=${GPU_BUNDLE:-build/gpu-bundle}
export PATH=$PATH:/usr/local/cuda/bin

make -j2 --no-print-directory CUDA=1 BUILD="$BUILD_CUDA" all

rm -rf "$DEST"
mkdir -p "$DEST/lib" "$DEST/tests"
cp "$BUILD_CUDA/petrel" "$DEST/"
shopt -s nullglob
tests=("$BUILD_CUDA"/tests/cuda/test_* "$BUILD_CUDA"/tests/cuda/bench_*)
[ ${#tests[@]} -gt 0 ] || { echo "gpu-bundle: no CUDA test binaries in $BUILD_CUDA/tests/cuda" >&2; exit 1; }
for t in "${tests[@]}"; do
  case "$t" in *.d|*.o) continue ;; esac
  cp "$t" "$DEST/tests/"
done
# The test binaries link the library as one shared object (Makefile: CUDA_SO), found
# in lib/ through their RPATH $ORIGIN/../lib.
cp "$BUILD_CUDA/libpetrel_cuda.so" "$DEST/lib/"
# Debug info stays in build-cuda/; the bundle travels, so keep it small.
strip --strip-debug "$DEST/petrel" "$DEST"/tests/* "$DEST/lib/libpetrel_cuda.so"

# A binary linking libpetrel_cuda.so must not carry a CUDA runtime of its own (the
# shared object's is hidden: the process would run two; the Makefile links the
# sources that call the runtime against libpetrel.a instead).
for bin in "$DEST"/tests/*; do
  if readelf -d "$bin" | grep -q 'libpetrel_cuda\.so' && nm "$bin" 2>/dev/null | grep -q ' T cudaMalloc$'; then
    echo "gpu-bundle: $bin links libpetrel_cuda.so and a CUDA runtime of its own" >&2
    exit 1
  fi
done

# Libraries supplied by the GPU machine itself (glibc family, toolchain
# runtime, the dynamic loader, CUDA). Everything else ldd resolves is bundled.
is_system() {
  case "$1" in
    linux-vdso.so*|ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*) return 0 ;;
    libutil.so*|libgcc_s.so*|libstdc++.so*|libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*) return 0 ;;
  esac
  return 1
}
bundled=()
for bin in "$DEST/petrel" "$DEST"/tests/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_system "$name" && continue
    if [ "$path" = "not" ]; then echo "gpu-bundle: $bin needs $name, which is not found here" >&2; exit 1; fi
    if [ ! -e "$DEST/lib/$name" ]; then
      cp -L "$path" "$DEST/lib/$name"
      bundled+=("$name")
    fi
  done < <(ldd "$bin")
done

# Every bundled binary must resolve its non-system libraries, direct and
# indirect, from the bundle's lib/ alone (ldd from here proves the RPATH
# works). A bundled library with its own RUNPATH would switch the binary's
# RPATH off for its dependencies: refuse it.
libdir=$(realpath "$DEST/lib")
for lib in "$DEST"/lib/*; do
  if readelf -d "$lib" | grep -q RUNPATH; then echo "gpu-bundle: $lib has a RUNPATH" >&2; exit 1; fi
done
for bin in "$DEST/petrel" "$DEST"/tests/*; do
  [ -f "$bin" ] || continue
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_system "$name" && continue
    if [ "$(dirname "$(realpath "$path")")" != "$libdir" ]; then
      echo "gpu-bundle: $bin resolves $name to $path, outside the bundle" >&2; exit 1
    fi
  done < <(ldd "$bin")
done

{
  echo "petrel GPU bundle"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "nvcc: $(nvcc --version | tail -1)"
  echo "binaries: petrel $(cd "$DEST" && ls tests | sed 's|^|tests/|' | tr '\n' ' ')"
  echo "the library the test binaries link: lib/libpetrel_cuda.so"
  echo "bundled libraries: ${bundled[*]:-(none)}"
  echo "from the GPU machine: libcublas.so.13, libcublasLt.so.13, the CUDA driver (libcuda.so.1), glibc, libstdc++"
} > "$DEST/MANIFEST"
du -sh "$DEST" | awk '{print "gpu-bundle: " $2 " (" $1 ")"}'
