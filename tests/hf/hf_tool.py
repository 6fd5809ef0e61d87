#!/usr/bin/env python3
"""hf_tool.py - helpers of tests/hf_cli.sh for Hugging Face GPT-2 directories
written by `orch export hf` (standard library only, except `logits`, which
needs torch):

  layout HF_DIR CKPT_DIR   check model.safetensors against HF's GPT-2 layout:
                           names (transformer.*, no lm_head / attn.bias),
                           shapes from config.json (Conv1D [in, out]),
                           __metadata__ {"format": "pt"}, F32 data equal to
                           the orch checkpoint's (Conv1D transposed), and the
                           config.json / generation_config.json fields
  same A.safetensors B.safetensors
                           same names, dtypes, shapes and bytes
  shard HF_DIR OUT_DIR     copy HF_DIR to OUT_DIR with model.safetensors split
                           into two shards and model.safetensors.index.json
  logits HF_DIR PORT IDS.. HF's GPT-2 forward (Conv1D layout) in torch (or for
                           a LlamaForCausalLM directory torch_reference's
                           llama_forward by HF's loading rules) on the
                           prompt ids, greedy for the steps orch serve (PORT)
                           generates; its chosen and top-5 logprobs must match
                           orch's within 1e-4
LLaMA (torch for llama-logits only):
  mkllama FIXTURE OUT_DIR [untie] [vocab=N] [dtype=F32|F16|BF16] [tokjson]
                           a Hugging Face LlamaForCausalLM directory from a
                           tools/torch_reference.py llama fixture (its param.*
                           and __metadata__): config.json by HF's keys,
                           model.safetensors; untie: lm_head.weight = a copy
                           of the embedding and tie_word_embeddings false (the
                           same logits); vocab=N: embedding (and head) rows
                           past the fixture's small fixed values (the
                           fixture's logits unchanged); tokjson: a
                           small ByteLevel BPE tokenizer.json, tokenizer_config
                           and generation_config beside them
  llama-layout HF_DIR CKPT_DIR
                           config.json / model.safetensors against the orch
                           llama checkpoint: HF's names, F32 bytes equal
  llama-logits HF_DIR FIXTURE [TOL]
                           tools/torch_reference.py's llama_forward (float64)
                           on the model loaded by HF's rules (names,
                           config.json keys: rope_scaling, tie_word_embeddings,
                           num_key_value_heads, rms_norm_eps, rope_theta) on
                           the fixture's tokens; its logits must equal the
                           fixture's within TOL (default 1e-5)
  fixture-json FIXTURE OUT.json
                           the fixture's tokens and logits as JSON (for
                           tests/gguf/llama_cpp_fixture.mjs)
  llama-rows LOGITS.f32 FIXTURE [TOL]
                           a raw little-endian f32 [B*T, V'] dump (orch's
                           logits) against the fixture's logits (V' >= V)
"""
import json
import os
import shutil
import struct
import sys
from array import array


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def read_st(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    return header, raw[8 + n:]


def tensor_bytes(header, data, name):
    b, e = header[name]["data_offsets"]
    return data[b:e]


def floats(header, data, name):
    a = array("f")
    a.frombytes(tensor_bytes(header, data, name))
    return a


def write_st(path, tensors, metadata):
    """tensors: list of (name, dtype, shape, bytes)."""
    header, off = {}, 0
    for name, dtype, shape, b in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, _, b in tensors:
            f.write(b)


LAYER = [("ln_1.weight", 0), ("ln_1.bias", 0), ("attn.c_attn.weight", 1),
         ("attn.c_attn.bias", 0), ("attn.c_proj.weight", 1), ("attn.c_proj.bias", 0),
         ("ln_2.weight", 0), ("ln_2.bias", 0), ("mlp.c_fc.weight", 1),
         ("mlp.c_fc.bias", 0), ("mlp.c_proj.weight", 1), ("mlp.c_proj.bias", 0)]


def hf_shapes(cfg):
    C, L, V, T = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_positions"]
    M = cfg["n_inner"] or 4 * C
    want = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [T, C],
            "transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]}
    shp = {"ln_1.weight": [C], "ln_1.bias": [C], "attn.c_attn.weight": [C, 3 * C],
           "attn.c_attn.bias": [3 * C], "attn.c_proj.weight": [C, C],
           "attn.c_proj.bias": [C], "ln_2.weight": [C], "ln_2.bias": [C],
           "mlp.c_fc.weight": [C, M], "mlp.c_fc.bias": [M], "mlp.c_proj.weight": [M, C],
           "mlp.c_proj.bias": [C]}
    for i in range(L):
        for s, _ in LAYER:
            want[f"transformer.h.{i}.{s}"] = shp[s]
    return want


def cmd_layout(hf_dir, ckpt_dir):
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    orch_cfg = json.load(open(os.path.join(ckpt_dir, "state.json")))["config"]["model"]
    expect = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
              "activation_function": "gelu_new", "tie_word_embeddings": True,
              "n_embd": orch_cfg["width"], "n_layer": orch_cfg["layers"],
              "n_head": orch_cfg["heads"], "n_positions": orch_cfg["context"],
              "n_ctx": orch_cfg["context"], "vocab_size": orch_cfg["vocab_size"],
              "torch_dtype": "float32", "bos_token_id": 50256, "eos_token_id": 50256}
    for k, v in expect.items():
        if cfg.get(k) != v:
            fail(f"config.json {k}: {cfg.get(k)!r}, expected {v!r}")
    if abs(cfg["layer_norm_epsilon"] - orch_cfg.get("layernorm_eps", 1e-5)) > 1e-12:
        fail("config.json layer_norm_epsilon")
    gen = json.load(open(os.path.join(hf_dir, "generation_config.json")))
    if gen.get("eos_token_id") != 50256:
        fail(f"generation_config.json: {gen}")
    tc = json.load(open(os.path.join(hf_dir, "tokenizer_config.json")))
    if tc.get("tokenizer_class") != "GPT2Tokenizer":
        fail(f"tokenizer_config.json: {tc}")
    header, data = read_st(os.path.join(hf_dir, "model.safetensors"))
    if header.get("__metadata__") != {"format": "pt"}:
        fail(f"__metadata__ {header.get('__metadata__')}")
    names = {k: v for k, v in header.items() if k != "__metadata__"}
    want = hf_shapes(cfg)
    if set(names) != set(want):
        fail(f"names differ: extra {sorted(set(names) - set(want))[:4]}, "
             f"missing {sorted(set(want) - set(names))[:4]}")
    for k, v in names.items():
        if v["shape"] != want[k] or v["dtype"] != "F32":
            fail(f"{k}: {v['dtype']} {v['shape']}, expected F32 {want[k]}")
    oh, od = read_st(os.path.join(ckpt_dir, "model.safetensors"))
    conv = {s for s, c in LAYER if c}
    for k in names:
        on = k[len("transformer."):]
        a, b = floats(header, data, k), floats(oh, od, on)
        if on.split(".", 2)[-1] in conv and on.startswith("h."):
            rows, cols = oh[on]["shape"]  # orch [out, in]; HF [in, out]
            b = array("f", (b[r * cols + c] for c in range(cols) for r in range(rows)))
        if a.tobytes() != b.tobytes():
            fail(f"{k}: data differs from the checkpoint's {on}")
    print(f"layout ok: {len(names)} tensors")


