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

With --arch llama --kv-heads N (1, 2 or 4) it writes the LLaMA fixture
tests/fixtures/cpu_llama_tiny_kvN.safetensors: the same records for a tiny
LLaMA-family model (the header's tensor names; RMSNorm, rotate-half RoPE,
grouped-query attention with N of 4 heads, SwiGLU, no biases), kv2 with an
untied head and linear rope scaling, kv1 with llama3 rope scaling, plus
rope_inv_freq (the frequencies after scaling) and the model in the metadata.

With --lora RANK,ALPHA,TARGETS (TARGETS: "all" or qkv, out, up, down joined
by "+") it writes the LoRA fixture (ABI 1.4) of --arch gpt2 (the model and
batch above) or llama (the kv_heads 2 model): default
tests/fixtures/cpu_{gpt2,llama}_tiny_lora.safetensors. The base is frozen;
every target matrix W [out,in] of every layer gets A [rank,in] (uniform in
[-1/sqrt(in), 1/sqrt(in))) and B [out,rank] (N(0, 0.1): NOT zero, so every
path carries a gradient), y = x W^T + (alpha/rank) (x A^T) B^T. Records:

  param.<name>      the base weights; lora.<name> the adapter's initial A/B
                    (the header's adapter tensor names and order)
  tokens, targets   one [B, T] batch (three targets are -1)
  logits, loss      through base + adapter
  grad.<lora name>  d loss / d A, B (the base has no gradient)
  train_losses, grad_norms   10 AdamW steps of the adapter only (weight decay
                    on every adapter tensor, clipping at 0.3 x the first norm)
  final.<lora name> the adapter after the 10 steps

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


def lora_delta(lora, base, h):
    """(alpha/rank) (h A^T) B^T of the adapter on base weight `base` (its name
    minus ".weight"), or 0 when lora is None or does not target it."""
    if lora is None or base + ".lora_A.weight" not in lora["P"]:
        return 0.0
    A, B = lora["P"][base + ".lora_A.weight"], lora["P"][base + ".lora_B.weight"]
    return lora["scale"] * ((h @ A.T) @ B.T)


def forward(cfg, P, tokens, fp32_attention=False, lora=None):
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
        if lora is not None:
            qkv = qkv + lora_delta(lora, p + "attn.c_attn", h)
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
        if lora is not None:
            x = x + lora_delta(lora, p + "attn.c_proj", y)
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
        if lora is None:
            h = F.gelu(h @ P[p + "mlp.c_fc.weight"].T + P[p + "mlp.c_fc.bias"],
                       approximate="tanh")
            x = x + h @ P[p + "mlp.c_proj.weight"].T + P[p + "mlp.c_proj.bias"]
        else:
            h = F.gelu(h @ P[p + "mlp.c_fc.weight"].T + P[p + "mlp.c_fc.bias"] +
                       lora_delta(lora, p + "mlp.c_fc", h), approximate="tanh")
            x = (x + h @ P[p + "mlp.c_proj.weight"].T + P[p + "mlp.c_proj.bias"] +
                 lora_delta(lora, p + "mlp.c_proj", h))
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


def train_steps(cfg, P, names, tokens, targets, clip, autocast, fwd=None):
    """STEPS AdamW steps on the batch with forward fwd (GPT-2's by default);
    (losses, norms)."""
    fwd = fwd or forward
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
                logits = fwd(cfg, P, tokens, fp32_attention=True)
            loss = loss_of(logits.float(), targets)
        else:
            loss = loss_of(fwd(cfg, P, tokens), targets)
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


# ---------------------------------------------------------------------------
# LLaMA (ORCH_ARCH_LLAMA, ABI 1.1): the header's names, Hugging Face's
# LlamaForCausalLM semantics (RMSNorm, rotate-half RoPE with the llama3 and
# linear rope scaling of transformers' rope init functions, grouped-query
# attention, SwiGLU MLP, no biases, optional untied head).
# ---------------------------------------------------------------------------
LLAMA_CFG = dict(vocab_size=97, context=16, layers=2, heads=4, width=32,
                 mlp_width=48, layernorm_eps=1e-5, rope_theta=10000.0)
# The fixtures: (kv_heads, untied head, rope scaling). kv1 runs llama3 scaling
# with original_context 64 so its 4 frequencies fall in all three branches
# (kept, smoothed, divided); kv2 has an untied head and linear scaling.
LLAMA_VARIANTS = {
    4: dict(untied=False, rope=None),
    2: dict(untied=True, rope=dict(rope_type="linear", factor=2.0)),
    1: dict(untied=False, rope=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0,
                                    original_max_position_embeddings=64)),
}


