"""MLX affine quantization, written independently for petrel's fixtures.

What it is: the rule MLX's Metal `affine_quantize` kernel applies (what
mlx-community checkpoints were made with), in two implementations that must
agree bit for bit:
  * pure Python (`quantize_rows_py`): fp32 arithmetic emulated exactly by
    rounding every operation's double result to fp32 (for +, -, *, / of fp32
    operands a double result rounded once to fp32 is the correctly rounded fp32
    result).  Used for the cross-check vectors petrel's C quantizer must match,
    and runnable without numpy/torch.
  * torch (`quantize_torch`): the same rule vectorized, used on real weights.
What it is not: MLX's CPU fallback (it starts the running max at -inf instead
of 0, so a group of all-negative values gets a different scale), and not the
fp (mxfp4/nvfp4) modes.

Rule per group of `group_size` values w (fp32, read from the weight dtype):
  w_max = max(0, max w)            (the kernel's running max starts at 0)
  w_min = min w
  s     = max((w_max - w_min) / (2^bits - 1), 1e-7)
  if |w_min| > |w_max|: s = +s, edge = w_min   else: s = -s, edge = w_max
  q0 = round(edge / s)             (round half away from zero, Metal round())
  if q0 != 0: s = edge / q0, bias = edge    else: bias = 0
  q  = min(round((w - bias) / s), 2^bits - 1)
Stored: scales = dtype(s), biases = dtype(bias) (bf16 for bf16 weights, rounded
to nearest even); codes packed LSB first into little-endian uint32 words, value
i of a row at bits [i*bits, (i+1)*bits) of the row's bit stream (3-, 5- and
6-bit values straddle words).  Dequantize: w' = scale * q + bias.
"""

import math
import struct

EPS = struct.unpack("<f", struct.pack("<f", 1e-7))[0]