def cmd_same(a, b):
    ha, da = read_st(a)
    hb, db = read_st(b)
    na = sorted(k for k in ha if k != "__metadata__")
    nb = sorted(k for k in hb if k != "__metadata__")
    if na != nb:
        fail(f"names differ: {na[:3]} vs {nb[:3]}")
    for k in na:
        if (ha[k]["dtype"], ha[k]["shape"]) != (hb[k]["dtype"], hb[k]["shape"]):
            fail(f"{k}: {ha[k]} vs {hb[k]}")
        if tensor_bytes(ha, da, k) != tensor_bytes(hb, db, k):
            fail(f"{k}: bytes differ")
    print(f"same: {len(na)} tensors bit for bit")


def cmd_shard(hf_dir, out_dir):
    shutil.copytree(hf_dir, out_dir)
    os.remove(os.path.join(out_dir, "model.safetensors"))
    header, data = read_st(os.path.join(hf_dir, "model.safetensors"))
    names = [k for k in header if k != "__metadata__"]
    half = len(names) // 2
    shards = [names[:half], names[half:]]
    wmap = {}
    for i, part in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        write_st(os.path.join(out_dir, fn),
                 [(k, header[k]["dtype"], header[k]["shape"], tensor_bytes(header, data, k))
                  for k in part], {"format": "pt"})
        for k in part:
            wmap[k] = fn
    json.dump({"metadata": {"total_size": len(data)}, "weight_map": wmap},
              open(os.path.join(out_dir, "model.safetensors.index.json"), "w"), indent=2)
    print(f"sharded: {len(shards[0])} + {len(shards[1])} tensors")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def cmd_logits(hf_dir, port, ids):
    import math
    import urllib.request
    import torch
    import torch.nn.functional as F
    torch.set_grad_enabled(False)
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    if cfg.get("architectures") == ["LlamaForCausalLM"]:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
        import torch_reference
        lcfg, LP = load_llama(hf_dir)
        arch = "LLaMA"

        def forward(tokens):
            return torch_reference.llama_forward(lcfg, LP, torch.tensor([tokens]))[0]
        return logits_check(hf_dir, port, ids, forward, arch)
    header, data = read_st(os.path.join(hf_dir, "model.safetensors"))
    P = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        if v["dtype"] != "F32":
            fail(f"{k}: dtype {v['dtype']} (logits reads F32 exports)")
        P[k[len("transformer."):]] = torch.tensor(floats(header, data, k),
                                                  dtype=torch.float64).view(v["shape"])
    C, NH, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hs = C // NH

    def forward(tokens):  # HF GPT2LMHeadModel, Conv1D: y = x @ W + b, W [in, out]
        T = len(tokens)
        t = torch.tensor(tokens)
        x = P["wte.weight"][t] + P["wpe.weight"][:T]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for i in range(cfg["n_layer"]):
            p = f"h.{i}."
            h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], eps)
            q, k, v = (h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]).split(C, -1)
            q, k, v = (z.view(T, NH, hs).transpose(0, 1) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(0, 1).reshape(T, C)
            x = x + y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"]
            h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], eps)
            h = F.gelu(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"], approximate="tanh")
            x = x + h @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"]
        x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], eps)
        return x @ P["wte.weight"].T

    return logits_check(hf_dir, port, ids, forward, "GPT-2")


