#!/usr/bin/env python3
"""Cuts the op-level excerpt that tests/test_deltanet.c checks out of a
trace written by trace_qwen35.py (bf16 run of tests/fixtures/qwen3_5_text):
prompt 3 (44 tokens: the chunked prefill), DeltaNet layer 0, the inputs and
outputs of its three ops as transformers computed them in bf16.

  python3 tools/oracle/extract_qwen35_trace.py TRACE_DIR/trace.bin tests/fixtures/qwen3_5_text/trace.bin

Names (bf16 unless noted): l0.qkv [T, conv_dim] (in_proj_qkv output),
l0.conv [T, conv_dim] (conv1d + SiLU), l0.b, l0.a [T, Hv], l0.z [T, Hv·Dv],
l0.core [T, Hv, Dv] (delta-rule output), l0.gnorm [T·Hv, Dv] (gated norm
output), meta.prompt i32 [1]. Pure Python (goldfile.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from goldfile import GoldenWriter, read  # noqa: E402

PROMPT, LAYER = 3, 0


def main():
    src, dst = sys.argv[1], sys.argv[2]
    g = read(src)
    w = GoldenWriter()
    for what in ("qkv", "conv", "b", "a", "z", "core", "gnorm"):
        dt, shape, data = g["p%d.l%d.%s" % (PROMPT, LAYER, what)]
        assert dt == "bf16", (what, dt)
        w.add_bytes("l%d.%s" % (LAYER, what), dt, shape, data)
    w.add_list("meta.prompt", "i32", [1], [PROMPT])
    w.write(dst)
    print("wrote", dst, os.path.getsize(dst), "bytes")


if __name__ == "__main__":
    main()
