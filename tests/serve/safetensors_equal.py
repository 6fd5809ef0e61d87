"""safetensors_equal.py A B [--atol X] - exit 0 when the two safetensors files
hold the same tensors (names and bytes; the metadata may differ), else print
which differ and exit 1. With --atol X, F32 tensors may differ by up to X per
element (the largest difference is printed); other dtypes must still be equal
(standard library only, for the serve test suites)."""
import array
import json
import struct
import sys


def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    return {k: (v["dtype"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


args = sys.argv[1:]
atol = None
if "--atol" in args:
    i = args.index("--atol")
    atol = float(args[i + 1])
    del args[i:i + 2]
a, b = tensors(args[0]), tensors(args[1])
if sorted(a) != sorted(b):
    sys.exit("different tensor names: %s vs %s" % (sorted(a)[:4], sorted(b)[:4]))
diff, worst = [], 0.0
for k in a:
    (da, ba), (db, bb) = a[k], b[k]
    if ba == bb and da == db:
        continue
    if atol is None or da != "F32" or db != "F32" or len(ba) != len(bb):
        diff.append(k)
        continue
    xa, xb = array.array("f"), array.array("f")
    xa.frombytes(ba)
    xb.frombytes(bb)
    if sys.byteorder != "little":
        xa.byteswap()
        xb.byteswap()
    m = max(abs(p - q) for p, q in zip(xa, xb))
    worst = max(worst, m)
    if not m <= atol:
        diff.append(k)
if diff:
    sys.exit("%d of %d tensors differ%s: %s" % (len(diff), len(a),
             " beyond %g (largest %g)" % (atol, worst) if atol is not None else "",
             diff[:4]))
if atol is not None:
    print("largest difference %g (tolerance %g)" % (worst, atol))