def logits_check(hf_dir, port, ids, forward, arch):
    import urllib.request
    b2u = bytes_to_unicode()
    vocab = json.load(open(os.path.join(hf_dir, "vocab.json")))
    text_of = {}
    for tok, i in vocab.items():
        text_of[i] = bytes(b2u[ch] for ch in tok).decode("utf-8", errors="replace")
    steps = 8
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps({"prompt": ids, "max_tokens": steps, "temperature": 0,
                         "logprobs": 5}).encode(),
        headers={"Content-Type": "application/json"})
    oc = json.load(urllib.request.urlopen(req, timeout=60))["choices"][0]
    lp = oc["logprobs"]
    seq = list(ids)
    worst = 0.0
    for s in range(len(lp["tokens"])):
        logp = forward(seq)[-1].log_softmax(-1)
        best = int(logp.argmax())
        if text_of.get(best) != lp["tokens"][s]:
            fail(f"step {s}: torch's greedy token {text_of.get(best)!r}, orch {lp['tokens'][s]!r}")
        d = abs(float(logp[best]) - lp["token_logprobs"][s])
        worst = max(worst, d)
        if d > 1e-4:
            fail(f"step {s}: chosen logprob torch {float(logp[best])} vs orch {lp['token_logprobs'][s]}")
        for text, v in (lp["top_logprobs"][s] or {}).items():
            cand = [float(logp[i]) for i, t in text_of.items() if t == text and i < logp.shape[0]]
            if not cand:
                fail(f"step {s}: orch's top token {text!r} is not in vocab.json")
            d = min(abs(c - v) for c in cand)
            worst = max(worst, d)
            if d > 1e-4:
                fail(f"step {s}: top token {text!r}: orch {v}, torch {cand}")
        seq.append(best)
    if not lp["tokens"]:
        fail("orch generated nothing")
    print(f"torch HF {arch} forward matches orch serve: {len(lp['tokens'])} steps, "
          f"largest logprob difference {worst:.2e} (tolerance 1e-4)")