def llama_specs(cfg):
    C, V, M = cfg["width"], cfg["vocab_size"], cfg["mlp_width"]
    D = C // cfg["heads"]
    KV = cfg["kv_heads"] * D
    specs = [("model.embed_tokens.weight", (V, C))]
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        specs += [
            (p + "input_layernorm.weight", (C,)),
            (p + "self_attn.q_proj.weight", (C, C)),
            (p + "self_attn.k_proj.weight", (KV, C)),
            (p + "self_attn.v_proj.weight", (KV, C)),
            (p + "self_attn.o_proj.weight", (C, C)),
            (p + "post_attention_layernorm.weight", (C,)),
            (p + "mlp.gate_proj.weight", (M, C)),
            (p + "mlp.up_proj.weight", (M, C)),
            (p + "mlp.down_proj.weight", (C, M)),
        ]
    specs.append(("model.norm.weight", (C,)))
    if cfg["untied"]:
        specs.append(("lm_head.weight", (V, C)))
    return specs


def llama_init(cfg, gen):
    params = {}
    for name, shape in llama_specs(cfg):
        if len(shape) == 2:
            t = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.2
        else:
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        params[name] = t.float().double().requires_grad_(True)
    return params


def llama_inv_freq(cfg):
    """transformers' _compute_default/linear/llama3 rope parameters, in float64."""
    D = cfg["width"] // cfg["heads"]
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    rope = cfg["rope"]
    if rope is None:
        return inv
    if rope["rope_type"] == "linear":
        return inv / rope["factor"]
    factor, lo, hi = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    orig = rope["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > orig / lo, inv / factor, inv)
    smooth = (orig / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < orig / hi) * ~(wavelen > orig / lo)
    return torch.where(medium, smoothed, out)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def llama_forward(cfg, P, tokens, lora=None):
    B, T = tokens.shape
    C, NH, NKV = cfg["width"], cfg["heads"], cfg["kv_heads"]
    D = C // NH
    eps = cfg["layernorm_eps"]
    pos = torch.arange(T, dtype=torch.float64)
    ang = torch.outer(pos, llama_inv_freq(cfg))  # [T, D/2]
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = P["model.embed_tokens.weight"][tokens]
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, P[p + "input_layernorm.weight"], eps)
        q = h @ P[p + "self_attn.q_proj.weight"].T + lora_delta(lora, p + "self_attn.q_proj", h)
        k = h @ P[p + "self_attn.k_proj.weight"].T + lora_delta(lora, p + "self_attn.k_proj", h)
        v = h @ P[p + "self_attn.v_proj.weight"].T + lora_delta(lora, p + "self_attn.v_proj", h)
        q = q.view(B, T, NH, D).transpose(1, 2)
        k = k.view(B, T, NKV, D).transpose(1, 2)
        v = v.view(B, T, NKV, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ P[p + "self_attn.o_proj.weight"].T + lora_delta(lora, p + "self_attn.o_proj", y)
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], eps)
        g = F.silu(h @ P[p + "mlp.gate_proj.weight"].T + lora_delta(lora, p + "mlp.gate_proj", h)) * (
            h @ P[p + "mlp.up_proj.weight"].T + lora_delta(lora, p + "mlp.up_proj", h))
        x = x + g @ P[p + "mlp.down_proj.weight"].T + lora_delta(lora, p + "mlp.down_proj", g)
    x = rms_norm(x, P["model.norm.weight"], eps)
    head = P["lm_head.weight"] if cfg["untied"] else P["model.embed_tokens.weight"]
    return x @ head.T


