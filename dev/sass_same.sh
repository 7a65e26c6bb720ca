#!/usr/bin/env bash
# dev/sass_same.sh — proves that moving CUDA code between files changed no
# kernel: compares the device code of every function, matched by mangled
# name, between one set of objects and another.
#
#   dev/sass_same.sh OLD_OBJ... -- NEW_OBJ...
#
# Each argument is an object built by nvcc -c (the .cubin inside its
# .nv_fatbin section is read) or a .cubin. Prints one line per function:
# "same NAME (regs R, shared S, stack F, N instructions)" or "DIFF NAME:" and
# the first differing item; exits 1 on any difference, on a function present
# on one side only, or on a kernel defined in two NEW objects.
#
# What is compared, per function (every .text.NAME section of the cubins: the
# kernels and any device function the compiler kept out of line):
#   - the machine code, byte for byte, one line per 16-byte instruction
#     (sm_90: the SASS that `cuobjdump -sass` disassembles is these bytes,
#     and identical bytes are identical SASS with nothing normalized away);
#   - the text section's flags, alignment and info (its symbol by name), the
#     symbols inside it (offset, size, kind; nvcc's $__internal_N_$ counters
#     are numbered per file, so N is dropped) and its relocations (offset,
#     type, target by name, addend);
#   - the resource usage (what `cuobjdump -res-usage` reports): the register
#     count, frame and stack sizes (the .nv.info attributes that name the
#     function), the static shared memory (.nv.shared.NAME), the parameter
#     bank (.nv.constant0.NAME) and every other NAME-suffixed section
#     (.nv.info.NAME attribute by attribute, a symbol index replaced by the
#     symbol's name; other constant banks byte for byte); the call graph's
#     edges from the function.
# One thing is printed as a note and not counted as a difference: the
# alignment of a kernel's static shared memory section. nvcc gives every
# kernel of a file the largest alignment in use there (16 bytes as soon as one
# kernel has dynamic shared memory, else the kernel's own), so moving a
# kernel to another file can change it alone; its size (compared, and the
# allocation the launch gets) and the shared-memory offsets in the code
# (compared as bytes) are what the kernel runs with. Forcing the old
# alignment with __align__ changes the PTX and can change the code, so the
# note is the honest answer.
# Needs python3 (standard library only); cuobjdump is not needed.
#
# Not for: comparing different compiler versions or flags (everything would
# differ), host code (an extern "C" host function moved between files is no
# device change). A fatbin entry nvcc compressed (it does for large objects,
# e.g. gemv_tc.o) is decompressed with the `zstd` command; without it the
# script says so and fails.
set -euo pipefail
exec python3 - "$@" <<'PY'
import re
import struct
import subprocess
import sys

SHT_NOBITS = 8
SHT_REL, SHT_RELA = 9, 4


def fail(msg):
    sys.stderr.write("sass_same: " + msg + "\n")
    sys.exit(2)


def sections(elf, what):
    """[(name, type, flags, offset, size, link, info, align, entsize)]"""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        fail(what + ": not a 64-bit little-endian ELF")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    stroff = raw[shstrndx][4]

    def cstr(off):
        return elf[off:elf.index(b"\0", off)].decode()

    return [(cstr(stroff + s[0]), s[1], s[2], s[4], s[5], s[6], s[7], s[8], s[9]) for s in raw]


def cubins_of(path):
    """the sm_XX cubins of an object (inside .nv_fatbin) or a .cubin file"""
    data = open(path, "rb").read()
    secs = sections(data, path)
    if any(s[0].startswith(".nv.info") for s in secs):
        return [data]  # a cubin itself
    fb = [s for s in secs if s[0] == ".nv_fatbin"]
    if not fb:
        fail(path + ": no .nv_fatbin section (not an nvcc object?)")
    blob = data[fb[0][3]:fb[0][3] + fb[0][4]]
    out, pos = [], 0
    while True:
        pos = blob.find(b"\x50\xed\x55\xba", pos)
        if pos < 0:
            break
        _, hsize, fsize = struct.unpack_from("<HHQ", blob, pos + 4)
        e, end = pos + hsize, pos + hsize + fsize
        while e < end:
            kind, _, ehsize, psize = struct.unpack_from("<HHIQ", blob, e)
            payload = blob[e + ehsize:e + ehsize + psize]
            if kind == 2:  # a cubin (kind 1 is PTX)
                if payload[:4] != b"\x7fELF":  # a zstd-compressed entry (large objects): sizes in its header
                    csize, = struct.unpack_from("<Q", blob, e + 0x10)
                    usize, = struct.unpack_from("<Q", blob, e + 0x38)
                    try:
                        payload = subprocess.run(["zstd", "-d", "-c"], input=payload[:csize], capture_output=True,
                                                 check=True).stdout
                    except (OSError, subprocess.CalledProcessError) as err:
                        fail(path + ": compressed fatbin entry and zstd -d failed (" + str(err) + ")")
                    if payload[:4] != b"\x7fELF" or len(payload) != usize:
                        fail(path + ": compressed fatbin entry did not decompress to its cubin")
                out.append(payload)
            e += ehsize + psize
        pos = end
    if not out:
        fail(path + ": no cubin in its fatbin")
    return out