def fixture(path):
    header, data = read_st(path)
    meta = header["__metadata__"]
    P = {k[len("param."):]: (header[k], tensor_bytes(header, data, k))
         for k in header if k.startswith("param.")}
    return header, data, meta, P


def cmd_mkllama(fix, out_dir, *opts):
    header, data, meta, P = fixture(fix)
    untie = "untie" in opts
    vocab = int(meta["vocab_size"])
    dtype = "F32"
    for o in opts:
        if o.startswith("vocab="):
            vocab = int(o[6:])
        if o.startswith("dtype="):
            dtype = o[6:]
    tied = meta.get("untied_head", "0") != "1" and not untie
    C = int(meta["width"])
    rope = None
    if meta.get("rope_scaling", "none") == "linear":
        rope = {"rope_type": "linear", "factor": float(meta["rope_factor"])}
    elif meta.get("rope_scaling", "none") == "llama3":
        rope = {"rope_type": "llama3", "factor": float(meta["rope_factor"]),
                "low_freq_factor": float(meta["rope_low_freq_factor"]),
                "high_freq_factor": float(meta["rope_high_freq_factor"]),
                "original_max_position_embeddings": int(meta["rope_original_context"])}
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_act": "silu", "hidden_size": C,
           "intermediate_size": int(meta["mlp_width"]),
           "num_hidden_layers": int(meta["layers"]),
           "num_attention_heads": int(meta["heads"]),
           "num_key_value_heads": int(meta["kv_heads"]),
           "max_position_embeddings": int(meta["context"]), "vocab_size": vocab,
           "rms_norm_eps": float(meta["layernorm_eps"]),
           "rope_theta": float(meta["rope_theta"]), "rope_scaling": rope,
           "tie_word_embeddings": tied, "attention_bias": False, "mlp_bias": False,
           "torch_dtype": "float32"}
    os.makedirs(out_dir)
    json.dump(cfg, open(os.path.join(out_dir, "config.json"), "w"), indent=2)
    tensors = []
    for name, (h, b) in P.items():
        shape = list(h["shape"])
        if name in ("model.embed_tokens.weight", "lm_head.weight") and vocab > shape[0]:
            n = C * (vocab - shape[0])  # small deterministic values: no ties in greedy picks
            b = b + array("f", (((i * 2654435761) % 2001 - 1000) * 2e-5 for i in range(n))).tobytes()
            shape[0] = vocab
        tensors.append((name, shape, b))
        if untie and name == "model.embed_tokens.weight":
            tensors.append(("lm_head.weight", shape, b))
    out = []
    for name, shape, b in tensors:
        a = array("f")
        a.frombytes(b)
        if dtype == "F16":
            b = struct.pack(f"<{len(a)}e", *a)
        elif dtype == "BF16":  # round to nearest even
            u = array("I")
            u.frombytes(a.tobytes())
            b = array("H", (((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF for x in u)).tobytes()
        out.append((name, dtype, shape, b))
    write_st(os.path.join(out_dir, "model.safetensors"), out, {"format": "pt"})
    if "tokjson" in opts:
        tok = {"version": "1.0", "added_tokens": [
                   {"id": 96, "content": "<|end|>", "special": True, "single_word": False,
                    "lstrip": False, "rstrip": False, "normalized": False}],
               "normalizer": None, "pre_tokenizer": {"type": "ByteLevel",
                                                     "add_prefix_space": False},
               "post_processor": None, "decoder": {"type": "ByteLevel"},
               "model": {"type": "BPE", "vocab": {chr(0x41 + i): i for i in range(90)},
                         "merges": ["A B", "C D"]}}
        tok["model"]["vocab"].update({"AB": 90, "CD": 91})
        json.dump(tok, open(os.path.join(out_dir, "tokenizer.json"), "w"))
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|end|>"},
                  open(os.path.join(out_dir, "tokenizer_config.json"), "w"))
        json.dump({"eos_token_id": 96}, open(os.path.join(out_dir, "generation_config.json"), "w"))
    print(f"mkllama: {len(out)} tensors, vocab {vocab}, {'tied' if tied else 'untied'}, "
          f"rope {rope and rope['rope_type']}, {dtype}")


LLAMA_LAYER = ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
               "self_attn.v_proj.weight", "self_attn.o_proj.weight",
               "post_attention_layernorm.weight", "mlp.gate_proj.weight",
               "mlp.up_proj.weight", "mlp.down_proj.weight"]


