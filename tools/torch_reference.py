#!/usr/bin/python3
"""torch_reference.py - writes the PyTorch golden fixture for the CPU engine.

Builds a tiny GPT-2 (the architecture of engine_api/orch_engine.h: learned
token and position embeddings, pre-LayerNorm blocks, causal multi-head
attention, GELU (tanh form), final LayerNorm, LM head tied to wte) from a fixed
seed, in float64, and records:

  param.<name>      the initial weights (table names and shapes of the ABI)
  tokens, targets   one [B, T] batch (one target is -1, ignored)
  logits            [B, T, V] logits of that batch
  loss              [1] mean cross-entropy over non-ignored targets
  grad.<name>       d loss / d param after one backward
  train_losses      [10] loss before each of 10 AdamW steps on the batch
  grad_norms        [10] global gradient L2 norm before clipping at each step

AdamW follows torch.optim.AdamW (decoupled weight decay, bias correction),
weight decay only on 2-D tensors (matrices and embeddings; biases and
LayerNorm parameters carry ORCH_TENSOR_FLAG_NO_DECAY in the engine), and
global-norm clipping as the engine ABI states: if norm > clip, every gradient
is scaled by clip / norm. Hyper-parameters and the model shape go in the
safetensors metadata.

The output is a standard safetensors file (little-endian F32/I32 tensors),
committed under tests/fixtures/, so the C test needs no Python.

With --autocast-bf16 it writes the bf16 mixed-precision fixture instead
(default tests/fixtures/cpu_gpt2_tiny_bf16.safetensors): the same model,
weights and batch in float32 master weights, run under
torch.autocast("cpu", dtype=torch.bfloat16), so every linear-layer product
(qkv, attention projection, MLP, LM head; forward and backward) is bf16 x bf16
with fp32 accumulation, as the engine's precision=bf16; the attention products
(q k^T, att v) run with autocast disabled, in fp32, as in the engine. AdamW
and clipping in fp32 on the fp32 master weights; the clip threshold is the one
of the float64 fixture. It records logits, loss, train_losses, grad_norms and,
in the metadata, how far autocast lies from the float64 reference
(ref_logits_maxdiff, ref_loss_diff, ref_train_losses_maxdiff): the C test
sizes its tolerances from these.

Run with Debian's python3-torch:  /usr/bin/python3 tools/torch_reference.py
"""
import argparse
import json
import math
import struct

import torch
import torch.nn.functional as F

CFG = dict(vocab_size=97, context=16, layers=2, heads=3, width=24,
           mlp_width=80, layernorm_eps=1e-5)
BATCH, SEQ = 2, 12
STEPS = 10
ADAM = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
SEED = 1234


