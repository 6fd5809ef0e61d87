#!/usr/bin/env python3
"""compare.py - used by tests/dist_*.sh: compare two training runs of orch.

  compare.py metrics A/metrics.jsonl B/metrics.jsonl TOL
      same steps; loss, val_loss and lr equal within TOL, grad_norm within
      10 x TOL (relative to max(1, |value|)): the norm is a sum of squares
      over every gradient element, the most rounding-sensitive figure.
  compare.py weights A/ckpt-N B/ckpt-N TOL
      model.safetensors (and optimizer.safetensors) of both checkpoints hold
      the same tensors with values equal within TOL (absolute).
Prints one line per finding; exit 0 when equal, 1 otherwise.
"""
import array
import json
import struct
import sys

# safetensors dtype -> array typecode (little-endian hosts; orch writes F32)
DTYPES = {"F32": "f", "I32": "i"}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        a, b = d["data_offsets"]
        values = array.array(DTYPES[d["dtype"]])
        values.frombytes(data[a:b])
        out[name] = (tuple(d["shape"]), values)
    return out


def close(x, y, tol):
    return abs(x - y) <= tol * max(1.0, abs(x), abs(y))


def metrics(a, b, tol):
    la = [json.loads(l) for l in open(a)]
    lb = [json.loads(l) for l in open(b)]
    bad = 0
    if [r["step"] for r in la] != [r["step"] for r in lb]:
        print(f"steps differ: {len(la)} vs {len(lb)} lines")
        return 1
    worst = {}
    for ra, rb in zip(la, lb):
        for key in ("loss", "grad_norm", "val_loss", "lr"):
            if (key in ra) != (key in rb):
                print(f"step {ra['step']}: {key} only in one run")
                bad += 1
                continue
            if key not in ra:
                continue
            worst[key] = max(worst.get(key, 0.0), abs(ra[key] - rb[key]))
            if not close(ra[key], rb[key], tol * (10 if key == "grad_norm" else 1)):
                print(f"step {ra['step']}: {key} {ra[key]!r} vs {rb[key]!r}")
                bad += 1
    diffs = ", ".join(f"{k} {v:.3g}" for k, v in sorted(worst.items()))
    print(f"metrics: {len(la)} steps, largest differences: {diffs} (tolerance {tol:g})")
    return 1 if bad else 0


def weights(a, b, tol):
    bad = 0
    for fname in ("model.safetensors", "optimizer.safetensors"):
        ta = read_safetensors(f"{a}/{fname}")
        tb = read_safetensors(f"{b}/{fname}")
        if sorted(ta) != sorted(tb):
            print(f"{fname}: different tensor names")
            return 1
        worst = 0.0
        for name in ta:
            (sa, va), (sb, vb) = ta[name], tb[name]
            if sa != sb:
                print(f"{fname}: {name}: shapes differ")
                bad += 1
                continue
            d = max((abs(x - y) for x, y in zip(va, vb)), default=0.0)
            worst = max(worst, d)
            if d > tol:
                print(f"{fname}: {name}: max difference {d:.3g} > {tol:g}")
                bad += 1
        print(f"{fname}: {len(ta)} tensors, largest difference {worst:.3g} (tolerance {tol:g})")
    return 1 if bad else 0


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in ("metrics", "weights"):
        print(__doc__)
        return 2
    fn = metrics if sys.argv[1] == "metrics" else weights
    return fn(sys.argv[2], sys.argv[3], float(sys.argv[4]))


if __name__ == "__main__":
    sys.exit(main())
