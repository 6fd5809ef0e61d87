"""safetensors_equal.py A B - exit 0 when the two safetensors files hold the
same tensors (names and bytes; the metadata may differ), else print which
differ and exit 1 (standard library only, for the serve test suites)."""
import json
import struct
import sys


def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    return {k: b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
if sorted(a) != sorted(b):
    sys.exit("different tensor names: %s vs %s" % (sorted(a)[:4], sorted(b)[:4]))
diff = [k for k in a if a[k] != b[k]]
if diff:
    sys.exit("%d of %d tensors differ: %s" % (len(diff), len(a), diff[:4]))
