#!/bin/sh
# Extracts the King James Bible (public domain) from the Debian package
# bible-kjv-text, one verse a line ("Ge1:1 In the beginning ..."), for
# tools/train-demo/train.py.   Usage: tools/train-demo/extract_kjv.sh OUT.txt
set -eu
out=${1:?usage: extract_kjv.sh OUT.txt}
command -v bible >/dev/null || { echo "extract_kjv.sh: needs the 'bible' command (apt-get install bible-kjv)" >&2; exit 1; }
bible -f "Gen1:1-Rev22:21" > "$out"
n=$(wc -l < "$out")
[ "$n" -eq 31102 ] || { echo "extract_kjv.sh: expected 31102 verses, got $n" >&2; exit 1; }
echo "wrote $out ($n verses)"
