#!/usr/bin/env python3
"""scaling_model.py - the worked estimates of docs/scaling.md (data parallel on GPUs).

usage: scaling_model.py [--mfu 0.4] [--peak 989e12] [--grad-bytes 4]

Everything here is ASSUMED (no measurement): the model shapes, the GPU's
dense BF16 peak and an MFU, NCCL-class bus bandwidths, the ring all-reduce
cost 2(n-1)/n * bytes / bandwidth plus a latency term per bucket: 2 log2(n)
hops (NCCL's tree, what it picks when latency dominates) or 2(n-1) hops (a
flat ring, shown in parentheses), at a per-hop latency. docs/scaling.md states
the sources; tools/scaling_measure.sh is what measures this machine.
Prints the tables docs/scaling.md quotes, as Markdown.
"""
import argparse
import math


def gpt2_params(layers, width, vocab, context, mlp=None):
    """Parameter count of orch's gpt2 arch (tied head): per layer 12 d^2 + 13 d
    (qkv, proj, fc, proj with biases, two layer norms), wte, wpe, final norm."""
    mlp = mlp or 4 * width
    d = width
    per_layer = (3 * d * d + 3 * d) + (d * d + d) + (d * mlp + mlp) + (mlp * d + d) + 4 * d
    return layers * per_layer + vocab * d + context * d + 2 * d


MODELS = {
    # name: (layers, width, heads, vocab, context)
    "GPT-2 124M": (12, 768, 12, 50257, 1024),
    "1B (gpt2 arch, 18 x 2048)": (18, 2048, 16, 50257, 1024),
}
# tokens per optimizer step (GPT-3, Brown et al. 2020, Table 2.1: 0.5M for
# 125M, 1M for 1.3B)
GLOBAL_TOKENS = {"GPT-2 124M": 2**19, "1B (gpt2 arch, 18 x 2048)": 2**20}
SEQ = 1024