def param_specs(cfg):
    """(name, shape) in the ABI's table order."""
    C, V, T, M = cfg["width"], cfg["vocab_size"], cfg["context"], cfg["mlp_width"]
    specs = [("wte.weight", (V, C)), ("wpe.weight", (T, C))]
    for i in range(cfg["layers"]):
        p = f"h.{i}."
        specs += [
            (p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
            (p + "attn.c_attn.weight", (3 * C, C)), (p + "attn.c_attn.bias", (3 * C,)),
            (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
            (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
            (p + "mlp.c_fc.weight", (M, C)), (p + "mlp.c_fc.bias", (M,)),
            (p + "mlp.c_proj.weight", (C, M)), (p + "mlp.c_proj.bias", (C,)),
        ]
    specs += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return specs


def init_params(cfg, gen):
    """Weights large enough that every path carries a clear gradient."""
    params = {}
    for name, shape in param_specs(cfg):
        if len(shape) == 2:
            t = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.2
        elif name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            t = 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        # Round to float32 so the engine starts from exactly these values.
        params[name] = t.float().double().requires_grad_(True)
    return params


def no_autocast():
    return torch.autocast("cpu", enabled=False)


def forward(cfg, P, tokens, fp32_attention=False):
    B, T = tokens.shape
    C, NH = cfg["width"], cfg["heads"]
    hs = C // NH
    eps = cfg["layernorm_eps"]
    x = P["wte.weight"][tokens] + P["wpe.weight"][:T].unsqueeze(0)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["layers"]):
        p = f"h.{i}."
        h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
        qkv = h @ P[p + "attn.c_attn.weight"].T + P[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        if fp32_attention:  # autocast: attention products stay fp32
            with no_autocast():
                q, k, v = q.float(), k.float(), v.float()
                att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
                att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
                y = (att @ v).transpose(1, 2).reshape(B, T, C)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ P[p + "attn.c_proj.weight"].T + P[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
        h = F.gelu(h @ P[p + "mlp.c_fc.weight"].T + P[p + "mlp.c_fc.bias"],
                   approximate="tanh")
        x = x + h @ P[p + "mlp.c_proj.weight"].T + P[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], eps)
    return x @ P["wte.weight"].T


def loss_of(logits, targets):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1)


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        if t.dtype == torch.float64:
            t = t.float()
        if t.dtype == torch.float32:
            dtype, data = "F32", struct.pack(f"<{t.numel()}f", *t.reshape(-1).tolist())
        elif t.dtype in (torch.int32, torch.int64):
            dtype, data = "I32", struct.pack(f"<{t.numel()}i", *t.reshape(-1).tolist())
        else:
            raise ValueError(f"unsupported dtype {t.dtype}")
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def train_steps(cfg, P, names, tokens, targets, clip, autocast):
    """STEPS AdamW steps on the batch; (losses, norms)."""
    decay = [P[n] for n in names if P[n].dim() >= 2]
    no_decay = [P[n] for n in names if P[n].dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": ADAM["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=ADAM["lr"], betas=(ADAM["beta1"], ADAM["beta2"]), eps=ADAM["eps"],
        foreach=False)
    losses, norms = [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=False)
        if autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = forward(cfg, P, tokens, fp32_attention=True)
            loss = loss_of(logits.float(), targets)
        else:
            loss = loss_of(forward(cfg, P, tokens), targets)
        loss.backward()
        norm = math.sqrt(sum(float((P[n].grad.double() ** 2).sum()) for n in names))
        if norm > clip:
            for n in names:
                P[n].grad.mul_(clip / norm)
        opt.step()
        losses.append(float(loss))
        norms.append(norm)
    return losses, norms


def main_autocast(args):
    """The bf16 autocast fixture (see the module comment)."""
    gen = torch.Generator().manual_seed(SEED)
    cfg = CFG
    P64 = init_params(cfg, gen)
    names = [n for n, _ in param_specs(cfg)]
    V = cfg["vocab_size"]
    tokens = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    targets = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    targets[1, 3] = -1  # the same batch as the float64 fixture
    out = {f"param.{n}": P64[n].detach().clone() for n in names}
    out["tokens"] = tokens.to(torch.int32)
    out["targets"] = targets.to(torch.int32)
    ref_logits = forward(cfg, P64, tokens)
    ref_loss = loss_of(ref_logits, targets)
    ref_loss.backward()
    first_norm = math.sqrt(sum(float((P64[n].grad ** 2).sum()) for n in names))
    clip = float(f"{0.3 * first_norm:.3g}")  # as the float64 fixture
    P = {n: P64[n].detach().float().clone().requires_grad_(True) for n in names}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = forward(cfg, P, tokens, fp32_attention=True).float()
    loss = loss_of(logits, targets)
    out["logits"] = logits.clone()
    out["loss"] = loss.detach().reshape(1).clone()
    ref_losses, _ = train_steps(cfg, {n: P64[n].detach().clone().requires_grad_(True)
                                      for n in names}, names, tokens, targets, clip,
                                False)
    losses, norms = train_steps(cfg, P, names, tokens, targets, clip, True)
    out["train_losses"] = torch.tensor(losses, dtype=torch.float32)
    out["grad_norms"] = torch.tensor(norms, dtype=torch.float32)
    meta = {k: str(v) for k, v in cfg.items()}
    meta.update({"batch": str(BATCH), "seq_len": str(SEQ), "steps": str(STEPS),
                 "grad_clip": repr(clip), "seed": str(SEED),
                 "ref_logits_maxdiff": repr(float((logits.double() - ref_logits).abs().max())),
                 "ref_loss_diff": repr(abs(float(loss) - float(ref_loss))),
                 "ref_train_losses_maxdiff":
                     repr(max(abs(a - b) for a, b in zip(losses, ref_losses))),
                 "generator": "tools/torch_reference.py --autocast-bf16 (torch %s, "
                              "autocast cpu bfloat16, fp32 master weights)"
                              % torch.__version__})
    meta.update({k: repr(v) for k, v in ADAM.items()})
    write_safetensors(args.out, out, meta)
    print(f"wrote {args.out}: loss {float(loss):.6f} (float64 {float(ref_loss):.6f}), "
          f"logits vs float64 {meta['ref_logits_maxdiff']}, losses {losses[0]:.4f} -> "
          f"{losses[-1]:.4f} (float64 {ref_losses[0]:.4f} -> {ref_losses[-1]:.4f}), "
          f"max step diff {meta['ref_train_losses_maxdiff']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--autocast-bf16", action="store_true",
                    help="write the bf16 autocast fixture (see the module comment)")
    args = ap.parse_args()
    if args.autocast_bf16:
        torch.set_num_threads(1)
        args.out = args.out or "tests/fixtures/cpu_gpt2_tiny_bf16.safetensors"
        main_autocast(args)
        return
    args.out = args.out or "tests/fixtures/cpu_gpt2_tiny.safetensors"
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)
    cfg = CFG
    P = init_params(cfg, gen)
    names = [n for n, _ in param_specs(cfg)]
    V = cfg["vocab_size"]
    tokens = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    targets = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    targets[1, 3] = -1  # an ignored position

    out = {f"param.{n}": P[n].detach().clone() for n in names}
    out["tokens"] = tokens.to(torch.int32)
    out["targets"] = targets.to(torch.int32)
    logits = forward(cfg, P, tokens)
    loss = loss_of(logits, targets)
    loss.backward()
    out["logits"] = logits.detach().clone()
    out["loss"] = loss.detach().reshape(1).clone()
    for n in names:
        out[f"grad.{n}"] = P[n].grad.detach().clone()
    first_norm = math.sqrt(sum(float((P[n].grad ** 2).sum()) for n in names))
    # Clip below the first norm so clipping is exercised.
    clip = float(f"{0.3 * first_norm:.3g}")

    decay = [P[n] for n in names if P[n].dim() >= 2]
    no_decay = [P[n] for n in names if P[n].dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": ADAM["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=ADAM["lr"], betas=(ADAM["beta1"], ADAM["beta2"]), eps=ADAM["eps"],
        foreach=False)
    losses, norms = [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=False)
        loss = loss_of(forward(cfg, P, tokens), targets)
        loss.backward()
        norm = math.sqrt(sum(float((P[n].grad ** 2).sum()) for n in names))
        if norm > clip:
            for n in names:
                P[n].grad.mul_(clip / norm)
        opt.step()
        losses.append(float(loss))
        norms.append(norm)
    out["train_losses"] = torch.tensor(losses, dtype=torch.float64)
    out["grad_norms"] = torch.tensor(norms, dtype=torch.float64)

    meta = {k: str(v) for k, v in cfg.items()}
    meta.update({"batch": str(BATCH), "seq_len": str(SEQ), "steps": str(STEPS),
                 "grad_clip": repr(clip), "seed": str(SEED),
                 "generator": "tools/torch_reference.py (torch %s, float64)"
                 % torch.__version__})
    meta.update({k: repr(v) for k, v in ADAM.items()})
    write_safetensors(args.out, out, meta)
    print(f"wrote {args.out}: loss {float(out['loss']):.6f}, clip {clip}, "
          f"losses {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"clipped steps {sum(n > clip for n in norms)}/{STEPS}")


if __name__ == "__main__":
    main()