INTERNAL = re.compile(r"\$__internal_\d+_\$")
NVINFO_SYM_FIRST = {0x11, 0x12, 0x1E, 0x23, 0x2F}  # FRAME, MIN_STACK, CRS_STACK, MAX_STACK, REGCOUNT
ATTR_NAME = {0x11: "frame", 0x12: "min_stack", 0x1E: "crs_stack", 0x23: "max_stack", 0x2F: "regs"}


def nvinfo_entries(b):
    """[(fmt, attr, payload bytes or u16 value)]"""
    out, i = [], 0
    while i + 4 <= len(b):
        fmt, attr, v = struct.unpack_from("<BBH", b, i)
        i += 4
        if fmt == 4:
            out.append((fmt, attr, b[i:i + v]))
            i += v
        else:
            out.append((fmt, attr, v))
    return out


def functions(cubin, what):
    secs = sections(cubin, what)
    symtab = [s for s in secs if s[1] == 2]
    if not symtab:
        fail(what + ": no symbol table")
    st = symtab[0]
    strsec = secs[st[5]]
    syms = []
    for k in range(st[4] // 24):
        name, info, other, shndx, value, size = struct.unpack_from("<IBBHQQ", cubin, st[3] + k * 24)
        off = strsec[3] + name
        nm = cubin[off:cubin.index(b"\0", off)].decode()
        if (info & 0xF) == 3 and not nm:  # a section symbol: its section's name
            nm = secs[shndx][0]
        syms.append((INTERNAL.sub("$__internal_$", nm), info, other, shndx, value, size))

    def symname(k):
        return syms[k][0] if 0 <= k < len(syms) else "#%d" % k

    def body(s):
        return b"" if s[1] == SHT_NOBITS else cubin[s[3]:s[3] + s[4]]

    funcs = {}
    for idx, s in enumerate(secs):
        if not s[0].startswith(".text."):
            continue
        name = s[0][len(".text."):]
        code = body(s)
        f = {}
        f["code"] = [code[i:i + 16].hex() for i in range(0, len(code), 16)]
        f["text section"] = ["flags %#x align %d entsize %d size %d info %s" %
                             (s[2], s[7], s[8], s[4], symname(s[6] & 0xFFFFFF)) + " regs-field %d" % (s[6] >> 24)]
        f["symbols"] = sorted("%s value %d size %d info %#x other %#x" % (y[0], y[4], y[5], y[1], y[2])
                              for y in syms if y[3] == idx)
        f["relocations"] = []
        f["entry"] = any(y[0] == name and (y[2] & 0x10) for y in syms)
        f["resources"] = []
        f["other sections"] = []
        f["notes"] = []
        for r in secs:
            if r[1] in (SHT_REL, SHT_RELA) and r[6] == idx:
                es = 24 if r[1] == SHT_RELA else 16
                for k in range(r[4] // es):
                    off, rinfo = struct.unpack_from("<QQ", cubin, r[3] + k * es)
                    add = struct.unpack_from("<q", cubin, r[3] + k * es + 16)[0] if es == 24 else 0
                    f["relocations"].append("at %d type %d -> %s %+d" % (off, rinfo & 0xFFFFFFFF,
                                                                         symname(rinfo >> 32), add))
            elif r[0].endswith("." + name) and r is not s and not r[0].startswith((".rel.", ".rela.")):
                kind = r[0][:-len(name) - 1]
                head = "%s: type %#x flags %#x size %d align %d" % (kind, r[1], r[2], r[4], r[7])
                if kind == ".nv.shared":  # its alignment is the file's (see the header): a note
                    f["notes"].append("static shared memory aligned to %d" % r[7])
                    head = "%s: type %#x flags %#x size %d" % (kind, r[1], r[2], r[4])
                if kind == ".nv.shared":
                    f["resources"].append("shared %d" % r[4])
                if kind == ".nv.constant0":
                    f["resources"].append("param bank %d" % r[4])
                lines = [head]
                if kind == ".nv.info":
                    for fmt, attr, v in nvinfo_entries(body(r)):
                        if fmt == 4 and attr == 0x0A and len(v) >= 4:  # PARAM_CBANK: its bank's symbol
                            v = symname(struct.unpack_from("<I", v, 0)[0]) + " " + v[4:].hex()
                        elif fmt == 4:
                            v = v.hex()
                        lines.append("attr %#04x fmt %d %s" % (attr, fmt, v))
                else:
                    b = body(r)
                    lines += [b[i:i + 16].hex() for i in range(0, len(b), 16)]
                f["other sections"] += lines
        funcs[name] = f
    # the module-wide .nv.info attributes that name a function, and the call graph
    for s in secs:
        if s[0] == ".nv.info":
            for fmt, attr, v in nvinfo_entries(body(s)):
                if fmt == 4 and attr in NVINFO_SYM_FIRST and len(v) == 8:
                    k, val = struct.unpack("<II", v)
                    nm = symname(k)
                    if nm in funcs:
                        funcs[nm]["resources"].append("%s %d" % (ATTR_NAME[attr], val))
        if s[0] == ".nv.callgraph":
            b = body(s)
            for k in range(len(b) // 8):
                a, c = struct.unpack_from("<II", b, k * 8)
                if symname(a) in funcs:
                    funcs[symname(a)]["resources"].append("calls %s" % symname(c))
    for f in funcs.values():
        f["resources"].sort()
    return funcs


def collect(paths):
    out, where = {}, {}
    for p in paths:
        for cb in cubins_of(p):
            for name, f in functions(cb, p).items():
                where.setdefault(name, []).append(p)
                out.setdefault(name, []).append(f)
    return out, where


args = sys.argv[1:]
if "--" not in args or args.index("--") == 0 or args.index("--") == len(args) - 1:
    fail("usage: dev/sass_same.sh OLD_OBJ... -- NEW_OBJ...")
cut = args.index("--")
old, _ = collect(args[:cut])
new, new_where = collect(args[cut + 1:])
bad = 0
ITEMS = ["code", "text section", "symbols", "relocations", "resources", "other sections"]


def summary(f):
    r = dict(x.split(" ", 1) for x in f["resources"] if x.split(" ", 1)[0] in ("regs", "shared", "frame"))
    return "regs %s, shared %s, stack %s, %d instructions" % (r.get("regs", "?"), r.get("shared", "0"),
                                                             r.get("frame", "0"), len(f["code"]))


for name in sorted(set(old) | set(new)):
    if name not in new:
        print("DIFF %s: only in OLD" % name)
        bad += 1
        continue
    if name not in old:
        print("DIFF %s: only in NEW (%s)" % (name, ", ".join(new_where[name])))
        bad += 1
        continue
    o = old[name][0]
    if len(old[name]) > 1 and any(x != o for x in old[name][1:]):
        print("note %s: OLD objects hold different versions; comparing with the first" % name)
    if o["entry"] and len(new[name]) > 1:
        print("DIFF %s: kernel defined in %d NEW objects (%s)" % (name, len(new[name]), ", ".join(new_where[name])))
        bad += 1
        continue
    diff = None
    for n in new[name]:
        for item in ITEMS:
            a, b = o[item], n[item]
            if a == b:
                continue
            for i in range(max(len(a), len(b))):
                la = a[i] if i < len(a) else "(end)"
                lb = b[i] if i < len(b) else "(end)"
                if la != lb:
                    diff = "%s line %d: OLD %s | NEW %s" % (item, i, la, lb)
                    break
            break
        if diff:
            break
    if diff:
        print("DIFF %s: %s" % (name, diff))
        bad += 1
    else:
        copies = " (%d NEW copies)" % len(new[name]) if len(new[name]) > 1 else ""
        notes = [" note: OLD %s, NEW %s" % (a, b) for n in new[name] for a, b in zip(o["notes"], n["notes"]) if a != b]
        print("same %s (%s)%s%s" % (name, summary(o), copies, "".join(sorted(set(notes)))))
print("%d functions, %d different" % (len(set(old) | set(new)), bad))
sys.exit(1 if bad else 0)
PY
