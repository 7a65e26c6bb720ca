"""Writer for petrel's golden files (format: tests/fixtures/README.md).

A golden file is a small header, an index of named arrays, then the arrays'
bytes, all little-endian:

  offset 0   8 bytes  magic "PTGOLD1\\0"
  offset 8   u32      number of arrays N
  offset 12  u32      0 (reserved)
  then N index records, each:
             u16      name length L (1..255), then L bytes of ASCII name
             u8       dtype: 0 f32, 1 i32, 2 bf16, 3 u32, 4 u8
             u8       ndim (1..4)
             u32[ndim] dims
             u64      byte offset of the data from the start of the file
             u64      byte size of the data (= element size x product(dims))
  data of every array, each starting at a multiple of 16 bytes.

Pure Python (struct only) so it runs anywhere; arrays are given as bytes plus
dtype and shape, or as Python lists.
"""

import struct

MAGIC = b"PTGOLD1\0"
DTYPES = {"f32": (0, 4, "f"), "i32": (1, 4, "i"), "bf16": (2, 2, "H"), "u32": (3, 4, "I"), "u8": (4, 1, "B")}


class GoldenWriter:
    def __init__(self):
        self.items = []  # (name, dtype, shape, bytes)
        self.names = set()

    def add_bytes(self, name, dtype, shape, data):
        code, esize, _ = DTYPES[dtype]
        shape = [int(d) for d in shape]
        n = 1
        for d in shape:
            assert d >= 0
            n *= d
        assert 1 <= len(shape) <= 4, (name, shape)
        assert len(data) == n * esize, (name, len(data), n, esize)
        assert name not in self.names, name
        assert 0 < len(name) < 256 and name.isascii(), name
        self.names.add(name)
        self.items.append((name, dtype, shape, bytes(data)))

    def add_list(self, name, dtype, shape, values):
        _, _, fmt = DTYPES[dtype]
        self.add_bytes(name, dtype, shape, struct.pack("<%d%s" % (len(values), fmt), *values))

    def add_tensor(self, name, t, dtype=None):
        """t: a torch tensor (f32, i32/i64, bf16) — converted, made contiguous."""
        import torch
        if dtype is None:
            dtype = {torch.float32: "f32", torch.bfloat16: "bf16", torch.int32: "i32", torch.int64: "i32"}[t.dtype]
        t = t.detach().cpu().contiguous()
        if dtype == "f32":
            data = t.to(torch.float32).numpy().tobytes()
        elif dtype == "bf16":
            data = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        elif dtype == "i32":
            data = t.to(torch.int32).numpy().tobytes()
        else:
            raise ValueError(dtype)
        shape = list(t.shape) or [1]
        self.add_bytes(name, dtype, shape, data)

    def tobytes(self):
        header = bytearray(MAGIC + struct.pack("<II", len(self.items), 0))
        index_size = 0
        for name, _, shape, _ in self.items:
            index_size += 2 + len(name) + 2 + 4 * len(shape) + 16
        pos = len(header) + index_size
        offsets = []
        for _, _, _, data in self.items:
            pos = (pos + 15) & ~15
            offsets.append(pos)
            pos += len(data)
        for (name, dtype, shape, data), off in zip(self.items, offsets):
            header += struct.pack("<H", len(name)) + name.encode()
            header += struct.pack("<BB", DTYPES[dtype][0], len(shape))
            header += struct.pack("<%dI" % len(shape), *shape)
            header += struct.pack("<QQ", off, len(data))
        out = bytearray(header)
        for (_, _, _, data), off in zip(self.items, offsets):
            out += b"\0" * (off - len(out))
            out += data
        return bytes(out)

    def write(self, path):
        with open(path, "wb") as f:
            f.write(self.tobytes())


def read(path):
    """Reads a golden file back: {name: (dtype, shape, bytes)} (for self-checks)."""
    with open(path, "rb") as f:
        buf = f.read()
    assert buf[:8] == MAGIC
    n, _ = struct.unpack_from("<II", buf, 8)
    pos = 16
    out = {}
    codes = {v[0]: k for k, v in DTYPES.items()}
    for _ in range(n):
        (ln,) = struct.unpack_from("<H", buf, pos)
        pos += 2
        name = buf[pos:pos + ln].decode()
        pos += ln
        code, nd = struct.unpack_from("<BB", buf, pos)
        pos += 2
        shape = list(struct.unpack_from("<%dI" % nd, buf, pos))
        pos += 4 * nd
        off, size = struct.unpack_from("<QQ", buf, pos)
        pos += 16
        out[name] = (codes[code], shape, buf[off:off + size])
    return out
