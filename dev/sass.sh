#!/usr/bin/env bash
# dev/sass.sh — the SASS of a CUDA kernel on a machine without a GPU: CUDA 13's
# nvcc here builds the cubin, and the disassembler comes from Debian's
# nvidia-cuda-toolkit (non-free, CUDA 11.8), which knows sm_90 but not the ELF
# identification CUDA 13 writes (OS/ABI 0x41, ABI version 8, the architecture
# in e_flags bits 8..15); a copy of the cubin with the older identification
# (OS/ABI 0x33, ABI version 7, e_flags 0x5a055a: sm_90) disassembles.
#
#   dev/sass.sh FILE.cu [FUNCTION-SUBSTRING]    compile (as the Makefile does) and disassemble
#   dev/sass.sh FILE.cubin [FUNCTION-SUBSTRING] disassemble a cubin
#   dev/sass.sh --ops FILE.sass                 opcode counts of a disassembly (or of one function's)
#
# With a substring only the functions whose section name contains it are
# printed (e.g. `fdt_block_kernelILi4ELi64ELi128ELi4E`). The first run
# downloads nvidia-cuda-toolkit's .deb (~84 MB, not installed: unpacked under
# ~/.cache/petrel-nvdisasm); NVDISASM=/path/to/nvdisasm uses another one.
# Static counts only: which path a warp takes is for ncu's source counters.
set -euo pipefail

cache=${XDG_CACHE_HOME:-$HOME/.cache}/petrel-nvdisasm
nvdisasm=${NVDISASM:-$cache/usr/bin/nvdisasm}

if [ "${1:-}" = "--ops" ]; then
    [ $# -eq 2 ] || { echo "usage: dev/sass.sh --ops FILE.sass" >&2; exit 2; }
    grep -E '^\s+/\*[0-9a-f]{4,}\*/' "$2" | sed -E 's#^\s+/\*[0-9a-f]+\*/\s+##; s/^@!?U?P[0-9T]+\s+//' |
        awk '{split($1, a, "."); n[a[1]]++; t++} END {for (k in n) printf "%6d %s\n", n[k], k; printf "%6d total\n", t}' |
        sort -rn
    exit 0
fi
[ $# -ge 1 ] && [ $# -le 2 ] || { sed -n '2,20p' "$0" >&2; exit 2; }
src=$1 filter=${2:-}

if [ ! -x "$nvdisasm" ]; then
    echo "dev/sass.sh: fetching nvidia-cuda-toolkit (Debian non-free) for its nvdisasm into $cache" >&2
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/lists/partial" "$tmp/archives/partial" "$cache"
    echo "deb http://deb.debian.org/debian bookworm non-free" >"$tmp/sources.list"
    apt_opts=(-o Dir::Etc::sourcelist="$tmp/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$tmp/lists"
        -o Dir::Cache::Archives="$tmp/archives" -o APT::Sandbox::User=root)
    apt-get "${apt_opts[@]}" update >/dev/null
    (cd "$tmp" && apt-get "${apt_opts[@]}" download nvidia-cuda-toolkit >/dev/null)
    dpkg -x "$tmp"/nvidia-cuda-toolkit_*.deb "$cache"
    [ -x "$nvdisasm" ] || { echo "dev/sass.sh: no nvdisasm in the package" >&2; exit 1; }
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
case "$src" in
*.cu)
    nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
    root=$(cd "$(dirname "$0")/.." && pwd)
    "$nvcc" -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I"$root/include" -I"$root/src" -cubin \
        -o "$work/in.cubin" "$src"
    ;;
*.cubin) cp "$src" "$work/in.cubin" ;;
*) echo "dev/sass.sh: $src: a .cu or a .cubin" >&2; exit 2 ;;
esac

# ELF64 header: e_ident[EI_OSABI] at 7, e_ident[EI_ABIVERSION] at 8, e_flags at 0x30
python3 - "$work/in.cubin" "$work/old.cubin" <<'EOF'
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
if b[:4] != b'\x7fELF' or b[4] != 2:
    sys.exit('dev/sass.sh: not a 64-bit ELF cubin')
if b[7] == 0x41:
    arch = (struct.unpack_from('<I', b, 0x30)[0] >> 8) & 0xff
    if arch != 90:
        sys.exit('dev/sass.sh: sm_%d cubin; only sm_90 is mapped to the old identification' % arch)
    b[7], b[8] = 0x33, 7
    struct.pack_into('<I', b, 0x30, 0x005a055a)
open(sys.argv[2], 'wb').write(b)
EOF
"$nvdisasm" -c "$work/old.cubin" >"$work/out.sass"
if [ -z "$filter" ]; then
    cat "$work/out.sass"
else
    awk -v f="$filter" '/^\/\/-+ \.text\./ {on = index($0, f) > 0} on' "$work/out.sass"
fi