def f32(x):
    """Rounds a Python float to the nearest fp32 value."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bf16_bits(x):
    """fp32 value -> bf16 bit pattern, round to nearest even (NaN kept quiet)."""
    u = f32_bits(f32(x))
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return ((u >> 16) | 0x40) & 0xFFFF
    u += 0x7FFF + ((u >> 16) & 1)
    return (u >> 16) & 0xFFFF


def bf16_value(bits16):
    return struct.unpack("<f", struct.pack("<I", (bits16 & 0xFFFF) << 16))[0]


def bf16(x):
    return bf16_value(bf16_bits(x))


def metal_round(x):
    """round() of Metal/C: halfway cases away from zero. x is an fp32 value held
    in a double, so |x| + 0.5 is exact and floor() is the true answer."""
    if x >= 0:
        return float(math.floor(x + 0.5))
    return -float(math.floor(-x + 0.5))


def quantize_group_py(vals, bits):
    """vals: fp32 values of one group. Returns (codes, scale_f32, bias_f32)."""
    n_bins = float((1 << bits) - 1)
    w_min = min(vals)
    w_max = max(0.0, max(vals))
    scale = f32(f32(w_max - w_min) / n_bins)
    scale = max(scale, EPS)
    side = abs(w_min) > abs(w_max)
    scale = scale if side else -scale
    edge = w_min if side else w_max
    q0 = metal_round(f32(edge / scale))
    at_zero = q0 == 0.0
    if not at_zero:
        scale = f32(edge / q0)
    bias = 0.0 if at_zero else edge
    codes = []
    for w in vals:
        v = metal_round(f32(f32(w - bias) / scale))
        v = min(v, n_bins)
        if v < 0:
            # Only -0.0 can reach here by construction; anything else is a bug.
            assert v == 0.0, (vals, v)
            v = 0.0
        codes.append(int(v))
    return codes, scale, bias


def pack_row_py(codes, bits):
    """codes of one row -> list of uint32 words (LSB-first bit stream)."""
    n_bits = len(codes) * bits
    assert n_bits % 32 == 0
    acc = 0
    for i, c in enumerate(codes):
        assert 0 <= c < (1 << bits)
        acc |= c << (i * bits)
    return [(acc >> (32 * k)) & 0xFFFFFFFF for k in range(n_bits // 32)]


def unpack_row_py(words, bits, n):
    acc = 0
    for k, w in enumerate(words):
        acc |= (w & 0xFFFFFFFF) << (32 * k)
    return [(acc >> (i * bits)) & ((1 << bits) - 1) for i in range(n)]


def quantize_rows_py(rows, bits, group_size, out_dtype="bf16"):
    """rows: list of rows of fp32 values. Returns (words, scales, biases) where
    words is a list of uint32 lists and scales/biases are lists of the stored
    values (as floats: bf16-rounded when out_dtype == "bf16")."""
    conv = bf16 if out_dtype == "bf16" else f32
    words, scales, biases = [], [], []
    for row in rows:
        assert len(row) % group_size == 0
        codes, srow, brow = [], [], []
        for g in range(0, len(row), group_size):
            c, s, b = quantize_group_py(row[g:g + group_size], bits)
            codes += c
            srow.append(conv(s))
            brow.append(conv(b))
        words.append(pack_row_py(codes, bits))
        scales.append(srow)
        biases.append(brow)
    return words, scales, biases


def dequantize_rows_py(words, scales, biases, bits, group_size, n):
    out = []
    for w, s, b in zip(words, scales, biases):
        codes = unpack_row_py(w, bits, n)
        out.append([f32(f32(s[i // group_size] * c) + b[i // group_size]) for i, c in enumerate(codes)])
    return out


# ---------------------------------------------------------------- torch version

def _mround_t(x):
    import torch
    xd = x.double()
    return (torch.sign(xd) * torch.floor(xd.abs() + 0.5)).float()


def quantize_torch(w, bits, group_size, out_dtype=None):
    """w: float tensor [..., n] (any float dtype; values read as fp32).
    Returns (packed uint32 stored in int64 [..., n*bits/32] as torch.int32 view
    ready for safetensors, scales [..., n/gs], biases [..., n/gs]) with scales
    and biases in out_dtype (default: w.dtype)."""
    import torch
    out_dtype = out_dtype or w.dtype
    shape = w.shape
    n = shape[-1]
    assert n % group_size == 0 and (n * bits) % 32 == 0
    x = w.detach().to(torch.float32).reshape(-1, n // group_size, group_size)
    n_bins = float((1 << bits) - 1)
    w_min = x.min(dim=-1).values
    w_max = torch.clamp(x.max(dim=-1).values, min=0.0)
    scale = (w_max - w_min) / torch.tensor(n_bins, dtype=torch.float32)
    scale = torch.maximum(scale, torch.tensor(EPS, dtype=torch.float32))
    side = w_min.abs() > w_max.abs()
    scale = torch.where(side, scale, -scale)
    edge = torch.where(side, w_min, w_max)
    q0 = _mround_t(edge / scale)
    at_zero = q0 == 0
    safe_q0 = torch.where(at_zero, torch.ones_like(q0), q0)
    scale = torch.where(at_zero, scale, edge / safe_q0)
    bias = torch.where(at_zero, torch.zeros_like(edge), edge)
    q = _mround_t((x - bias[..., None]) / scale[..., None])
    q = torch.clamp(q, max=n_bins)
    assert bool((q >= 0).all()) or bool((q[q < 0] == 0).all())
    q = torch.clamp(q, min=0.0).to(torch.int64).reshape(-1, n)
    packed = pack_torch(q, bits)
    packed = packed.reshape(*shape[:-1], packed.shape[-1])
    scales = scale.reshape(*shape[:-1], n // group_size).to(out_dtype)
    biases = bias.reshape(*shape[:-1], n // group_size).to(out_dtype)
    return packed, scales, biases


def pack_torch(q, bits):
    """q: int64 codes [rows, n] -> uint32 words as int64 [rows, n*bits/32]."""
    import torch
    rows, n = q.shape
    n_words = n * bits // 32
    idx = torch.arange(n, dtype=torch.int64)
    start = idx * bits
    word = start // 32
    shift = start % 32
    words = torch.zeros(rows, n_words + 1, dtype=torch.int64)
    lo = (q << shift) & 0xFFFFFFFF
    words.index_add_(1, word, lo)  # disjoint bit fields: add == or
    spill = shift + bits > 32
    if bool(spill.any()):
        hi = q[:, spill] >> (32 - shift[spill])
        words.index_add_(1, word[spill] + 1, hi)
    assert bool((words[:, n_words] == 0).all())
    return words[:, :n_words]


def unpack_torch(words, bits, n):
    import torch
    rows = words.shape[0]
    idx = torch.arange(n, dtype=torch.int64)
    start = idx * bits
    word = start // 32
    shift = start % 32
    w = words.to(torch.int64) & 0xFFFFFFFF
    lo = (w[:, word] >> shift)
    spill = shift + bits > 32
    nxt = torch.where(spill, word + 1, word).clamp(max=words.shape[1] - 1)
    hi = torch.where(spill[None, :].expand(rows, n), (w[:, nxt] << (32 - shift)) & 0xFFFFFFFF, torch.zeros_like(lo))
    return (lo | hi) & ((1 << bits) - 1)


def dequantize_torch(packed, scales, biases, bits, group_size):
    """Returns fp32 weights: scale * q + bias, computed in fp32."""
    import torch
    ng = scales.shape[-1]
    n = ng * group_size
    lead = scales.shape[:-1]
    q = unpack_torch(packed.reshape(-1, packed.shape[-1]), bits, n).to(torch.float32)
    q = q.reshape(-1, ng, group_size)
    s = scales.reshape(-1, ng, 1).to(torch.float32)
    b = biases.reshape(-1, ng, 1).to(torch.float32)
    return (s * q + b).reshape(*lead, n)


def to_u32_tensor(packed_i64):
    """int64 words in [0, 2^32) -> torch.uint32 tensor (safetensors U32)."""
    import torch
    as_i32 = (packed_i64 - ((packed_i64 >= 2**31).to(torch.int64) << 32)).to(torch.int32)
    return as_i32.view(torch.uint32)