def link(n):
    """(bus bandwidth B/s, per-hop latency s) for n GPUs: NVLink inside one
    8-GPU node, InfiniBand NDR 400 Gb/s per GPU across nodes (the slowest hop
    of a hierarchical ring)."""
    if n <= 8:
        return 360e9, 3e-6  # ~80% of 450 GB/s per direction NVLink 4
    return 40e9, 6e-6  # ~80% of 50 GB/s NDR per GPU


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mfu", type=float, default=0.40)
    ap.add_argument("--peak", type=float, default=989e12, help="dense BF16 FLOP/s per GPU (H100/H200 SXM)")
    ap.add_argument("--grad-bytes", type=int, default=4, help="bytes per gradient element (orch: fp32)")
    ap.add_argument("--bucket-mib", type=float, default=25.0, help="PyTorch DDP's bucket_cap_mb")
    ap.add_argument("--tokens-per-gpu", type=int, default=16 * SEQ)
    a = ap.parse_args()
    eff_flops = a.mfu * a.peak
    print("assumed: %.0f TFLOP/s peak x MFU %.2f = %.0f TFLOP/s per GPU; %d-byte gradients; "
          "%g MiB buckets\n" % (a.peak / 1e12, a.mfu, eff_flops / 1e12, a.grad_bytes, a.bucket_mib))
    for name, (L, d, h, V, ctx) in MODELS.items():
        n_par = gpt2_params(L, d, V, ctx)
        n_nonemb = n_par - ctx * d
        flop_tok = 6 * n_nonemb + 12 * L * SEQ * d
        S = n_par * a.grad_bytes
        mem = 16 * n_par
        act_seq = SEQ * d * L * (34 + 5 * h * SEQ / d)  # bytes, 16-bit activations
        logits_seq = SEQ * V * 4 * 2
        print("### %s: %d parameters, %.3f GFLOP per token, gradients %.1f MB\n" %
              (name, n_par, flop_tok / 1e9, S / 1e6))
        print("weights + grads + Adam m, v (fp32, 16 B/param): %.1f GB; activations per "
              "1024-token sequence: %.2f GB (+ %.2f GB logits and their gradient)\n" %
              (mem / 1e9, act_seq / 1e9, logits_seq / 1e9))
        for mode in ("weak", "strong"):
            if mode == "weak":
                print("Weak scaling: %d tokens per GPU per step\n" % a.tokens_per_gpu)
            else:
                print("Fixed global batch: %d tokens per step (the GPT-3 batch of this size)\n"
                      % GLOBAL_TOKENS[name])
            print("| GPUs | tokens/GPU | compute ms | all-reduce: bandwidth ms | latency ms, tree "
                  "(ring) | efficiency, no overlap | efficiency, overlapped |")
            print("|---|---|---|---|---|---|---|")
            for n in (8, 64, 512):
                tok = a.tokens_per_gpu if mode == "weak" else GLOBAL_TOKENS[name] // n
                t_c = tok * flop_tok / eff_flops
                bw, lat = link(n)
                t_bw = 2 * (n - 1) / n * S / bw
                buckets = -(-S // int(a.bucket_mib * 2**20))
                t_ring = buckets * 2 * (n - 1) * lat
                t_tree = buckets * 2 * math.ceil(math.log2(n)) * lat
                t_ar = t_bw + t_tree
                e_no = t_c / (t_c + t_ar)
                # overlapped: buckets hide behind the backward pass (2/3 of
                # the compute); the last bucket is always exposed
                last = t_ar / buckets
                hidden = min(t_ar - last, t_c * 2 / 3)
                e_ov = t_c / (t_c + t_ar - hidden)
                print("| %d | %d | %.1f | %.1f | %.1f (%.0f) | %.0f%% | %.0f%% |" %
                      (n, tok, t_c * 1e3, t_bw * 1e3, t_tree * 1e3, t_ring * 1e3, 100 * e_no,
                       100 * e_ov))
            print()

    tp_table(a, eff_flops)


def tp_table(a, eff_flops):
    """1B at 512 GPUs, 1M-token batch: tensor parallel (Megatron-style, t GPUs
    of one NVLink node per layer) x data parallel (512/t groups)."""
    name = "1B (gpt2 arch, 18 x 2048)"
    L, d, h, V, ctx = MODELS[name]
    n_par = gpt2_params(L, d, V, ctx)
    flop_tok = 6 * (n_par - ctx * d) + 12 * L * SEQ * d
    S = n_par * a.grad_bytes
    n = 512
    print("### %s at %d GPUs, %d tokens per step: tensor x data parallel\n" % (name, n, GLOBAL_TOKENS[name]))
    print("| TP t | DP groups | sequences per group | compute ms | TP all-reduces ms (NVLink) | "
          "DP all-reduce ms (IB, S/t per GPU) | efficiency (DP overlapped) |")
    print("|---|---|---|---|---|---|---|")
    for t in (1, 2, 4, 8):
        dp = n // t
        seqs = GLOBAL_TOKENS[name] // SEQ // dp
        t_c = seqs * SEQ * flop_tok / t / eff_flops
        # 2 all-reduces forward + 2 backward per layer of [seqs, SEQ, d] bf16
        # activations (Shoeybi et al. 2019), not overlapped
        t_tp = 0.0 if t == 1 else 4 * L * seqs * SEQ * d * 2 * 2 * (t - 1) / t / 360e9
        bw, lat = link(n)
        buckets = -(-(S // t) // int(a.bucket_mib * 2**20))
        t_dp = 2 * (dp - 1) / dp * (S / t) / bw + buckets * 2 * math.ceil(math.log2(dp)) * lat
        exposed = max(t_dp / buckets, t_dp - t_c * 2 / 3)
        e = t_c / (t_c + t_tp + exposed)
        print("| %d | %d | %d | %.1f | %.1f | %.1f | %.0f%% |" %
              (t, dp, seqs, t_c * 1e3, t_tp * 1e3, t_dp * 1e3, 100 * e))
    print()


if __name__ == "__main__":
    main()
