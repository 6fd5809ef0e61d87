#!/usr/bin/python3
"""torch_bench.py - PyTorch's GPT-2 training step on the CPU, for comparison
with `orch bench train` (tools/bench_vs_torch.sh runs both).

The model is the orch GPT-2 (tied LM head, pre-LayerNorm, GELU tanh, causal
attention) built from the "model" section of an orch config, trained in
float32 with the same step as the orch benchmark: zero_grad, forward,
cross-entropy, backward, clip_grad_norm_(1.0), AdamW (weight decay on 2-D
tensors only). PyTorch is given its best settings for this machine: the
thread count passed in (torch.set_num_threads), and bench_vs_torch.sh sets
OMP_WAIT_POLICY=PASSIVE and glibc malloc tunables that keep freed memory
mapped. Each step is timed; the median is reported.

With --precision bf16 the forward and loss run under
torch.autocast("cpu", dtype=torch.bfloat16) (PyTorch's mixed precision on
the CPU: bf16 matmuls through oneDNN, AMX where present; fp32 master weights
and optimizer), the counterpart of orch's precision=bf16.

Model FLOPs per token = 6*N + 12*layers*seq*width (N = parameters except
wpe), as in `orch bench train --help`. The GEMM peak is torch.mm's best
GFLOP/s over the same training shapes in the precision used (fp32, or bf16
tensors for --precision bf16), measured in this process.

Usage: /usr/bin/python3 tools/torch_bench.py --config FILE [--batch B]
       [--seq T] [--steps N] [--warmup N] [--threads N]
       [--precision fp32|bf16] [--json]
"""
import argparse
import json
import math
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH, M, eps):
        super().__init__()
        self.nh = NH
        self.ln_1 = nn.LayerNorm(C, eps=eps)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=eps)
        self.c_fc = nn.Linear(C, M)
        self.mlp_proj = nn.Linear(M, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        hs = C // self.nh
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.nh, hs).transpose(1, 2)
        k = k.view(B, T, self.nh, hs).transpose(1, 2)
        v = v.view(B, T, self.nh, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, m):
        super().__init__()
        C, V, T = m["width"], m["vocab_size"], m["context"]
        M = m.get("mlp_width", 4 * C)
        eps = m.get("layernorm_eps", 1e-5)
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block(C, m["heads"], M, eps) for _ in range(m["layers"]))
        self.ln_f = nn.LayerNorm(C, eps=eps)
        self.register_buffer("mask", ~torch.ones(T, T, dtype=torch.bool).tril())
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.T
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def flops_per_token(m, seq):
    C, V, T, L = m["width"], m["vocab_size"], m["context"], m["layers"]
    M = m.get("mlp_width", 4 * C)
    n = V * C + L * (4 * C * C + 2 * M * C + 9 * C + M) + 2 * C  # without wpe
    return 6 * n + 12 * L * seq * C, n + T * C


def mm_peak(shapes, dtype=torch.float32):
    best = 0.0
    for M, N, K in shapes:
        a, b = torch.randn(M, K).to(dtype), torch.randn(N, K).to(dtype)
        for r in range(4):
            t0 = time.perf_counter()
            torch.mm(a, b.t())
            dt = time.perf_counter() - t0
            if r:
                best = max(best, 2 * M * N * K / dt / 1e9)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--foreach", choices=["yes", "no"], default="yes",
                    help="AdamW multi-tensor path (default yes)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with open(a.config) as f:
        cfg = json.load(f)
    m = cfg["model"]
    B = a.batch or cfg.get("train", {}).get("micro_batch", 4)
    T = a.seq or cfg.get("train", {}).get("seq_len", 64)
    torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    model = GPT2(m)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            foreach=a.foreach == "yes")
    idx = torch.randint(0, m["vocab_size"], (B, T + 1))
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    times, losses = [], []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if a.precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(x, y)
        else:
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(float(loss))
        if step >= a.warmup:
            times.append(dt)
    ms = 1e3 * statistics.median(times)
    fpt, params = flops_per_token(m, T)
    tps = B * T / (ms / 1e3)
    C = m["width"]
    M = m.get("mlp_width", 4 * C)
    peak = mm_peak([(B * T, 3 * C, C), (B * T, M, C), (B * T, C, M),
                    (B * T, m["vocab_size"], C)],
                   torch.bfloat16 if a.precision == "bf16" else torch.float32)
    name = "torch %s%s" % (torch.__version__,
                           " bf16 autocast" if a.precision == "bf16" else "")
    res = {"bench": "train", "engine": name, "precision": a.precision,
           "params": params, "batch": B, "seq_len": T, "steps": a.steps,
           "threads": a.threads, "tokens_per_s": tps, "ms_per_step": ms,
           "ms_per_step_mean": 1e3 * statistics.mean(times),
           "flops_per_token": fpt, "model_gflops_per_s": fpt * tps / 1e9,
           "sgemm_peak_gflops_per_s": peak, "mfu": fpt * tps / 1e9 / peak,
           "first_loss": losses[0], "last_loss": losses[-1],
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if a.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"  {k:26s} {v}")


if __name__ == "__main__":
    main()