def cmd_llama_layout(hf_dir, ckpt_dir):
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    m = json.load(open(os.path.join(ckpt_dir, "state.json")))["config"]["model"]
    oh, od = read_st(os.path.join(ckpt_dir, "model.safetensors"))
    tied = "lm_head.weight" not in oh  # the checkpoint's own head
    if m.get("tie_embeddings", tied) != tied:
        fail(f"state.json tie_embeddings {m['tie_embeddings']} but lm_head.weight "
             f"{'absent' if tied else 'present'}")
    expect = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_act": "silu", "hidden_size": m["width"],
              "intermediate_size": m["mlp_width"], "num_hidden_layers": m["layers"],
              "num_attention_heads": m["heads"],
              "num_key_value_heads": m.get("kv_heads", m["heads"]),
              "max_position_embeddings": m["context"], "vocab_size": m["vocab_size"],
              "tie_word_embeddings": tied, "torch_dtype": "float32",
              "attention_bias": False, "mlp_bias": False}
    for k, v in expect.items():
        if cfg.get(k) != v:
            fail(f"config.json {k}: {cfg.get(k)!r}, expected {v!r}")
    if abs(cfg["rms_norm_eps"] - m["layernorm_eps"]) > 1e-12 or \
            abs(cfg["rope_theta"] - (m.get("rope_theta") or 10000)) > 1e-9:
        fail("config.json rms_norm_eps / rope_theta")
    rs = m.get("rope_scaling")
    if (rs is None) != (cfg["rope_scaling"] is None) or \
            (rs and (cfg["rope_scaling"]["rope_type"] != rs["type"] or
                     cfg["rope_scaling"]["factor"] != rs["factor"])):
        fail(f"rope_scaling {cfg['rope_scaling']} vs orch {rs}")
    if not os.path.exists(os.path.join(hf_dir, "generation_config.json")):
        fail("no generation_config.json")
    header, data = read_st(os.path.join(hf_dir, "model.safetensors"))
    if header.get("__metadata__") != {"format": "pt"}:
        fail(f"__metadata__ {header.get('__metadata__')}")
    want = ["model.embed_tokens.weight"] + [f"model.layers.{i}.{s}" for i in range(m["layers"])
                                            for s in LLAMA_LAYER] + ["model.norm.weight"]
    if not tied:
        want.append("lm_head.weight")
    names = [k for k in header if k != "__metadata__"]
    if sorted(names) != sorted(want):
        fail(f"names differ: extra {sorted(set(names) - set(want))[:4]}, "
             f"missing {sorted(set(want) - set(names))[:4]}")
    for k in names:
        if header[k]["dtype"] != "F32" or header[k]["shape"] != oh[k]["shape"] or \
                tensor_bytes(header, data, k) != tensor_bytes(oh, od, k):
            fail(f"{k}: differs from the checkpoint's")
    print(f"llama layout ok: {len(names)} tensors")