def main_llama(args):
    """One LLaMA fixture per kv_heads (see LLAMA_VARIANTS): the same records as
    the GPT-2 fixture (param., tokens, targets, logits, loss, grad., 10 AdamW
    steps), float64."""
    cfg = dict(LLAMA_CFG)
    cfg["kv_heads"] = args.kv_heads
    cfg.update(LLAMA_VARIANTS[args.kv_heads])
    gen = torch.Generator().manual_seed(SEED + args.kv_heads)
    P = llama_init(cfg, gen)
    names = [n for n, _ in llama_specs(cfg)]
    V = cfg["vocab_size"]
    tokens = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    targets = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    targets[1, 3] = -1
    out = {f"param.{n}": P[n].detach().clone() for n in names}
    out["tokens"] = tokens.to(torch.int32)
    out["targets"] = targets.to(torch.int32)
    logits = llama_forward(cfg, P, tokens)
    loss = loss_of(logits, targets)
    loss.backward()
    out["logits"] = logits.detach().clone()
    out["loss"] = loss.detach().reshape(1).clone()
    for n in names:
        out[f"grad.{n}"] = P[n].grad.detach().clone()
    first_norm = math.sqrt(sum(float((P[n].grad ** 2).sum()) for n in names))
    clip = float(f"{0.3 * first_norm:.3g}")
    losses, norms = train_steps(cfg, P, names, tokens, targets, clip, False,
                                fwd=llama_forward)
    out["train_losses"] = torch.tensor(losses, dtype=torch.float64)
    out["grad_norms"] = torch.tensor(norms, dtype=torch.float64)
    out["rope_inv_freq"] = llama_inv_freq(cfg)
    meta = {k: str(v) for k, v in cfg.items() if k not in ("rope", "untied")}
    meta.update({"arch": "llama", "untied_head": "1" if cfg["untied"] else "0",
                 "rope_scaling": cfg["rope"]["rope_type"] if cfg["rope"] else "none"})
    if cfg["rope"]:
        r = cfg["rope"]
        meta["rope_factor"] = repr(r["factor"])
        if r["rope_type"] == "llama3":
            meta["rope_low_freq_factor"] = repr(r["low_freq_factor"])
            meta["rope_high_freq_factor"] = repr(r["high_freq_factor"])
            meta["rope_original_context"] = str(r["original_max_position_embeddings"])
    meta.update({"batch": str(BATCH), "seq_len": str(SEQ), "steps": str(STEPS),
                 "grad_clip": repr(clip), "seed": str(SEED + args.kv_heads),
                 "generator": "tools/torch_reference.py --arch llama --kv-heads %d "
                              "(torch %s, float64)" % (args.kv_heads, torch.__version__)})
    meta.update({k: repr(v) for k, v in ADAM.items()})
    write_safetensors(args.out, out, meta)
    print(f"wrote {args.out}: kv_heads {args.kv_heads}, loss {float(out['loss']):.6f}, "
          f"clip {clip}, losses {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"clipped steps {sum(n > clip for n in norms)}/{STEPS}")

# ---------------------------------------------------------------------------
# LoRA adapters (ABI 1.4): the header's adapter table, base frozen.
# ---------------------------------------------------------------------------
LORA_TARGET_BITS = {"qkv": 1, "out": 2, "up": 4, "down": 8}


def lora_targets(cfg, arch, targets):
    """(base name minus .weight, out, in) of every targeted matrix, layer by
    layer and target by target in the header's order."""
    C, M = cfg["width"], cfg["mlp_width"]
    out = []
    for i in range(cfg["layers"]):
        if arch == "gpt2":
            p = f"h.{i}."
            per = [("qkv", p + "attn.c_attn", 3 * C, C), ("out", p + "attn.c_proj", C, C),
                   ("up", p + "mlp.c_fc", M, C), ("down", p + "mlp.c_proj", C, M)]
        else:
            p = f"model.layers.{i}."
            KV = cfg["kv_heads"] * (C // cfg["heads"])
            per = [("qkv", p + "self_attn.q_proj", C, C), ("qkv", p + "self_attn.k_proj", KV, C),
                   ("qkv", p + "self_attn.v_proj", KV, C), ("out", p + "self_attn.o_proj", C, C),
                   ("up", p + "mlp.gate_proj", M, C), ("up", p + "mlp.up_proj", M, C),
                   ("down", p + "mlp.down_proj", C, M)]
        out += [(n, o, k) for t, n, o, k in per if t in targets]
    return out


def main_lora(args):
    rank_s, alpha_s, targets_s = args.lora.split(",")
    rank, alpha = int(rank_s), float(alpha_s)
    targets = set(LORA_TARGET_BITS) if targets_s == "all" else set(targets_s.split("+"))
    if not targets or not targets <= set(LORA_TARGET_BITS):
        raise SystemExit(f"--lora: unknown targets {targets_s!r}")
    if args.arch == "gpt2":
        cfg = dict(CFG)
        gen = torch.Generator().manual_seed(SEED)
        P = init_params(cfg, gen)  # the model of cpu_gpt2_tiny.safetensors
        names = [n for n, _ in param_specs(cfg)]
        fwd = forward
    else:
        cfg = dict(LLAMA_CFG)
        cfg["kv_heads"] = 2
        cfg.update(LLAMA_VARIANTS[2])
        gen = torch.Generator().manual_seed(SEED + 2)
        P = llama_init(cfg, gen)  # the model of cpu_llama_tiny_kv2.safetensors
        names = [n for n, _ in llama_specs(cfg)]
        fwd = llama_forward
    V = cfg["vocab_size"]
    tokens = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    targets_t = torch.randint(0, V, (BATCH, SEQ), generator=gen)
    targets_t[1, 3] = -1
    targets_t[0, 0] = -1
    targets_t[0, 7] = -1
    for n in names:
        P[n].requires_grad_(False)
    lgen = torch.Generator().manual_seed(SEED + 100)
    LP, lnames = {}, []
    for base, o, k in lora_targets(cfg, args.arch, targets):
        bound = 1.0 / math.sqrt(k)
        A = (torch.rand((rank, k), generator=lgen, dtype=torch.float64) * 2 - 1) * bound
        B = torch.randn((o, rank), generator=lgen, dtype=torch.float64) * 0.1
        for suffix, t in ((".lora_A.weight", A), (".lora_B.weight", B)):
            LP[base + suffix] = t.float().double().requires_grad_(True)
            lnames.append(base + suffix)
    lora = {"P": LP, "scale": alpha / rank}
    out = {f"param.{n}": P[n].detach().clone() for n in names}
    out.update({f"lora.{n}": LP[n].detach().clone() for n in lnames})
    out["tokens"] = tokens.to(torch.int32)
    out["targets"] = targets_t.to(torch.int32)
    logits = fwd(cfg, P, tokens, lora=lora)
    loss = loss_of(logits, targets_t)
    loss.backward()
    out["logits"] = logits.detach().clone()
    out["loss"] = loss.detach().reshape(1).clone()
    for n in lnames:
        out[f"grad.{n}"] = LP[n].grad.detach().clone()
    first_norm = math.sqrt(sum(float((LP[n].grad ** 2).sum()) for n in lnames))
    clip = float(f"{0.3 * first_norm:.3g}")
    opt = torch.optim.AdamW([LP[n] for n in lnames], lr=ADAM["lr"],
                            betas=(ADAM["beta1"], ADAM["beta2"]), eps=ADAM["eps"],
                            weight_decay=ADAM["weight_decay"], foreach=False)
    losses, norms = [], []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=False)
        step_loss = loss_of(fwd(cfg, P, tokens, lora=lora), targets_t)
        step_loss.backward()
        norm = math.sqrt(sum(float((LP[n].grad ** 2).sum()) for n in lnames))
        if norm > clip:
            for n in lnames:
                LP[n].grad.mul_(clip / norm)
        opt.step()
        losses.append(float(step_loss))
        norms.append(norm)
    out["train_losses"] = torch.tensor(losses, dtype=torch.float64)
    out["grad_norms"] = torch.tensor(norms, dtype=torch.float64)
    out.update({f"final.{n}": LP[n].detach().clone() for n in lnames})
    meta = {k: str(v) for k, v in cfg.items() if k not in ("rope", "untied")}
    meta["arch"] = args.arch
    if args.arch == "llama":
        meta.update({"untied_head": "1" if cfg["untied"] else "0",
                     "rope_scaling": cfg["rope"]["rope_type"] if cfg["rope"] else "none"})
        if cfg["rope"]:
            meta["rope_factor"] = repr(cfg["rope"]["factor"])
    bits = sum(LORA_TARGET_BITS[t] for t in targets)
    meta.update({"batch": str(BATCH), "seq_len": str(SEQ), "steps": str(STEPS),
                 "grad_clip": repr(clip), "lora_rank": str(rank), "lora_alpha": repr(alpha),
                 "lora_targets": str(bits), "lora_tensors": str(len(lnames)),
                 "generator": "tools/torch_reference.py --arch %s --lora %s (torch %s, "
                              "float64)" % (args.arch, args.lora, torch.__version__)})
    meta.update({k: repr(v) for k, v in ADAM.items()})
    write_safetensors(args.out, out, meta)
    print(f"wrote {args.out}: {len(lnames)} adapter tensors, loss {float(loss):.6f}, "
          f"clip {clip}, losses {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"clipped steps {sum(n > clip for n in norms)}/{STEPS}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--autocast-bf16", action="store_true",
                    help="write the bf16 autocast fixture (see the module comment)")
    ap.add_argument("--arch", choices=("gpt2", "llama"), default="gpt2")
    ap.add_argument("--kv-heads", type=int, choices=sorted(LLAMA_VARIANTS), default=4,
                    help="llama: which fixture (kv_heads 1, 2 or 4 of 4 heads)")
    ap.add_argument("--lora", default=None, metavar="RANK,ALPHA,TARGETS",
                    help="write the LoRA fixture (see the module comment)")
    args = ap.parse_args()
    if args.lora:
        torch.set_num_threads(1)
        args.out = args.out or f"tests/fixtures/cpu_{args.arch}_tiny_lora.safetensors"
        main_lora(args)
        return
    if args.arch == "llama":
        torch.set_num_threads(1)
        args.out = args.out or f"tests/fixtures/cpu_llama_tiny_kv{args.kv_heads}.safetensors"
        main_llama(args)
        return
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

    losses, norms = train_steps(cfg, P, names, tokens, targets, clip, False)
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
