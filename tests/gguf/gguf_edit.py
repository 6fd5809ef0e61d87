"""gguf_edit.py - read a GGUF v3 file into Python values, change it, write it
back (for tests/gguf_cli.sh: files that are valid GGUF but wrong for orch).

usage: python3 gguf_edit.py IN OUT EDIT...
  set-str KEY VALUE      set (or add) a string key
  del KEY                remove a key
  token I TEXT           replace tokenizer.ggml.tokens[I]
  type NAME T            change tensor NAME to ggml type number T (data zeroed)
  add-tensor NAME FROM [bump]  a copy of tensor FROM named NAME (bump: first
                         byte changed)
Independent of orch's code (written from the GGUF specification).
"""
import struct
import sys

SIZES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 8: (32, 34), 30: (1, 2)}


def rd(b, o, fmt):
    v = struct.unpack_from("<" + fmt, b, o)
    return v[0], o + struct.calcsize(fmt)


def rd_str(b, o):
    n, o = rd(b, o, "Q")
    return b[o:o + n], o + n


def rd_val(b, o, t):
    if t == 8:
        return rd_str(b, o)
    if t == 9:
        at, o = rd(b, o, "I")
        n, o = rd(b, o, "Q")
        vals = []
        for _ in range(n):
            v, o = rd_val(b, o, at)
            vals.append(v)
        return (at, vals), o
    return rd(b, o, SIZES[t])


def wr_val(t, v):
    if t == 8:
        return struct.pack("<Q", len(v)) + v
    if t == 9:
        at, vals = v
        return struct.pack("<IQ", at, len(vals)) + b"".join(wr_val(at, x) for x in vals)
    return struct.pack("<" + SIZES[t], v)


def load(path):
    b = open(path, "rb").read()
    assert b[:4] == b"GGUF"
    o = 4
    _, o = rd(b, o, "I")
    nt, o = rd(b, o, "Q")
    nkv, o = rd(b, o, "Q")
    kvs = []
    for _ in range(nkv):
        k, o = rd_str(b, o)
        t, o = rd(b, o, "I")
        v, o = rd_val(b, o, t)
        kvs.append([k.decode(), t, v])
    infos = []
    for _ in range(nt):
        name, o = rd_str(b, o)
        nd, o = rd(b, o, "I")
        ne = list(struct.unpack_from("<%dQ" % nd, b, o))
        o += 8 * nd
        t, o = rd(b, o, "I")
        off, o = rd(b, o, "Q")
        infos.append([name.decode(), ne, t, off])
    data0 = (o + 31) // 32 * 32
    tensors = []
    for name, ne, t, off in infos:
        n = 1
        for x in ne:
            n *= x
        blk, by = BLOCKS[t]
        tensors.append([name, ne, t, bytearray(b[data0 + off:data0 + off + n // blk * by])])
    return kvs, tensors


def save(path, kvs, tensors):
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for k, t, v in kvs:
        out += wr_val(8, k.encode()) + struct.pack("<I", t) + wr_val(t, v)
    off = 0
    for name, ne, t, data in tensors:
        out += wr_val(8, name.encode()) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne)
        out += struct.pack("<IQ", t, off)
        off = (off + len(data) + 31) // 32 * 32
    out += b"\0" * ((32 - len(out) % 32) % 32)
    for _, _, _, data in tensors:
        out += data + b"\0" * ((32 - len(data) % 32) % 32)
    open(path, "wb").write(out)


def main():
    src, dst, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    kvs, tensors = load(src)
    while args:
        op = args.pop(0)
        if op == "set-str":
            k, v = args.pop(0), args.pop(0).encode()
            kvs = [x for x in kvs if x[0] != k] + [[k, 8, v]]
        elif op == "del":
            k = args.pop(0)
            kvs = [x for x in kvs if x[0] != k]
        elif op == "token":
            i, text = int(args.pop(0)), args.pop(0).encode()
            for x in kvs:
                if x[0] == "tokenizer.ggml.tokens":
                    x[2][1][i] = text
        elif op == "type":
            name, t = args.pop(0), int(args.pop(0))
            for x in tensors:
                if x[0] == name:
                    n = 1
                    for d in x[1]:
                        n *= d
                    blk, by = BLOCKS[t]
                    x[2], x[3] = t, bytearray(n // blk * by)
        elif op == "add-tensor":
            name, frm = args.pop(0), args.pop(0)
            bump = bool(args) and args[0] == "bump" and args.pop(0)
            x = [list(t) for t in tensors if t[0] == frm][0]
            x[0], x[3] = name, bytearray(x[3])
            if bump:
                x[3][0] ^= 0x55
            tensors.append(x)
        else:
            sys.exit("unknown edit " + op)
    save(dst, kvs, tensors)


if __name__ == "__main__":
    main()