def load_llama(hf_dir):
    """The model as transformers' LlamaForCausalLM reads config.json and
    model.safetensors: (cfg for torch_reference.llama_forward, params)."""
    import torch
    c = json.load(open(os.path.join(hf_dir, "config.json")))
    if c.get("architectures") != ["LlamaForCausalLM"] or c.get("hidden_act", "silu") != "silu":
        fail(f"not a LlamaForCausalLM config: {c.get('architectures')}")
    rs = c.get("rope_scaling")
    if rs is not None:
        rs = dict(rs)
        rs["rope_type"] = rs.get("rope_type", rs.get("type"))
    cfg = {"width": c["hidden_size"], "heads": c["num_attention_heads"],
           "kv_heads": c.get("num_key_value_heads", c["num_attention_heads"]),
           "layers": c["num_hidden_layers"], "layernorm_eps": c.get("rms_norm_eps", 1e-6),
           "rope_theta": c.get("rope_theta", 10000.0), "rope": rs,
           "untied": not c.get("tie_word_embeddings", False)}
    if c.get("head_dim", cfg["width"] // cfg["heads"]) != cfg["width"] // cfg["heads"]:
        fail("head_dim")
    header, data = read_st(os.path.join(hf_dir, "model.safetensors"))
    P = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        if v["dtype"] != "F32":
            fail(f"{k}: dtype {v['dtype']} (llama-logits reads F32 exports)")
        P[k] = torch.tensor(floats(header, data, k), dtype=torch.float64).view(v["shape"])
    return cfg, P


def cmd_llama_logits(hf_dir, fix, tol="1e-5"):
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
    import torch_reference
    torch.set_grad_enabled(False)
    cfg, P = load_llama(hf_dir)
    header, data, meta, _ = fixture(fix)
    V = int(meta["vocab_size"])
    tok = array("i")
    tok.frombytes(tensor_bytes(header, data, "tokens"))
    tokens = torch.tensor(list(tok)).view(header["tokens"]["shape"]).long()
    got = torch_reference.llama_forward(cfg, P, tokens)[..., :V]
    want = torch.tensor(floats(header, data, "logits"), dtype=torch.float64).view(got.shape)
    d = float((got - want).abs().max())
    if not d <= float(tol):
        fail(f"llama logits differ from the fixture's by {d:.3e} (tolerance {tol})")
    print(f"llama-logits ok: HF-rules forward equals the fixture within {d:.2e} "
          f"(tolerance {tol})")


def cmd_llama_rows(path, fix, tol="1e-4"):
    header, data, meta, _ = fixture(fix)
    V = int(meta["vocab_size"])
    want = floats(header, data, "logits")
    got = array("f")
    got.frombytes(open(path, "rb").read())
    rows = len(want) // V
    if len(got) % rows:
        fail(f"{path}: {len(got)} floats is not {rows} rows")
    Vp = len(got) // rows
    d = max(abs(got[r * Vp + j] - want[r * V + j]) for r in range(rows) for j in range(V))
    if not d <= float(tol):
        fail(f"orch logits differ from the fixture's by {d:.3e} (tolerance {tol})")
    print(f"llama-rows ok: {rows} rows within {d:.2e} (tolerance {tol})")


def cmd_fixture_json(fix, out):
    header, data, meta, _ = fixture(fix)
    B, T = header["tokens"]["shape"]
    V = int(meta["vocab_size"])
    tok = array("i")
    tok.frombytes(tensor_bytes(header, data, "tokens"))
    lg = floats(header, data, "logits")
    json.dump({"tokens": [list(tok[b * T:(b + 1) * T]) for b in range(B)],
               "logits": [[list(lg[(b * T + t) * V:(b * T + t + 1) * V]) for t in range(T)]
                          for b in range(B)]}, open(out, "w"))


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "layout":
        cmd_layout(*args)
    elif cmd == "same":
        cmd_same(*args)
    elif cmd == "shard":
        cmd_shard(*args)
    elif cmd == "mkllama":
        cmd_mkllama(*args)
    elif cmd == "llama-layout":
        cmd_llama_layout(*args)
    elif cmd == "llama-logits":
        cmd_llama_logits(*args)
    elif cmd == "fixture-json":
        cmd_fixture_json(*args)
    elif cmd == "llama-rows":
        cmd_llama_rows(*args)
    elif cmd == "logits":
        cmd_logits(args[0], int(args[1]), [int(a) for a in args[2:]])
    else:
        fail(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
