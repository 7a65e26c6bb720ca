"""Minimal safetensors reader/writer for the fixture scripts (format: an 8-byte
little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}, "__metadata__": {...}}, then the data).  Written here so that
uint32 (MLX packed codes) and bf16 tensors are stored exactly regardless of the
installed safetensors/torch versions."""

import json
import struct

ESIZE = {"F32": 4, "BF16": 2, "F16": 2, "U32": 4, "I32": 4, "I64": 8, "U8": 1}


def tensor_bytes(t):
    """torch tensor -> (dtype string, shape, bytes)."""
    import torch
    t = t.detach().cpu().contiguous()
    shape = list(t.shape)
    if t.dtype == torch.float32:
        return "F32", shape, t.numpy().tobytes()
    if t.dtype == torch.bfloat16:
        return "BF16", shape, t.view(torch.int16).numpy().tobytes()
    if t.dtype == torch.float16:
        return "F16", shape, t.numpy().tobytes()
    if t.dtype == torch.int32:
        return "I32", shape, t.numpy().tobytes()
    raise ValueError("unsupported dtype %s" % t.dtype)


def u32_bytes(words_i64):
    """int64 tensor of values in [0, 2^32) -> ("U32", shape, bytes)."""
    import numpy as np
    a = words_i64.detach().cpu().contiguous().numpy()
    assert a.min() >= 0 and a.max() < 2**32
    return "U32", list(a.shape), a.astype(np.uint32).tobytes()


def write(path, entries, metadata=None):
    """entries: {name: (dtype, shape, bytes)}; names are written sorted."""
    header = {}
    pos = 0
    names = sorted(entries)
    for n in names:
        dt, shape, data = entries[n]
        count = 1
        for d in shape:
            count *= d
        assert len(data) == count * ESIZE[dt], (n, dt, shape, len(data))
        header[n] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    if metadata:
        header["__metadata__"] = metadata
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for n in names:
            f.write(entries[n][2])


def read_torch(path):
    """-> {name: torch tensor} (U32 returned as int64)."""
    import numpy as np
    import torch
    with open(path, "rb") as f:
        buf = f.read()
    (hl,) = struct.unpack_from("<Q", buf, 0)
    header = json.loads(buf[8:8 + hl])
    base = 8 + hl
    out = {}
    for n, info in header.items():
        if n == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = buf[base + a:base + b]
        shape = info["shape"]
        dt = info["dtype"]
        if dt == "F32":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy())
        elif dt == "BF16":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.int16).copy()).view(torch.bfloat16)
        elif dt == "F16":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.float16).copy())
        elif dt == "U32":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.uint32).astype(np.int64))
        elif dt == "I32":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.int32).copy())
        elif dt == "I64":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.int64).copy())
        else:
            raise ValueError("%s: dtype %s" % (n, dt))
        out[n] = t.reshape(shape)
    return out
