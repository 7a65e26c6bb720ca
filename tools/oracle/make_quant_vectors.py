#!/usr/bin/env python3
"""Writes tests/fixtures/quant/vectors.bin: MLX affine quantization test vectors
made by tools/oracle/mlxq.py (pure Python, no numpy/torch needed).

Each case k holds
  case.k.params  i32 [3]  bits, group_size, input dtype (0 = bf16, 1 = f32)
  case.k.input   bf16 or f32 [rows, cols]   the weights
  case.k.words   u32 [rows, cols*bits/32]   packed codes
  case.k.scales  same dtype as input [rows, cols/group_size]
  case.k.biases  same dtype as input [rows, cols/group_size]
plus meta.n_cases i32 [1].  Regenerate: python3 tools/oracle/make_quant_vectors.py
"""
import os
import random
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlxq  # noqa: E402
from goldfile import GoldenWriter  # noqa: E402


def special_rows(cols, rng, conv):
    """Rows whose groups hit the rule's corners."""
    rows = []
    rows.append([conv(rng.gauss(0, 1)) for _ in range(cols)])                 # generic
    rows.append([0.0] * cols)                                                 # all zero -> at_zero branch
    rows.append([conv(abs(rng.gauss(0, 0.02)) + 0.5) for _ in range(cols)])   # all positive
    rows.append([conv(-abs(rng.gauss(0, 3)) - 1) for _ in range(cols)])       # all negative (kernel max starts at 0)
    r = [conv(rng.gauss(0, 0.01)) for _ in range(cols)]
    for i in range(0, cols, 17):
        r[i] = conv(rng.choice([-1, 1]) * 40.0)                               # outliers
    rows.append(r)
    rows.append([conv((i % 16) * 0.125 - 1.0) for i in range(cols)])          # exact grid, ties
    rows.append([conv(rng.uniform(-1e-8, 1e-8)) for _ in range(cols)])        # tiny: eps floor
    rows.append([conv(rng.gauss(0, 1) * 10 ** rng.uniform(-3, 3)) for _ in range(cols)])  # mixed magnitudes
    return rows


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "..", "..", "tests", "fixtures", "quant", "vectors.bin")
    rng = random.Random(20260314)
    w = GoldenWriter()
    k = 0
    cols = 256
    for dtype in ("bf16", "f32"):
        conv = mlxq.bf16 if dtype == "bf16" else mlxq.f32
        for bits in (2, 3, 4, 5, 6, 8):
            for gs in ((32, 64, 128) if dtype == "bf16" else (64,)):
                rows = special_rows(cols, rng, conv)
                words, scales, biases = mlxq.quantize_rows_py(rows, bits, gs, out_dtype=dtype)
                flat = [x for r in rows for x in r]
                w.add_list("case.%d.params" % k, "i32", [3], [bits, gs, 0 if dtype == "bf16" else 1])
                if dtype == "bf16":
                    w.add_list("case.%d.input" % k, "bf16", [len(rows), cols], [mlxq.bf16_bits(x) for x in flat])
                    w.add_list("case.%d.scales" % k, "bf16", [len(rows), cols // gs],
                               [mlxq.bf16_bits(x) for r in scales for x in r])
                    w.add_list("case.%d.biases" % k, "bf16", [len(rows), cols // gs],
                               [mlxq.bf16_bits(x) for r in biases for x in r])
                else:
                    w.add_list("case.%d.input" % k, "f32", [len(rows), cols], flat)
                    w.add_list("case.%d.scales" % k, "f32", [len(rows), cols // gs], [x for r in scales for x in r])
                    w.add_list("case.%d.biases" % k, "f32", [len(rows), cols // gs], [x for r in biases for x in r])
                w.add_list("case.%d.words" % k, "u32", [len(rows), cols * bits // 32], [x for r in words for x in r])
                k += 1
    w.add_list("meta.n_cases", "i32", [1], [k])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    w.write(out)
    print("wrote %s: %d cases" % (os.path.normpath(out), k))


if __name__ == "__main__":
    main()
